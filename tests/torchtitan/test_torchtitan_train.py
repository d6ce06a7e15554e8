"""torchtitan as a client: its llama3 debug model trained on `neuron` on 2 ranks through its own entry point
(`torchrun -m torchtitan.train --job.config_file ...`), FSDP and TP, eager and compiled with the "neuron" backend,
the losses checked against the same configuration on the CPU with Gloo; its deepseek_v3 MoE debug model with expert
parallelism (all-to-all) against expert parallelism 1, and context parallelism against one CPU rank. Every run loads
one seed checkpoint (torchtitan's `--checkpoint.create_seed_checkpoint`), so the runs start from the same weights
whatever random initialisation each device and parallelism makes.

Needs torchtitan 0.2.2 and its dependencies (`requirements-torchtitan.txt`, `nox -s torchtitan`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torchtitan")

from titan_support import launch, make_assets, train

pytestmark = [pytest.mark.optional, pytest.mark.multiprocess, pytest.mark.slow]

FSDP = ["--parallelism.data_parallel_shard_degree", "2"]
TP = ["--parallelism.data_parallel_shard_degree", "1", "--parallelism.tensor_parallel_degree", "2"]
COMPILED = ["--compile.enable", "--compile.backend", "neuron"]
MOE = ["--model.name", "deepseek_v3", "--model.flavor", "debugmodel", *FSDP]
CP = ["--parallelism.data_parallel_shard_degree", "1", "--parallelism.context_parallel_degree", "2"]
ONE_RANK = ["--parallelism.data_parallel_shard_degree", "1"]
# torchtitan 0.2.2's MoE reorders tokens with a Triton kernel (generate_permute_indices): Triton's interpreter runs it
TRITON_INTERPRETER = {"TRITON_INTERPRET": "1"}


class TitanRuns:
    """What the runs share: the assets, a seed checkpoint per model, the CPU losses per configuration."""

    def __init__(self, folder):
        self.folder = folder
        self.cache = folder / "cache"
        self.tokenizer, self.data = make_assets(folder / "assets")
        self._seeds: dict[tuple[str, ...], Path] = {}
        self._cpu: dict[tuple[str, ...], list[float]] = {}
        self._runs = 0

    def _seed(self, model: tuple[str, ...]) -> Path:
        """torchtitan's seed checkpoint of `model` (its `--model.*` arguments): made once, by one rank, which
        initialises the weights on the CPU."""
        if model not in self._seeds:
            seed = self.folder / f"seed{len(self._seeds)}"
            output = launch([*self._common(seed), *model, "--checkpoint.create_seed_checkpoint", *ONE_RANK],
                            self.folder / f"seed-run{len(self._seeds)}", self.cache, ranks=1)
            assert "Created seed checkpoint" in output
            self._seeds[model] = seed
        return self._seeds[model]

    def _common(self, seed: Path) -> list[str]:
        return ["--model.hf_assets_path", str(self.tokenizer), "--training.dataset_path", str(self.data),
                "--debug.seed", "0", "--checkpoint.enable", "--checkpoint.folder", str(seed)]

    def run(self, args: list[str], *, cpu: bool = False, ranks: int = 2, env: dict[str, str] | None = None
            ) -> list[float]:
        """The losses of a run from the seed checkpoint (`load_only`: nothing saved)."""
        self._runs += 1
        model = tuple(word for i, flag in enumerate(args) if flag.startswith("--model.") for word in args[i:i + 2])
        return train([*self._common(self._seed(model)), "--checkpoint.load_only", *args],
                     self.folder / f"run{self._runs}", self.cache, cpu=cpu, ranks=ranks, env=env)

    def cpu(self, args: list[str], ranks: int = 2) -> list[float]:
        """The CPU (Gloo) losses of a configuration, run once."""
        key = (*args, str(ranks))
        if key not in self._cpu:
            self._cpu[key] = self.run(args, cpu=True, ranks=ranks)
        return self._cpu[key]


@pytest.fixture(scope="module")
def titan(tmp_path_factory) -> TitanRuns:
    return TitanRuns(tmp_path_factory.mktemp("torchtitan"))


def _check(neuron: list[float], cpu: list[float]) -> None:
    assert len(neuron) == len(cpu) == 3
    assert neuron == pytest.approx(cpu, rel=1e-4, abs=1e-4)  # the log's 5 decimals, float32 on both
    assert neuron[-1] < neuron[0]  # it trains


@pytest.mark.parametrize(("parallelism", "ranks"), [(FSDP, 2), (TP, 2), (ONE_RANK, 1)], ids=["fsdp", "tp", "one-rank"])
def test_cpu_reference(titan, parallelism, ranks):
    """The reference: the same configuration trains on the CPU with Gloo (`titan_cpu_train.py`)."""
    losses = titan.cpu(parallelism, ranks)
    assert len(losses) == 3 and losses[-1] < losses[0]


@pytest.mark.parametrize(("parallelism", "compiled"), [
    pytest.param(FSDP, False, id="fsdp-eager"),
    pytest.param(FSDP, True, id="fsdp-compiled"),
    pytest.param(TP, False, id="tp-eager"),
    pytest.param(TP, True, id="tp-compiled"),
])
def test_llama3_debugmodel(titan, parallelism, compiled):
    """torchtitan's llama3 debug model, 3 steps on 2 ranks of `neuron`, against the CPU."""
    cpu = titan.cpu(parallelism)
    _check(titan.run([*parallelism, *(COMPILED if compiled else [])]), cpu)


def test_moe_expert_parallel(titan):
    """torchtitan's deepseek_v3 debug model (MoE: 8 routed experts, top 3) with expert parallelism 2, its tokens
    sent to their experts' rank by all-to-all, gives the losses of expert parallelism 1 (the CPU has no reference:
    its `histc` of the router's integer expert ids is not implemented)."""
    whole = titan.run(MOE, env=TRITON_INTERPRETER)
    _check(titan.run([*MOE, "--parallelism.expert_parallel_degree", "2"], env=TRITON_INTERPRETER), whole)


def test_llama3_context_parallel(titan):
    """Context parallelism 2 (each rank holds half of every sequence, ring attention) gives one CPU rank's losses."""
    _check(titan.run(CP), titan.cpu(ONE_RANK, ranks=1))
