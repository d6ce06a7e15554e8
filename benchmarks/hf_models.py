"""Architecture sweep: every transformers causal-LM architecture, tiny and random, on `neuron` vs CPU.

For each model type in transformers' causal-LM auto mapping: build the model from a shrunken default config
(random weights, no download), run forward + backward on CPU and on `neuron` from the same weights, compare
logits, loss and every parameter gradient, then compare greedy `generate()` tokens. Architectures whose CPU run
fails are listed apart and not counted. Prints a per-architecture status table and the coverage figure.

    python benchmarks/hf_models.py [--compile] [--only llama,gpt2] [--limit N] [--json FILE [--skip-done]]
                                   [--timeout SECONDS] [--shuffle SEED]

`--compile` runs the `neuron` side under `torch.compile(backend="neuron")` (forward + backward; no generate).
`--json FILE` appends each result to FILE as a JSON line as soon as it is known; with `--skip-done`, architectures
already in FILE are not run again (a long sweep resumes after an interruption) and count in the summary.
`--timeout` fails an architecture that takes longer than SECONDS. `--shuffle SEED` runs the architectures in a
seeded random order, so that a sweep stopped early has covered a uniform sample of them.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import random
import signal
import sys
import time
import traceback
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "num_decoder_layers")
# Tiny values for the size attributes configs use (only attributes the default config has are set, and only
# downwards).
TINY_SIZES: dict[str, int] = {
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "model_dim"), 64),
    **dict.fromkeys(LAYER_COUNTS, 2),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "n_heads", "decoder_attention_heads"), 4),
    **dict.fromkeys(("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num"), 2),
    **dict.fromkeys(
        ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size", "hidden_dim", "moe_intermediate_size",
         "shared_expert_intermediate_size", "decoder_ffn_dim", "d_ff", "expert_intermediate_size"),
        128,
    ),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk", "top_k", "num_experts_per_token", "moe_k"), 2),
    "head_dim": 16,
    "vocab_size": 512,
    **dict.fromkeys(("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"), 128),
    **dict.fromkeys(("kv_lora_rank", "q_lora_rank"), 32),
    **dict.fromkeys(("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"), 16),
    **dict.fromkeys(("sliding_window", "attention_window_size"), 64),
    "rotary_dim": 8,
    "n_groups": 2,
}
# Token-id attributes that must stay inside the tiny vocabulary.
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")
# Per-layer lists derived from the layer count in `__init__`: dropped so the tiny config recomputes them.
DERIVED_LISTS = (
    "layer_types", "block_types", "layers_block_type", "hybrid_override_pattern", "per_layer_config", "attention_layers",
    "moe_layers", "no_rope_layers",
)
SEQ, BATCH, NEW_TOKENS = 12, 2, 4
DEVICE = "neuron"


def tiny_kwargs(config: PretrainedConfig) -> dict:
    """Constructor arguments that shrink `config` (recursively for sub-configs such as `text_config`)."""
    values = config.to_dict()
    kwargs = {
        name: size
        for name, size in TINY_SIZES.items()
        if isinstance(values.get(name), int) and not isinstance(values[name], bool) and values[name] > size
    }
    heads = ("num_attention_heads", "num_key_value_heads")
    if all(name in kwargs for name in heads) and values[heads[0]] == values[heads[1]]:
        kwargs[heads[1]] = kwargs[heads[0]]  # multi-head models stay multi-head
    layers = next((kwargs[name] for name in LAYER_COUNTS if name in kwargs), None)
    pattern = values.get("attention_types")  # GPT-Neo: [[layer kinds, repeats]], expanded to one kind per layer
    if layers and isinstance(pattern, list) and len(pattern) == 1:
        kinds = pattern[0][0]
        kwargs["attention_types"] = [[kinds, max(1, layers // len(kinds))]]
    if all(name in kwargs for name in ("hidden_size", "num_heads", "head_dim")) and "expand" in values:
        # Mamba-2: the SSM heads span the expanded inner size exactly
        kwargs["head_dim"] = kwargs["hidden_size"] * values["expand"] // kwargs["num_heads"]
    vocab = kwargs.get("vocab_size", values.get("vocab_size"))
    for name in TOKEN_IDS:
        if isinstance(vocab, int) and isinstance(values.get(name), int) and values[name] >= vocab:
            kwargs[name] = vocab - 1 - TOKEN_IDS.index(name)
    for name in getattr(config, "sub_configs", {}):
        sub = getattr(config, name, None)
        if isinstance(sub, PretrainedConfig):
            kwargs[name] = {**_without_derived(sub.to_dict()), **tiny_kwargs(sub)}
    return kwargs


def _without_derived(values: dict) -> dict:
    return {key: value for key, value in values.items() if key not in DERIVED_LISTS}


def tiny_config(model_type: str) -> PretrainedConfig:
    """The default config of `model_type`, shrunken; eager attention off (the default SDPA path is used)."""
    default = AutoConfig.for_model(model_type)
    return type(default)(**tiny_kwargs(default))


@dataclasses.dataclass
class Result:
    model_type: str
    status: str  # "pass", "fail" (neuron differs or errors), "cpu-fail" (forward/backward fails on CPU: not counted)
    reason: str = ""
    seconds: float = 0.0


def _inputs(config: PretrainedConfig) -> torch.Tensor:
    text = config.get_text_config()
    vocab = getattr(text, "vocab_size", None) or 512
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(2, vocab, (BATCH, SEQ), generator=generator)
    # Keep special tokens (pad/eos, image placeholders that would require pixel inputs) out of the prompt.
    names = (*TOKEN_IDS, "image_token_id", "image_token_index", "video_token_id", "audio_token_id")
    special = [getattr(source, name, None) for source in (config, text) for name in names]
    flat = [token for value in special for token in (value if isinstance(value, list) else [value])]
    ids[torch.isin(ids, torch.tensor([t for t in flat if isinstance(t, int)] or [-1]))] = 2
    return ids


def _run(model: torch.nn.Module, ids: torch.Tensor, compiled: bool) -> tuple[torch.Tensor, torch.Tensor, dict]:
    forward = torch.compile(model, backend="neuron", dynamic=False) if compiled else model
    out = forward(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    return out.logits, out.loss, grads


def _compare(cpu: torch.Tensor, dev: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(dev.cpu(), cpu, rtol=1e-3, atol=1e-4, msg=lambda m: f"{what}: {m}")


def check(model_type: str, compiled: bool = False, generate: bool = True) -> Result:
    """Forward + backward (+ greedy generate) of one architecture on `neuron` against CPU."""
    start = time.perf_counter()
    try:
        config = tiny_config(model_type)
        torch.manual_seed(0)
        cpu_model = AutoModelForCausalLM.from_config(config).eval()
        dev_model = copy.deepcopy(cpu_model)  # before any CPU run can leave state behind
        ids = _inputs(config)
        cpu_logits, cpu_loss, cpu_grads = _run(cpu_model, ids, compiled=False)
    except Exception as error:
        return Result(model_type, "cpu-fail", _reason(error), time.perf_counter() - start)
    note = ""
    if generate and not compiled:
        try:
            cpu_tokens = cpu_model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
        except Exception as error:  # forward + backward still count; generate is not compared
            generate, note = False, f"generate not compared (fails on CPU: {_reason(error)})"
    try:
        logits, loss, grads = _run(dev_model.to(DEVICE), ids.to(DEVICE), compiled)
        _compare(cpu_logits, logits, "logits")
        _compare(cpu_loss, loss, "loss")
        if grads.keys() != cpu_grads.keys():
            raise AssertionError(f"gradients for different parameters: {sorted(grads.keys() ^ cpu_grads.keys())}")
        for name, grad in grads.items():
            _compare(cpu_grads[name], grad, f"grad {name}")
        if generate and not compiled:
            tokens = dev_model.generate(ids.to(DEVICE), max_new_tokens=NEW_TOKENS, do_sample=False)
            if not torch.equal(tokens.cpu(), cpu_tokens):
                raise AssertionError(f"generate: {tokens.cpu().tolist()} != {cpu_tokens.tolist()}")
    except Exception as error:
        return Result(model_type, "fail", _reason(error), time.perf_counter() - start)
    return Result(model_type, "pass", note, time.perf_counter() - start)


def _reason(error: BaseException) -> str:
    frame = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
    where = f" [{os.path.basename(frame.filename)}:{frame.lineno}]" if frame else ""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:300]}{where}"


class _Timeout(BaseException):
    """Not an `Exception`: `check` must not report it as a CPU or `neuron` error."""


def _raise_timeout(signum: int, frame: object) -> None:
    raise _Timeout("timed out")


def _check_with_timeout(model_type: str, compiled: bool, seconds: int) -> Result:
    """`check` that is interrupted (and reported as a failure) after `seconds` (0: no limit)."""
    if not seconds:
        return check(model_type, compiled=compiled)
    previous = signal.signal(signal.SIGALRM, _raise_timeout)
    signal.alarm(seconds)
    try:
        return check(model_type, compiled=compiled)
    except _Timeout:
        return Result(model_type, "fail", f"timed out after {seconds}s", float(seconds))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _load(path: str) -> dict[str, Result]:
    """Results already written to the JSON-lines file `path` (none if it does not exist)."""
    if not os.path.exists(path):
        return {}
    with open(path) as lines:
        results = [Result(**json.loads(line)) for line in lines if line.strip()]
    return {r.model_type: r for r in results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile", action="store_true", help="neuron side under torch.compile(backend='neuron')")
    parser.add_argument("--only", default="", help="comma-separated model types")
    parser.add_argument("--limit", type=int, default=0, help="first N model types only")
    parser.add_argument("--json", default="", help="append each result to this file as a JSON line")
    parser.add_argument("--skip-done", action="store_true", help="skip the model types already in the --json file")
    parser.add_argument("--timeout", type=int, default=0, help="fail an architecture after this many seconds")
    parser.add_argument("--shuffle", type=int, default=None, help="run in a random order from this seed")
    args = parser.parse_args(argv)
    if args.skip_done and not args.json:
        parser.error("--skip-done needs --json")
    warnings.filterwarnings("ignore")
    model_types = sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    if args.only:
        model_types = [name for name in model_types if name in args.only.split(",")]
    if args.limit:
        model_types = model_types[: args.limit]
    if args.shuffle is not None:
        random.Random(args.shuffle).shuffle(model_types)
    done = _load(args.json) if args.skip_done else {}
    results = [done[name] for name in model_types if name in done]
    for model_type in model_types:
        if model_type in done:
            continue
        result = _check_with_timeout(model_type, args.compile, args.timeout)
        results.append(result)
        print(f"| {result.model_type} | {result.status} | {result.seconds:.1f}s | {result.reason} |", flush=True)
        if args.json:
            with open(args.json, "a") as out:
                out.write(json.dumps(dataclasses.asdict(result)) + "\n")
        torch._dynamo.reset()
    results.sort(key=lambda r: r.model_type)
    counted = [r for r in results if r.status != "cpu-fail"]
    passed = sum(r.status == "pass" for r in counted)
    mode = "torch.compile(backend='neuron')" if args.compile else "eager"
    print(f"\ncoverage ({mode}): {passed}/{len(counted)} CPU-runnable architectures pass"
          f" = {100 * passed / max(len(counted), 1):.1f} %; {len(results) - len(counted)} not runnable on CPU")
    for status in ("fail", "cpu-fail"):
        for r in results:
            if r.status == status:
                print(f"  {status}: {r.model_type}: {r.reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
