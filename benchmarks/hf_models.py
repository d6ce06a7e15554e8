"""Architecture sweep: every transformers model type with each task head it has, tiny and random, on `neuron` vs CPU.

The pairs are (model type, task) from transformers' auto mappings (`MODEL_MAPPING_NAMES` is the task "base",
`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` is "causal-lm", ...). For each pair: build the head from a shrunken default
config (random weights, no download), generate inputs from the config and the head's `forward` signature (token ids
with padding, pixel values, audio, labels), run forward + backward on the CPU and on `neuron` from the same weights,
compare every output tensor, the loss (or, for heads without one, the sum of the output means) and every parameter
gradient, then greedy `generate()` (with cache) where the head generates. Pairs whose CPU run fails are listed apart
and not counted. The pairs run in long-lived worker subprocesses (`--jobs`, default 1) with a per-pair timeout; a
pair that crashes or hangs its worker fails alone (see `_sweep`).

    python benchmarks/hf_models.py [--compile] [--only llama,gpt2] [--tasks base,causal-lm] [--limit N]
                                   [--json FILE [--skip-done]] [--timeout SECONDS] [--jobs N] [--shuffle SEED]
                                   [--budget SECONDS] [--per-task N]

`--compile` runs the `neuron` side under `torch.compile(backend="neuron")` (forward + backward; no generate).
`--json FILE` appends each result to FILE as a JSON line as soon as it is known; with `--skip-done`, pairs already
in FILE are not run again (a long sweep resumes after an interruption) and count in the summary. `--timeout` fails
a pair that takes longer than SECONDS (its worker is killed and replaced). `--shuffle SEED` runs the model types in a seeded random
order, so that a sweep stopped early (`--budget`: start no pair after SECONDS) has covered a uniform sample.
`--per-task N` keeps at most N model types per task (after shuffling): a sample that covers every task head;
`--runnable-in FILE` keeps only the pairs that ran on the CPU in the report FILE (a compiled sample of an eager run).
`--table FILE...` prints the summary table and the failures of JSON reports without running anything.
"""

from __future__ import annotations

import argparse
import copy
import functools
import inspect
import os
import random
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import _sweep
import torch
import transformers
from _sweep import Result
from transformers import AutoConfig, PretrainedConfig
from transformers.models.auto import modeling_auto

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
    # encoder-decoders, vision and speech
    **dict.fromkeys(("encoder_layers", "decoder_layers", "num_encoder_layers"), 2),
    **dict.fromkeys(("encoder_attention_heads", "decoder_num_attention_heads"), 4),
    **dict.fromkeys(("encoder_ffn_dim", "decoder_intermediate_size", "decoder_hidden_size"), 128),
    "image_size": 64,
    "max_source_positions": 32,
    "max_target_positions": 64,
}
# Token-id attributes that must stay inside the tiny vocabulary.
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")
# Scales of the noise a forward draws (VITS) are zeroed: the model draws some of it from the CPU generator and some
# from its device's, so on `neuron` (as on CUDA) the draws interleave differently than on the CPU alone.
NOISE_SCALES = ("noise_scale", "noise_scale_duration")
# Per-layer lists derived from the layer count in `__init__`: dropped so the tiny config recomputes them.
DERIVED_LISTS = (
    "layer_types", "block_types", "layers_block_type", "hybrid_override_pattern", "per_layer_config", "attention_layers",
    "moe_layers", "no_rope_layers",
)
SEQ, BATCH, NEW_TOKENS = 12, 2, 4
AUDIO_SAMPLES, FEATURE_FRAMES, PADDED = 8000, 64, 3
DEVICE = _sweep.DEVICE
# Tasks whose heads generate text from a prompt: prompts are left-padded, and `generate` is compared.
GENERATING = ("causal-lm", "seq-to-seq-causal-lm", "speech-seq-2-seq", "image-text-to-text", "multimodal-lm")
# Tasks whose `labels` are one class per example, one class per token, or the input tokens themselves.
CLASS_LABELS = ("sequence-classification", "image-classification", "audio-classification", "video-classification",
                "multiple-choice", "next-sentence-prediction", "time-series-classification")
TOKEN_LABELS = ("token-classification", "audio-frame-classification")
LM_LABELS = ("causal-lm", "masked-lm", "seq-to-seq-causal-lm", "speech-seq-2-seq")


def tiny_kwargs(config: PretrainedConfig, cut_lists: bool = False) -> dict:
    """Constructor arguments that shrink `config` (recursively for sub-configs such as `text_config`); with
    `cut_lists`, lists with one entry per layer are cut to the tiny layer count too."""
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
    kwargs.update({name: 0.0 for name in NOISE_SCALES if isinstance(values.get(name), float)})
    for name in getattr(config, "sub_configs", {}):
        sub = getattr(config, name, None)
        if isinstance(sub, PretrainedConfig):
            kwargs[name] = {**_without_derived(sub.to_dict()), **tiny_kwargs(sub, cut_lists)}
    if cut_lists:
        kwargs.update(_per_layer_lists(values, kwargs))
    return kwargs


def _without_derived(values: dict) -> dict:
    return {key: value for key, value in values.items() if key not in DERIVED_LISTS}


def tiny_config(model_type: str) -> PretrainedConfig:
    """The default config of `model_type`, shrunken; eager attention off (the default SDPA path is used)."""
    default = AutoConfig.for_model(model_type)
    kwargs = tiny_kwargs(default)
    try:
        return type(default)(**kwargs)
    except Exception:  # a validator wants the per-layer lists (fixed in the default) to follow the layer count
        return type(default)(**tiny_kwargs(default, cut_lists=True))


def _per_layer_lists(values: dict, kwargs: dict) -> dict:
    """The default's lists with one entry per layer, cut to the tiny layer count."""
    name = next((name for name in LAYER_COUNTS if name in kwargs), None)
    if name is None:
        return {}
    return {key: value[: kwargs[name]] for key, value in values.items()
            if isinstance(value, list) and len(value) == values[name] and key not in kwargs}



def task_mappings() -> dict[str, dict[str, str]]:
    """Task name -> {model type: head class name}, from every `MODEL_*_MAPPING_NAMES` of transformers' auto module
    (`MODEL_MAPPING_NAMES` is "base"; `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` is "causal-lm")."""
    tasks = {}
    for name in dir(modeling_auto):
        if name.startswith("MODEL") and name.endswith("_MAPPING_NAMES"):
            task = name.removeprefix("MODEL").removeprefix("_FOR").removesuffix("_MAPPING_NAMES").strip("_")
            mapping = getattr(modeling_auto, name)
            tasks[task.lower().replace("_", "-") or "base"] = {
                model_type: classes if isinstance(classes, str) else classes[0] for model_type, classes in mapping.items()
            }
    return tasks


def head_class(model_type: str, task: str) -> type:
    name = task_mappings()[task][model_type]
    cls = getattr(transformers, name, None)
    if cls is None:
        raise RuntimeError(f"{name} is named in the auto mapping but not exported by transformers")
    return cls


def _token_ids(config: PretrainedConfig, length: int = SEQ) -> torch.Tensor:
    text = config.get_text_config()
    vocab = getattr(text, "vocab_size", None) or 512
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(2, vocab, (BATCH, length), generator=generator)
    # Keep special tokens (pad/eos, image placeholders that would require pixel inputs) out of the prompt.
    names = (*TOKEN_IDS, "image_token_id", "image_token_index", "video_token_id", "audio_token_id")
    special = [getattr(source, name, None) for source in (config, text) for name in names]
    flat = [token for value in special for token in (value if isinstance(value, list) else [value])]
    ids[torch.isin(ids, torch.tensor([t for t in flat if isinstance(t, int)] or [-1]))] = 2
    return ids


def _inputs(config: PretrainedConfig) -> torch.Tensor:
    """The causal-LM prompt: token ids without padding or special tokens."""
    return _token_ids(config)


def _size(value: object, default: int) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    if isinstance(value, (list, tuple)) and len(value) >= 2:
        return int(value[-2]), int(value[-1])
    return default, default


def _padding_mask(left: bool, length: int = SEQ) -> torch.Tensor:
    """All ones but the last example's PADDED first (left padding) or last positions."""
    mask = torch.ones(BATCH, length, dtype=torch.long)
    if left:
        mask[-1, :PADDED] = 0
    else:
        mask[-1, -PADDED:] = 0
    return mask


def make_inputs(model: torch.nn.Module, config: PretrainedConfig, task: str) -> dict[str, torch.Tensor]:
    """Inputs for `model.forward` generated from the config and the parameters the head takes: token ids with
    padding, pixel values, audio waveforms or features, and the labels of the task."""
    params = inspect.signature(model.forward).parameters
    text = config.get_text_config()
    vocab = getattr(text, "vocab_size", None)
    generator = torch.Generator().manual_seed(1)
    inputs: dict[str, torch.Tensor] = {}
    multimodal = any(hasattr(config, name) for name in ("image_token_id", "image_token_index"))
    if "input_ids" in params and isinstance(vocab, int):
        ids = _token_ids(config)
        if "attention_mask" in params:
            inputs["attention_mask"] = _padding_mask(left=task in GENERATING)
            pad = getattr(text, "pad_token_id", None)
            if isinstance(pad, int) and pad < vocab:
                ids = ids.masked_fill(inputs["attention_mask"] == 0, pad)
        inputs["input_ids"] = ids
        if task == "multiple-choice":  # (batch, choices, length)
            inputs = {name: value[:, None].expand(-1, 2, -1).contiguous() for name, value in inputs.items()}
    vision = getattr(config, "vision_config", None) or config
    if "pixel_values" in params and not (multimodal and "input_ids" in inputs):  # multimodal heads: text only
        height, width = _size(getattr(vision, "image_size", None), 64)
        channels = getattr(vision, "num_channels", 3)
        frames = getattr(vision, "num_frames", None) if task == "video-classification" else None
        shape = (BATCH, frames, channels, height, width) if frames else (BATCH, channels, height, width)
        inputs["pixel_values"] = torch.randn(shape, generator=generator)
    if "input_values" in params and "input_ids" not in inputs:
        inputs["input_values"] = torch.randn(BATCH, AUDIO_SAMPLES, generator=generator)
    if "input_features" in params:
        if hasattr(config, "num_mel_bins") and hasattr(config, "max_source_positions"):  # Whisper: (mel, 2 x positions)
            shape = (BATCH, config.num_mel_bins, 2 * config.max_source_positions)
        else:  # Speech2Text and conformers: (frames, features)
            features = next((getattr(config, n) for n in ("input_feat_per_channel", "feature_size", "num_mel_bins")
                             if isinstance(getattr(config, n, None), int)), 80)
            shape = (BATCH, FEATURE_FRAMES, features * getattr(config, "input_channels", 1))
        inputs["input_features"] = torch.randn(shape, generator=generator)
    if "noise" in params and "pixel_values" in inputs and isinstance(getattr(vision, "patch_size", None), int):
        # ViT-MAE's random masking, given rather than drawn: a compiled graph draws other numbers than eager does
        height, width = inputs["pixel_values"].shape[-2:]
        patches = (height // vision.patch_size) * (width // vision.patch_size)
        inputs["noise"] = torch.rand(BATCH, patches, generator=generator)
    _add_labels(inputs, params, config, task, vocab)
    if "decoder_input_ids" in params and "labels" not in inputs and isinstance(vocab, int):
        inputs["decoder_input_ids"] = _token_ids(config, length=SEQ // 2)
    if "use_cache" in params:
        inputs["use_cache"] = False
    return inputs


def _add_labels(inputs: dict, params: dict, config: PretrainedConfig, task: str, vocab: int | None) -> None:
    if task in QA_TASKS and "start_positions" in params:
        inputs["start_positions"] = torch.tensor([1, 3])
        inputs["end_positions"] = torch.tensor([4, 5])
    if "labels" not in params:
        return
    classes = 2 if task in ("multiple-choice", "next-sentence-prediction") else getattr(config, "num_labels", 2)
    if task in CLASS_LABELS:
        inputs["labels"] = torch.arange(BATCH) % classes
    elif task in TOKEN_LABELS and "input_ids" in inputs:
        inputs["labels"] = torch.arange(BATCH * SEQ).reshape(BATCH, SEQ) % classes
    elif task == "ctc" and isinstance(vocab, int):
        inputs["labels"] = torch.arange(1, 1 + BATCH * 4).reshape(BATCH, 4) % (vocab - 1) + 1
    elif task in LM_LABELS and isinstance(vocab, int):
        labels = inputs["input_ids"] if "input_ids" in inputs else _token_ids(config, length=SEQ // 2)
        if "attention_mask" in inputs and labels is inputs["input_ids"]:
            labels = labels.masked_fill(inputs["attention_mask"] == 0, -100)
        inputs["labels"] = labels


QA_TASKS = ("question-answering", "document-question-answering")


def _forward_backward(model: torch.nn.Module, inputs: dict, compiled: bool) -> tuple[object, dict]:
    forward = torch.compile(model, backend="neuron", dynamic=False) if compiled else model
    torch.manual_seed(0)  # heads that draw (masking in pre-training heads) draw the same on both sides
    out = forward(**inputs)
    _sweep.scalar(out).backward()
    return out, _sweep.gradients(model)


def _on(device: str, inputs: dict) -> dict:
    return {name: value.to(device) if isinstance(value, torch.Tensor) else value for name, value in inputs.items()}


def _generate(model: torch.nn.Module, inputs: dict) -> torch.Tensor:
    """Greedy generation from copies of the prompt tensors (BLIP's `generate` writes BOS into `input_ids`)."""
    prompt = {name: value.clone() for name, value in inputs.items()
              if name in ("input_ids", "attention_mask", "input_features", "pixel_values")}
    return model.generate(**prompt, max_new_tokens=NEW_TOKENS, do_sample=False, use_cache=True)


def check(model_type: str, task: str = "causal-lm", compiled: bool = False, generate: bool = True,
          config: PretrainedConfig | None = None) -> Result:
    """Forward + backward (+ greedy generate) of one (model type, task) head on `neuron` against CPU."""
    mode = "compile" if compiled else "eager"
    start = time.perf_counter()
    try:
        config = copy.deepcopy(config) if config is not None else tiny_config(model_type)
        if task == "sequence-classification" and getattr(config.get_text_config(), "pad_token_id", None) is None:
            config.get_text_config().pad_token_id = 0  # batched classification finds each example's last token
        if getattr(config, "is_encoder_decoder", False) and getattr(config, "decoder_start_token_id", None) is None:
            config.decoder_start_token_id = getattr(config, "pad_token_id", None) or 0  # labels shift right onto it
        torch.manual_seed(0)
        cpu_model = head_class(model_type, task)(config).eval()
        dev_model = copy.deepcopy(cpu_model)  # before any CPU run can leave state behind
        inputs = make_inputs(cpu_model, config, task)
        cpu_out, cpu_grads = _forward_backward(cpu_model, inputs, compiled=False)
    except Exception as error:
        return Result(model_type, "cpu-fail", _sweep.reason(error), time.perf_counter() - start, task, mode)
    note = ""
    generate = generate and not compiled and task in GENERATING and cpu_model.can_generate()
    if generate:
        try:
            cpu_tokens = _generate(cpu_model, inputs)
        except Exception as error:  # forward + backward still count; generate is not compared
            generate, note = False, f"generate not compared (fails on CPU: {_sweep.reason(error)})"
    _sweep.cpu_reference_done()
    try:
        dev_inputs = _on(DEVICE, inputs)
        out, grads = _forward_backward(dev_model.to(DEVICE), dev_inputs, compiled)
        _sweep.compare_outputs(cpu_out, out)
        _sweep.compare_gradients(cpu_grads, grads)
        if generate:
            _sweep.compare(cpu_tokens, _generate(dev_model, dev_inputs), "generate")
    except Exception as error:
        return Result(model_type, "fail", _sweep.reason(error), time.perf_counter() - start, task, mode)
    return Result(model_type, "pass", note, time.perf_counter() - start, task, mode)


@functools.cache
def _cached_tiny_config(model_type: str) -> PretrainedConfig:
    return tiny_config(model_type)


def check_pair(model_type: str, task: str, compiled: bool) -> Result:
    """A worker's check of one pair: the tiny config is built once per model type (`check` copies it)."""
    try:
        config = _cached_tiny_config(model_type)
    except Exception as error:
        return Result(model_type, "cpu-fail", f"tiny config: {_sweep.reason(error)}", 0.0, task,
                      "compile" if compiled else "eager")
    return check(model_type, task, compiled=compiled, config=config)


def plan(tasks: list[str], only: list[str], limit: int, shuffle: int | None, per_task: int,
         runnable: set[tuple[str, str]] | None = None) -> dict[str, list[str]]:
    """Model type -> its tasks to check (among `tasks`, and among the `runnable` pairs if given), in sweep order."""
    mappings = task_mappings()
    if runnable is not None:
        mappings = {task: {m: c for m, c in mapping.items() if (m, task) in runnable} for task, mapping in
                    mappings.items()}
    model_types = sorted({m for task in tasks for m in mappings[task]})
    if only:
        model_types = [m for m in model_types if m in only]
    if limit:
        model_types = model_types[:limit]
    if shuffle is not None:
        random.Random(shuffle).shuffle(model_types)
    chosen = {m: [t for t in tasks if m in mappings[t]] for m in model_types}
    if per_task:
        taken: dict[str, int] = dict.fromkeys(tasks, 0)
        for model_type, its_tasks in chosen.items():
            chosen[model_type] = [t for t in its_tasks if taken[t] < per_task]
            for task in chosen[model_type]:
                taken[task] += 1
    return {m: t for m, t in chosen.items() if t}


def report(results: list[Result]) -> str:
    existing = {task: len(mapping) for task, mapping in task_mappings().items()}
    return "\n\n".join((_sweep.summary(results, existing), _sweep.totals(results), _sweep.failures(results)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _sweep.add_arguments(parser)
    parser.add_argument("--only", default="", help="comma-separated model types")
    parser.add_argument("--tasks", default="", help="comma-separated tasks (default: all)")
    parser.add_argument("--limit", type=int, default=0, help="first N model types only")
    parser.add_argument("--per-task", type=int, default=0, help="at most N model types per task")
    parser.add_argument("--runnable-in", default="", help="only the pairs this JSON report ran on the CPU")
    args = _sweep.parse_args(parser, argv)
    tasks = args.tasks.split(",") if args.tasks else sorted(task_mappings())
    if unknown := set(tasks) - set(task_mappings()):
        parser.error(f"unknown tasks {sorted(unknown)}; known: {sorted(task_mappings())}")
    if args.serve:
        _sweep.serve(check_pair, args.compile, args.memory_gb)
        return 0
    if args.table is not None:
        print(report([r for path in args.table for r in _sweep.load(path).values()]))
        return 0
    runnable = ({(r.model_type, r.task) for r in _sweep.load(args.runnable_in).values() if r.status != "cpu-fail"}
                if args.runnable_in else None)
    chosen = plan(tasks, args.only.split(",") if args.only else [], args.limit, args.shuffle, args.per_task,
                  runnable)
    results = _sweep.drive(__file__, chosen, compiled=args.compile, timeout=args.timeout, json_path=args.json,
                           skip_done=args.skip_done, budget=args.budget, jobs=args.jobs,
                           memory_gb=args.memory_gb)
    print("\n" + report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
