"""The op catalogue: which engine runs each ATen op on a NeuronCore, and the work it does there (FLOPs for the
Tensor engine), declared beside kernel registration (`ops.registry`) as torchax declares op metadata where it
registers the op.

An op is native when it has an engine (`NATIVE`, plus every op tagged `pointwise` or `reduction`, and metadata-only
views); every other op is a CPU fallback (`neuron_device.fallback.admit`). `op_info` classifies an op (the op's record,
`ops.call.overload_record`, keeps the answer); the op ledger (`simulation.ledger`) turns an op's work into charged
device time. A matmul's work is the Tensor engine's occupancy as it tiles onto the 128 x 128 array
(`simulation.costmodel.matmul_array_flops`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import torch

from ..simulation import costmodel as _costmodel

__all__ = ["BREAKDOWN_PARTS", "NATIVE", "OpInfo", "attention_flops", "breakdown_part", "op_info", "scattered_elements"]

_Flops = Callable[[tuple, Any], float]


def _array_flops(out: Any, contraction: int) -> float:
    """Tensor-engine occupancy of products whose output is `out` ([..., m, n], [m] or a scalar)."""
    shape = tuple(out.shape)
    m, n = (shape[-2], shape[-1]) if len(shape) >= 2 else ((shape[0], 1) if shape else (1, 1))
    batch = out.numel() // (m * n) if m * n else 0
    return _costmodel.matmul_array_flops(m, contraction, n, batch)


def _matmul_flops(args: tuple, out: Any) -> float:
    """mm, bmm, dot, mv, _grouped_mm: the products tiled onto the 128 x 128 array (contraction: the first
    input's last dim)."""
    return _array_flops(out, args[0].shape[-1])


def _addmm_flops(args: tuple, out: Any) -> float:
    """addmm, baddbmm, addmv: the product of args 1 and 2 on the array, plus adding the bias."""
    return _array_flops(out, args[1].shape[-1]) + out.numel()


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


def attention_flops(query: torch.Tensor, key: torch.Tensor, visible: float = 1.0, backward: bool = False) -> float:
    """Q K^T and P V: two products of B x H x Sq x Sk x d over the `visible` fraction of the scores (a flash kernel
    skips masked blocks: a causal mask, about half). The backward recomputes P, then dV, dP, dQ and dK: five
    products to the forward's two."""
    flops = 4.0 * query.numel() * key.shape[-2] * visible
    return 2.5 * flops if backward else flops


def _flash_attention_flops(args: tuple, out: Any) -> float:
    """_scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, ...)."""
    return attention_flops(args[0], args[1], 0.5 if len(args) > 4 and args[4] else 1.0)


def _flash_attention_backward_flops(args: tuple, out: Any) -> float:
    """The backward (grad_out, query, key, value, out, logsumexp, dropout_p, is_causal)."""
    return attention_flops(args[1], args[2], 0.5 if len(args) > 7 and args[7] else 1.0, backward=True)


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
    # Random numbers: the engines' hardware RNG (NKI's `nki.isa.rand2` / `rng`, `nki.isa.dropout`), so these are
    # native kernels on Trainium although they are tagged nondeterministic_seeded (which otherwise means fallback).
    "normal", "uniform", "bernoulli", "random", "native_dropout",
})

# Gather/scatter and index arithmetic: GpSimd engine (with its integrated DMA).
_GPSIMD = frozenset({
    "index", "index_put", "_index_put_impl", "index_select", "index_add", "index_copy", "index_fill", "gather",
    "scatter", "scatter_add", "scatter_reduce", "embedding", "embedding_dense_backward", "masked_scatter", "take",
    "sort", "topk", "argsort", "arange", "linspace", "eye",
    "randperm", "multinomial",  # random draws, then a sort / search (native, as the RNG ops of `_VECTOR`)
})


def _indexed_region(args: tuple) -> Any:
    """index_put(self, indices, values, ...): the broadcast indices by the dims they leave whole; None when a mask
    indexes (its data decides the region)."""
    base, indices = args[0], args[1]
    if any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices):
        return None
    shape = torch.broadcast_shapes(*(tuple(i.shape) for i in indices if i is not None))
    return math.prod(shape) * math.prod(n for d, n in enumerate(base.shape) if d >= len(indices) or indices[d] is None)


# Scatters into their first argument, by base name: the elements they write (index_copy: its source; scatter: its
# index, whether it scatters a tensor or a value).
_SCATTER_REGIONS: dict[str, Callable[[tuple], Any]] = {
    "index_put": _indexed_region, "_index_put_impl": _indexed_region, "_unsafe_index_put": _indexed_region,
    "index_copy": lambda args: args[3].numel(), "scatter": lambda args: args[2].numel(),
}


def scattered_elements(base: str, args: tuple) -> Any:
    """Elements the scatter op `base` ("index_copy", "index_put", ...; any other op: None) writes into its first
    argument, from its arguments (tensors or fakes, whose sizes may be symbolic); None when data decides."""
    region = _SCATTER_REGIONS.get(base)
    return None if region is None else region(args)


# Gathers from their first argument (a table): the DMA reads only the rows they select.
_GATHERS = frozenset({"embedding", "index_select", "gather", "index"})


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
    # a scatter into its first argument (`index_copy`, `index_put`, ...): its base name, for `scattered_elements`
    scatter_base: str | None = None
    gathers: bool = False  # it reads only the selected rows of its first argument


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


@functools.cache
def op_info(op: torch._ops.OpOverload) -> OpInfo:
    """How the chip runs `op`, computed once per overload: it depends only on the op's schema and tags and this
    module's constant tables (a compiler's passes ask it for every node; the hot paths read the op's record,
    `ops.call`, which keeps it too)."""
    base = _base_name(op)
    engine = _engine(op, base)
    return OpInfo(_name(op), engine, _TENSOR.get(base) if engine == "tensor" else None,
                  base if base in _SCATTER_REGIONS else None, base in _GATHERS)


# What a step's device time went to (`neuron-plan --breakdown`): the part of each charge, by the engine that bounds
# the kernel's work. Attention is its own part, whichever engine bounds it; copies, gathers and other GpSimd or DMA
# work are data movement; a fallback's host-link copies are host transfers. neuron-plan adds, by context, the
# optimizer's step, the recompute of activation checkpointing, exposed collectives by kind, the pipeline bubble
# and idle time.
BREAKDOWN_PARTS = ("matmul", "attention", "vector_scalar", "data_movement", "host_transfers", "other")
_PART_OF_ENGINE = {"tensor": "matmul", "vector": "vector_scalar", "scalar": "vector_scalar",
                   "gpsimd": "data_movement", "dma": "data_movement", None: "host_transfers"}


def breakdown_part(name: str, engine: str | None) -> str:
    """The part of a step a kernel named `name` whose work is bound by `engine` ("tensor", "vector", ...; None: a
    CPU fallback) belongs to: attention by name (SDPA, flash and flex attention, NKI attention kernels), else by
    engine."""
    lowered = name.lower()
    if "attention" in lowered or "flash" in lowered:
        return "attention"
    return _PART_OF_ENGINE.get(engine, "other")
