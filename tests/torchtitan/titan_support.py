"""Helpers of the torchtitan client tests (a module of its own name: all test folders can run in one pytest process).

torchtitan trains from files: a Hugging Face tokenizer (`--model.hf_assets_path`) and a data set `load_dataset` reads
(`--training.dataset_path` for its `c4_test`). Like torchtitan's own `tests/assets` (a small BPE tokenizer, a few
thousand lines of C4 text in `c4_test/data.json`), both are made here, tiny and deterministic, so nothing is
downloaded. Runs go through torchtitan's real entry point, `torchrun ... -m torchtitan.train --job.config_file ...`,
on `neuron`; the reference runs are the same configuration on the CPU with Gloo (`titan_cpu_train.py`).
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "titan_debug.toml"
CPU_LAUNCHER = HERE / "titan_cpu_train.py"
RUN_TIMEOUT = 420  # seconds a 2-rank run may take: start-up on a loaded 2-core machine is most of it
_WORDS = ("the a of to and in is was for on that with as by at from his her it an were are which this be or has had "
          "neuron core tensor engine vector scalar memory state buffer step loss").split()
_LOSS = re.compile(r"step:\s*(\d+)\s+loss:\s*([-0-9.]+)")


def make_assets(folder: Path) -> tuple[Path, Path]:
    """A byte-level BPE tokenizer with Llama 3's begin/end-of-text tokens, and a `c4_test`-shaped data set (JSON lines
    of {"text": ...}); returns (tokenizer folder, data set folder)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(0)
    texts = [" ".join(rng.choice(_WORDS) + (str(rng.randrange(100)) if rng.random() < 0.2 else "")
                      for _ in range(rng.randrange(40, 120))) + "." for _ in range(200)]
    data = folder / "c4_test"
    data.mkdir(parents=True)
    (data / "data.json").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))

    bos, eos = "<|begin_of_text|>", "<|end_of_text|>"
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=512, special_tokens=[bos, eos], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    assets = folder / "tokenizer"
    assets.mkdir()
    tokenizer.save(str(assets / "tokenizer.json"))
    (assets / "tokenizer_config.json").write_text(json.dumps({"bos_token": bos, "eos_token": eos}))
    return assets, data


def run_env(cache: Path, *, cpu: bool = False) -> dict[str, str]:
    """The environment of a run: offline Hugging Face libraries with their cache in `cache`; for the CPU reference,
    TorchNeuron's device not loaded (torch's `TORCH_DEVICE_BACKEND_AUTOLOAD=0`), so nothing of it takes part."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(cache / "datasets"),
           "HF_HOME": str(cache / "hf"), "LOG_RANK": "0"}
    if cpu:
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    return env


def launch(args: list[str], dump: Path, cache: Path, *, cpu: bool = False, ranks: int = 2,
           env: dict[str, str] | None = None, entry: list[str] | None = None) -> str:
    """Run torchtitan's trainer on `ranks` processes with the debug configuration, `args` and extra `env`; its output.
    `entry` runs the trainer module through a script of its own (`[script, "-m", "torchtitan.train"]`). A failed
    run fails with its output's tail."""
    entry = entry or ([str(CPU_LAUNCHER)] if cpu else ["-m", "torchtitan.train"])
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", *entry,
               *trainer_args(dump, args)]
    result = subprocess.run(command, env={**run_env(cache, cpu=cpu), **(env or {})}, cwd=dump.parent,
                            capture_output=True, text=True, timeout=RUN_TIMEOUT)
    output = result.stdout + result.stderr
    if result.returncode != 0:
        raise AssertionError(f"torchtitan run failed ({' '.join(args)}):\n{_tail(output)}")
    return output


def trainer_args(dump: Path, args: list[str]) -> list[str]:
    """The trainer's arguments: the debug configuration, the dump folder, then `args`."""
    return ["--job.config_file", str(CONFIG), "--job.dump_folder", str(dump), *args]


def train(args: list[str], dump: Path, cache: Path, **options) -> list[float]:
    """`launch` a training run; its losses by step (rank 0's log)."""
    output = launch(args, dump, cache, **options)
    losses = {int(step): float(loss) for step, loss in _LOSS.findall(output)}
    assert losses, f"no loss logged:\n{_tail(output)}"
    return [losses[step] for step in sorted(losses)]


def _tail(output: str, lines: int = 60) -> str:
    """The end of a run's output, where its error is."""
    return "\n".join(output.splitlines()[-lines:])
