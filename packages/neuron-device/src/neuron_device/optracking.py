"""What the chip would do with each op: native kernel or CPU fallback, kernels compiled, device time charged.

Every op still computes on the host (results never depend on this module). What it decides is what TorchNeuron on a
real Trainium would do:

* **Native ops** have a Neuron kernel: an engine and a cost (`NATIVE`, plus every op tagged `pointwise` or
  `reduction`, and metadata-only views). They are recorded as executed (`get_executed_ops`), compiled once per
  signature (op, input shapes and dtypes, non-tensor arguments: the real device compiles one kernel per signature)
  and charged their `costmodel` estimate on the current stream of their device.
* **Every other op is a CPU fallback**, as on the device: it warns once per op with TorchNeuron's text
  ``Operator 'aten::X' fell back to CPU``, is recorded (`get_fallback_ops`) and is charged the device->host copy of
  its inputs and the host->device copy of its outputs. Random-number ops fall back (reported for TorchNeuron's eager
  mode), as do ops with data-dependent output shapes. With ``NEURON_FALLBACK_ENABLED=0`` (TorchNeuron's variable) a
  fallback raises instead, to test that a workload runs natively.

The per-op work is a dict lookup per op, a tuple of shapes and dtypes per call, and a dict lookup per signature.
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import torch

from . import costmodel as _costmodel
from . import envvars
from . import hostmem as _hostmem
from . import numerics as _numerics
from . import timeline as _timeline
from . import topology as _topology

__all__ = [
    "FALLBACK_ENV",
    "NATIVE",
    "Launch",
    "OpInfo",
    "Work",
    "admit",
    "charge",
    "clear_compilation_cache",
    "clear_compilation_counters",
    "clear_op_tracking",
    "compilation_stats",
    "get_executed_ops",
    "get_fallback_ops",
    "launches",
    "mark_executed",
    "op_info",
    "record_kernel",
    "transfer",
]

FALLBACK_ENV = envvars.FALLBACK.name
_NEURON = "neuron"

_Flops = Callable[[tuple, Any], float]


def _matmul_flops(args: tuple, out: Any) -> float:
    """mm, bmm, dot, mv, _grouped_mm: 2 x outputs x contraction size (the first input's last dim)."""
    return 2.0 * out.numel() * args[0].shape[-1]


def _addmm_flops(args: tuple, out: Any) -> float:
    """addmm, baddbmm, addmv: the product of args 1 and 2, plus adding the bias."""
    return 2.0 * out.numel() * args[1].shape[-1] + out.numel()


def _addbmm_flops(args: tuple, out: Any) -> float:
    """addbmm: a batch of products summed into one matrix."""
    return 2.0 * args[1].numel() * args[2].shape[-1] + out.numel()


def _macs_per_output(weight: torch.Tensor) -> float:
    return weight.numel() / weight.shape[0] if weight.shape[0] else 0.0


def _convolution_flops(args: tuple, out: Any) -> float:
    """convolution(input, weight, bias, stride, padding, dilation, transposed, ...)."""
    input, weight, transposed = args[0], args[1], args[6]
    return 2.0 * (input.numel() if transposed else out.numel()) * _macs_per_output(weight)


def _convolution_backward_flops(args: tuple, out: Any) -> float:
    """convolution_backward(grad_output, input, weight, ..., transposed, ..., output_mask): one forward-sized product
    per gradient asked for (input and weight)."""
    grad_output, input, weight, transposed, mask = args[0], args[1], args[2], args[7], args[10]
    forward = 2.0 * (input.numel() if transposed else grad_output.numel()) * _macs_per_output(weight)
    return forward * (int(mask[0]) + int(mask[1]))


def _attention_flops(query: torch.Tensor, key: torch.Tensor, causal: bool) -> float:
    """Q K^T and P V: two products of B x H x Sq x Sk x d; a causal mask skips about half."""
    flops = 4.0 * query.numel() * key.shape[-2]
    return flops / 2 if causal else flops


def _flash_attention_flops(args: tuple, out: Any) -> float:
    """_scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, ...)."""
    return _attention_flops(args[0], args[1], len(args) > 4 and bool(args[4]))


def _flash_attention_backward_flops(args: tuple, out: Any) -> float:
    """The backward (grad_out, query, key, value, out, logsumexp, dropout_p, is_causal): P recomputed, then dV, dP,
    dQ and dK, five products to the forward's two."""
    return 2.5 * _attention_flops(args[1], args[2], len(args) > 7 and bool(args[7]))


# Tensor engine ops and their FLOPs.
_TENSOR: dict[str, _Flops] = {
    "mm": _matmul_flops,
    "bmm": _matmul_flops,
    "dot": _matmul_flops,
    "vdot": _matmul_flops,
    "mv": _matmul_flops,
    "_grouped_mm": _matmul_flops,
    "addmm": _addmm_flops,
    "_addmm_activation": _addmm_flops,
    "baddbmm": _addmm_flops,
    "addmv": _addmm_flops,
    "addbmm": _addbmm_flops,
    "convolution": _convolution_flops,
    "_convolution": _convolution_flops,
    "convolution_backward": _convolution_backward_flops,
    "_scaled_dot_product_flash_attention_for_cpu": _flash_attention_flops,
    "_scaled_dot_product_flash_attention_for_cpu_backward": _flash_attention_backward_flops,
}

# Transcendental and activation functions run on the Scalar (activation) engine.
_SCALAR = frozenset({
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sigmoid", "tanh", "gelu", "silu", "mish", "softplus",
    "elu", "selu", "celu", "erf", "erfc", "erfinv", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
    "asinh", "acosh", "atanh", "rsqrt", "sqrt", "reciprocal", "pow", "hardswish", "hardsigmoid", "logit", "glu",
    "gelu_backward", "silu_backward", "sigmoid_backward", "tanh_backward", "softplus_backward", "elu_backward",
    "mish_backward", "hardswish_backward", "hardsigmoid_backward", "log_sigmoid_forward", "log_sigmoid_backward",
    "glu_backward",
})

# Vector engine: arithmetic, comparisons, reductions, normalisations, softmax, losses, fused optimizer steps
# (besides every op tagged `pointwise` or `reduction`).
_VECTOR = frozenset({
    "_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data", "native_layer_norm",
    "native_layer_norm_backward", "native_group_norm", "native_group_norm_backward", "native_batch_norm",
    "native_batch_norm_backward", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
    "_native_batch_norm_legit_functional", "_batch_norm_with_update", "_batch_norm_no_update", "batch_norm_backward",
    "_fused_rms_norm", "_fused_rms_norm_backward", "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward",
    "nll_loss2d_backward", "mse_loss", "mse_loss_backward", "l1_loss", "smooth_l1_loss", "smooth_l1_loss_backward",
    "huber_loss", "huber_loss_backward", "binary_cross_entropy", "binary_cross_entropy_backward", "cumsum", "cumprod",
    "logsumexp", "norm", "linalg_vector_norm", "_linalg_vector_norm", "var", "std", "var_mean", "std_mean", "mean",
    "sum", "prod", "amax", "amin", "max", "min", "argmax", "argmin", "aminmax", "all", "any", "equal", "fill", "zero",
    "masked_fill", "tril", "triu", "addr", "where", "threshold_backward", "hardtanh_backward", "leaky_relu_backward",
    "_amp_foreach_non_finite_check_and_unscale", "_amp_update_scale", "_fused_adam", "_fused_adamw", "_fused_sgd",
    "lerp", "addcmul", "addcdiv", "clamp", "clamp_min", "clamp_max", "_foreach_norm", "max_pool2d_with_indices",
    "max_pool2d_with_indices_backward", "max_pool3d_with_indices", "max_pool3d_with_indices_backward", "avg_pool2d",
    "avg_pool2d_backward", "avg_pool3d", "avg_pool3d_backward", "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward",
    "adaptive_max_pool2d", "adaptive_max_pool2d_backward", "upsample_bilinear2d", "upsample_bilinear2d_backward",
    "upsample_nearest2d_backward",
})

# Gather/scatter and index arithmetic: GpSimd engine (with its integrated DMA).
_GPSIMD = frozenset({
    "index", "index_put", "_index_put_impl", "index_select", "index_add", "index_copy", "index_fill", "gather",
    "scatter", "scatter_add", "scatter_reduce", "embedding", "embedding_dense_backward", "masked_scatter", "take",
    "sort", "topk", "argsort", "arange", "linspace",
})

# Pure data movement: DMA engines, HBM to HBM.
_DMA = frozenset({
    "copy", "clone", "contiguous", "_copy_from", "_copy_from_and_resize", "cat", "_cat", "stack", "_stack", "repeat",
    "constant_pad_nd", "flip", "roll", "narrow_copy", "split_with_sizes_copy", "split_copy", "unbind_copy",
    "_chunk_cat", "slice_scatter", "select_scatter", "diagonal_scatter", "as_strided_scatter", "expand_copy",
    "permute_copy", "transpose_copy", "view_copy", "t_copy", "unsqueeze_copy", "squeeze_copy", "detach_copy",
    "alias_copy", "unfold_copy", "reflection_pad1d", "reflection_pad2d", "replication_pad1d", "replication_pad2d",
    "upsample_nearest1d", "upsample_nearest2d", "pixel_shuffle", "pixel_unshuffle", "im2col", "col2im",
    "_foreach_copy",
})

# Metadata-only ops whose schema does not say they alias their input.
_VIEWS = frozenset({"_unsafe_view", "lift_fresh"})

NATIVE: dict[str, frozenset[str]] = {
    "tensor": frozenset(_TENSOR),
    "scalar": _SCALAR,
    "vector": _VECTOR,
    "gpsimd": _GPSIMD,
    "dma": _DMA,
}
_FALLBACK_TAGS = (torch.Tag.nondeterministic_seeded, torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output)


@dataclasses.dataclass(frozen=True)
class OpInfo:
    """How the chip runs one op overload: `engine` is "view", an engine of `costmodel.ENGINES`, or None (fallback)."""

    name: str  # "aten::add.Tensor", as TorchNeuron names ops
    engine: str | None
    flops: _Flops | None = None


_FOREACH = "_foreach_"


def _base_name(op: torch._ops.OpOverload) -> str:
    """The op's name without namespace, overload and in-place underscore ("add_" -> "add")."""
    name = op._schema.name.partition("::")[2]
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def _elementwise_tags(packet_name: str) -> bool:
    """Whether aten op `packet_name` is tagged pointwise or reduction (for the `_foreach_` lists of such ops)."""
    packet = getattr(torch.ops.aten, packet_name, None)
    if packet is None:
        return False
    tags = {tag for overload in packet.overloads() for tag in getattr(packet, overload).tags}
    return torch.Tag.pointwise in tags or torch.Tag.reduction in tags


def _is_view(op: torch._ops.OpOverload) -> bool:
    schema = op._schema
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return False
    return bool(schema.returns) and all(r.alias_info is not None for r in schema.returns)


def _engine(op: torch._ops.OpOverload, base: str) -> str | None:
    for engine, names in NATIVE.items():
        if base in names:
            return engine
    if any(tag in op.tags for tag in _FALLBACK_TAGS):
        return None
    if _is_view(op) or base in _VIEWS:
        return "view"
    if torch.Tag.pointwise in op.tags or torch.Tag.reduction in op.tags:
        return "vector"
    if base.startswith(_FOREACH):  # a list version of an elementwise op: the engine of that op
        inner = base[len(_FOREACH):]
        for engine, names in NATIVE.items():
            if inner in names:
                return engine
        if _elementwise_tags(inner):
            return "vector"
    return None


def _name(op: torch._ops.OpOverload) -> str:
    schema = op._schema
    return schema.name + (f".{schema.overload_name}" if schema.overload_name else "")


_infos: dict[torch._ops.OpOverload, OpInfo] = {}


def op_info(op: torch._ops.OpOverload) -> OpInfo:
    """How the chip runs `op` (cached per overload)."""
    info = _infos.get(op)
    if info is None:
        base = _base_name(op)
        engine = _engine(op, base)
        info = _infos[op] = OpInfo(_name(op), engine, _TENSOR.get(base) if engine == "tensor" else None)
    return info


_executed: set[str] = set()
_fallbacks: set[str] = set()
_kernels: dict[tuple, float] = {}  # signature of a compiled native kernel -> its estimated device seconds
_seconds: dict[tuple, float] = {}  # the same for signatures that compile nothing (fallbacks, device copies)
_compilations: Counter[str] = Counter()  # op name -> kernels compiled (distinct signatures)
_cache_hits = 0


def _fallback_enabled() -> bool:
    return envvars.FALLBACK.read()


_LIBRARY_PACKAGES = frozenset({"torch", "neuron_device", "torch_neuronx"})


def _user_stacklevel() -> int:
    """The `stacklevel` that points a warning raised in `admit` at the first frame outside torch and this package."""
    frame, level = sys._getframe(2), 2  # level 1 is admit, level 2 its caller
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] in _LIBRARY_PACKAGES:
        frame, level = frame.f_back, level + 1
    return level


def admit(op: torch._ops.OpOverload) -> OpInfo:
    """Classify `op` before it runs: a fallback warns once per op, is recorded, and raises in strict mode."""
    info = _infos.get(op) or op_info(op)
    if info.engine is None:
        name = info.name
        if name not in _fallbacks:
            _fallbacks.add(name)
            if _fallback_enabled():
                warnings.warn(f"Operator '{name}' fell back to CPU", stacklevel=_user_stacklevel())
        if not _fallback_enabled():
            raise RuntimeError(
                f"Operator '{name}' has no Neuron kernel and CPU fallback is disabled ({FALLBACK_ENV}=0); unset "
                f"{FALLBACK_ENV} to let it fall back to CPU"
            )
    return info


_TENSOR_TYPE = torch.Tensor
_SCALAR_TYPES = frozenset({bool, int, float, str, type(None), torch.dtype, torch.device, torch.layout,
                           torch.memory_format})


def _signature(values: Iterable[Any]) -> tuple:
    """A hashable key of arguments: shape and dtype of tensors, values of scalars, the type of anything else.

    Hot path (every op): exact type checks first, recursion only for lists.
    """
    key = []
    append = key.append
    for value in values:
        kind = type(value)
        if kind is _TENSOR_TYPE:
            append((value.shape, value.dtype))
        elif kind in _SCALAR_TYPES:
            append(value)
        elif kind is tuple or kind is list:
            append(_signature(value))
        elif isinstance(value, _TENSOR_TYPE):
            append((value.shape, value.dtype))
        else:
            append(kind.__name__)
    return tuple(key)


def _tensors(value: Any):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclasses.dataclass(frozen=True)
class Work:
    """What one call of a signature does, kept so the run can be re-estimated on another target: work per engine
    and HBM bytes of a kernel (`costmodel.estimate_kernel`), or the host-link copies of a fallback."""

    engines: tuple[tuple[str, float], ...] = ()
    hbm_bytes: int = 0
    dtype: torch.dtype = torch.float32
    host_copies: tuple[int, ...] = ()  # bytes of each host<->device copy; non-empty means no kernel runs

    def seconds(self, target: _topology.Target) -> float:
        """Device seconds of one call on `target`."""
        if self.host_copies:
            return sum(_costmodel.transfer_seconds(nbytes, target) for nbytes in self.host_copies)
        return _costmodel.estimate_kernel(dict(self.engines), self.hbm_bytes, dtype=self.dtype, target=target).seconds


class Launch:
    """Calls of one signature since the last `clear_op_tracking()`: its op name, seconds per call on the simulated
    target, and its `Work` (None for kernels recorded with their time only, e.g. NKI kernels)."""

    __slots__ = ("calls", "name", "seconds", "work")

    def __init__(self, name: str, seconds: float, work: Work | None) -> None:
        self.name, self.seconds, self.work, self.calls = name, seconds, work, 0


_launches: dict[tuple, Launch] = {}
_works: dict[tuple, Work] = {}  # signature -> its work, beside the cached seconds in `_kernels` / `_seconds`
# `charge`'s one lookup for a signature it has seen since the last clear of either: its Launch and cached seconds.
# Both clears empty it, so a hit means the kernel is cached, the op is recorded as executed and the Launch is live.
_charged: dict[tuple, tuple[Launch, float]] = {}


def _launch(key: tuple, name: str, seconds: float) -> None:
    """Count one call of signature `key`."""
    entry = _launches.get(key)
    if entry is None:
        entry = _launches[key] = Launch(name, seconds, _works.get(key))
    entry.calls += 1


def _settle() -> None:
    """Ops queued by adaptive eager (`concatenation`) execute, and are accounted, before the tracking is read."""
    if _hostmem.flush_pending is not None:
        _hostmem.flush_pending()


def launches() -> list[Launch]:
    """Every signature charged to a device since the last `clear_op_tracking()`, with its call count."""
    _settle()
    return list(_launches.values())


def _work(info: OpInfo, args: tuple, kwargs: dict, result: Any) -> Work:
    """What one call of a signature does (computed once per signature)."""
    outputs = list(_tensors(result))
    # an out= tensor is written, not read: it counts once, as an output
    inputs = list(_tensors(args)) + [t for t in _tensors(list(kwargs.values())) if all(t is not o for o in outputs)]
    if info.engine is None:
        return Work(host_copies=(_nbytes(inputs), _nbytes(outputs)))
    first = outputs[0] if outputs else None
    dtype = inputs[0].dtype if inputs else (first.dtype if first is not None else torch.float32)
    out_elements = sum(t.numel() for t in outputs)
    if info.engine == "tensor":
        amount = info.flops(args, first)
    elif info.engine == "vector":
        amount = max(sum(t.numel() for t in inputs), out_elements)
    else:
        amount = out_elements or max((t.numel() for t in inputs), default=0)
    return Work(((info.engine, amount),), _nbytes(inputs) + _nbytes(outputs), dtype)


def _seconds_of(info: OpInfo, key: tuple, args: tuple, kwargs: dict, result: Any) -> float:
    """Device seconds of a signature `charge` has not seen since the last clear: cached, or estimated now (for a
    native op, a compilation)."""
    global _cache_hits
    if info.engine is None:
        seconds = _seconds.get(key)
        if seconds is None:
            work = _works[key] = _work(info, args, kwargs, result)
            seconds = _seconds[key] = work.seconds(_topology.topology().target)
        return seconds
    _executed.add(info.name)
    seconds = _kernels.get(key)
    if seconds is None:
        work = _works[key] = _work(info, args, kwargs, result)
        seconds = _kernels[key] = work.seconds(_topology.topology().target)
        _compilations[info.name] += 1
    else:
        _cache_hits += 1
    return seconds


def charge(info: OpInfo, index: int, args: tuple, kwargs: dict, result: Any) -> None:
    """Account one executed call of `info`'s op on device `index` (host arguments and result)."""
    global _cache_hits
    engine = info.engine
    name = info.name
    if engine == "view":
        _executed.add(name)
        return
    key = (name, _signature(args), (tuple(kwargs), _signature(kwargs.values())) if kwargs else None)
    if engine == "tensor" and args and isinstance(args[0], torch.Tensor) and args[0].dtype == torch.float32:
        key += (_numerics.fp32_matmul_rounds_to_bf16(),)  # the Tensor engine rate of fp32 depends on it
    charged = _charged.get(key)
    if charged is None:
        seconds = _seconds_of(info, key, args, kwargs, result)
        _launch(key, name, seconds)
        _charged[key] = (_launches[key], seconds)
    else:  # the common call: one lookup
        launch, seconds = charged
        launch.calls += 1
        if engine is not None:
            _cache_hits += 1
    end = _timeline.charge(index, seconds, name)
    if engine is None:
        _timeline.timeline(index).host_wait(end)  # the host ran the op: it waited for its inputs and outputs


def record_kernel(name: str, index: int, signature: Hashable, seconds: float, work: Work | None = None) -> None:
    """Account one launch of a kernel that does not run through the fallback: an NKI kernel, a compiled graph.

    `signature` identifies the compiled kernel (its first launch counts as a compilation, later ones as cache hits);
    `seconds` is its device time, e.g. from `costmodel.estimate_kernel`, charged on the current stream of `index`;
    `work`, when given, lets a report re-estimate it on another target.
    """
    global _cache_hits
    if seconds < 0:
        raise ValueError(f"a kernel's device time must be non-negative, got {seconds}")
    _executed.add(name)
    key = (name, signature)
    if key in _kernels:
        _cache_hits += 1
    else:
        _kernels[key] = seconds
        _compilations[name] += 1
        if work is not None:
            _works[key] = work
    _launch(key, name, seconds)
    _timeline.charge(index, seconds, name)


def transfer(name: str, src: torch.Tensor, dst: torch.Tensor, device: torch.device | None = None) -> None:
    """Account a copy from `src` to `dst`, either of which may be on the host (a DMA on the device's timeline).

    `device` is where `dst` ends up when `dst` is still its host form (default: `dst.device`). Host->device copies
    are queued on the current stream; a device->host copy makes the host wait for the stream (as a CUDA copy to
    pageable memory does), so `.cpu()` and `.item()` are synchronisation points.
    """
    _executed.add(name)
    nbytes = dst.numel() * dst.element_size()
    device = dst.device if device is None else device
    src_on_device = src.device.type == _NEURON
    if src_on_device and device.type == _NEURON:
        key = (name, nbytes)
        seconds = _seconds.get(key)
        if seconds is None:
            work = _works[key] = Work(hbm_bytes=2 * nbytes)
            seconds = _seconds[key] = work.seconds(_topology.topology().target)
        _launch(key, name, seconds)
        _timeline.charge(device.index, seconds, name)
    elif src_on_device or device.type == _NEURON:
        direction = "device->host" if src_on_device else "host->device"
        index = src.device.index if src_on_device else device.index
        key = (name, direction, nbytes)
        seconds = _seconds.get(key)
        if seconds is None:
            work = _works[key] = Work(host_copies=(nbytes,))
            seconds = _seconds[key] = work.seconds(_topology.topology().target)
        _launch(key, f"{name} ({direction})", seconds)
        end = _timeline.charge(index, seconds, f"{name} ({direction})")
        if src_on_device:
            _timeline.timeline(index).host_wait(end)


def mark_executed(names: Iterable[str]) -> None:
    """Record ops as executed on the device whose time is charged elsewhere (inside one fused kernel)."""
    _executed.update(names)


def get_fallback_ops() -> list[str]:
    """Names of the ops that fell back to CPU since the last `clear_op_tracking()`, sorted."""
    _settle()
    return sorted(_fallbacks)


def get_executed_ops() -> list[str]:
    """Names of the ops that executed on the Neuron device (native kernels) since the last clear, sorted."""
    _settle()
    return sorted(_executed)


def clear_op_tracking() -> None:
    """Forget executed and fallback ops; a fallback warns again the next time it runs."""
    _settle()
    _executed.clear()
    _fallbacks.clear()
    _launches.clear()
    _charged.clear()


def clear_compilation_counters() -> None:
    """Reset the compilation and cache-hit counters; compiled kernels stay cached (a signature seen before hits)."""
    global _cache_hits
    _settle()
    _compilations.clear()
    _cache_hits = 0


def clear_compilation_cache() -> None:
    """Forget every compiled kernel (and its cost estimate) and reset the counters: every signature compiles again."""
    _settle()
    _kernels.clear()
    _seconds.clear()
    _works.clear()
    _charged.clear()
    clear_compilation_counters()


def compilation_stats() -> dict[str, Any]:
    """Kernel-cache counters, named as TorchNeuron's compilation-cache statistics, plus compilations per op."""
    _settle()
    compilations = sum(_compilations.values())
    return {
        "total_compilations": compilations,
        "in_memory_hits": _cache_hits,
        "in_memory_misses": compilations,
        "total_entries": len(_kernels),
        "hit_rate": _cache_hits / (_cache_hits + compilations) if _cache_hits + compilations else 0.0,
        "compilations_per_op": dict(_compilations),
    }
