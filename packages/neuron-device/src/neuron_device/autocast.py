"""`torch.autocast("neuron")`: CUDA's autocast op policies, as Python kernels on the `AutocastPrivateUse1` key.

torch 2.13 ships autocast policies for CUDA, CPU, MPS and XPU in C++, but none for PrivateUse1, and not even the
fallthrough that lets ops without a policy pass: until `register()` runs, every op on a `neuron` tensor inside
`torch.autocast("neuron")` fails. `register()` installs that fallthrough and one kernel per op of CUDA's policy lists
(the ops torch 2.13 registers for `AutocastCUDA`; `tests/test_autocast.py` checks the tables stay equal to them):

* lower_precision_fp (matmul, conv, linear, bmm, baddbmm, addmm, sdpa, RNN cells, ...): floating inputs run in the
  autocast dtype, `torch.get_autocast_dtype("neuron")`, which is bfloat16 by default (Trainium's native type; torch's
  own default for PrivateUse1 is float16). float16 is allowed too.
* fp32 (exp, log, pow, norms, losses, ...): floating inputs run in float32.
* fp32_set_opt_dtype (softmax, log_softmax, sum, prod, cumsum, ...): run in float32 through the op's `dtype`
  argument, unless the caller gave one.
* fp32_append_dtype (`norm` without a dtype): redispatch to the overload that takes a dtype.
* promote (addcmul, addcdiv, atan2, dot, index_put, ...): inputs run in the widest floating type among them.
* banned: `binary_cross_entropy` raises, as on CUDA.

As on CUDA, only floating `neuron` tensors other than float64 are cast, and the lower-precision casts of float32 leaf
tensors that require grad (model weights) are cached until the outermost autocast region exits.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

__all__ = [
    "BANNED",
    "DEFAULT_DTYPE",
    "FP32",
    "FP32_APPEND_DTYPE",
    "FP32_SET_OPT_DTYPE",
    "LOWER_PRECISION_FP",
    "PROMOTE",
    "clear_cache",
    "policies",
    "register",
]

DEFAULT_DTYPE = torch.bfloat16
_DEVICE = "neuron"
_KEY = "AutocastPrivateUse1"
_NO_AUTOCAST = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
_DOUBLE = torch.float64

LOWER_PRECISION_FP: tuple[str, ...] = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu", "addmm", "addmv", "addr", "matmul",
    "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
)
FP32: tuple[str, ...] = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "sinh",
    "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm", "native_layer_norm",
    "group_norm", "rms_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss",
    "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm",
    "logsumexp", "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d",
    "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
)
FP32_SET_OPT_DTYPE: tuple[str, ...] = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum", "linalg_vector_norm",
    "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList",
)
# op without a dtype argument -> the overload it redispatches to with dtype appended
FP32_APPEND_DTYPE: dict[str, str] = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
}
PROMOTE: tuple[str, ...] = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put", "tensordot",
    "scatter_add",
)
BANNED: dict[str, str] = {
    "binary_cross_entropy": (
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
        "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
        "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
        "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
        "safe to autocast."
    ),
}

# id(source) -> (weak reference to source, cast copy): lower-precision casts of weights, for one autocast region.
_cache: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
_libraries: list[torch.library.Library] = []


def clear_cache() -> None:
    """Drop the cached weight casts (torch calls this, through `torch.clear_autocast_cache`, on leaving autocast)."""
    _cache.clear()


def _overload(name: str) -> torch._ops.OpOverload:
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def _eligible(value: object) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.device.type == _DEVICE
        and value.is_floating_point()
        and value.dtype is not _DOUBLE
    )


def _cached_cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`tensor.to(dtype)`, reusing the cast of a float32 weight within one autocast region (CUDA's heuristic)."""
    if not (
        tensor.dtype is torch.float32
        and tensor.requires_grad
        and tensor.is_leaf
        and not tensor._is_view()
        and dtype is torch.get_autocast_dtype(_DEVICE)
        and torch.is_autocast_cache_enabled()
    ):
        return tensor.to(dtype)
    key = id(tensor)
    entry = _cache.get(key)
    if entry is not None and entry[0]() is tensor:
        return entry[1]
    cast = tensor.to(dtype)
    _cache[key] = (weakref.ref(tensor), cast)
    return cast


def _cast(value, dtype: torch.dtype):
    """Cast every eligible tensor in `value` (a tensor, or a list/tuple of them such as `cat`'s) to `dtype`."""
    if isinstance(value, torch.Tensor):
        return _cached_cast(value, dtype) if value.dtype is not dtype and _eligible(value) else value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _tensors(values):
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _tensors(value)


def _run_cast(op: torch._ops.OpOverload, dtype: torch.dtype, args: tuple, kwargs: dict):
    """Run `op` with its eligible inputs cast to `dtype`, below the autocast key (casts included)."""
    with torch._C._ExcludeDispatchKeyGuard(_NO_AUTOCAST):
        return op(*_cast(args, dtype), **{k: _cast(v, dtype) for k, v in kwargs.items()})


def _lower_precision_fp(op: torch._ops.OpOverload) -> Callable:
    def kernel(*args, **kwargs):
        return _run_cast(op, torch.get_autocast_dtype(_DEVICE), args, kwargs)

    return kernel


def _fp32(op: torch._ops.OpOverload) -> Callable:
    def kernel(*args, **kwargs):
        return _run_cast(op, torch.float32, args, kwargs)

    return kernel


def _fp32_set_opt_dtype(op: torch._ops.OpOverload) -> Callable:
    """Run in float32 through the op's `dtype` argument when the first input is eligible and no dtype was given."""
    arguments = op._schema.arguments
    position = next(i for i, a in enumerate(arguments) if a.name == "dtype")
    positional = not arguments[position].kwarg_only

    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_NO_AUTOCAST):
            if not _eligible(args[0]):
                return op(*args, **kwargs)
            if positional and position < len(args):
                if args[position] is None:
                    args = (*args[:position], torch.float32, *args[position + 1 :])
            elif kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
            return op(*args, **kwargs)

    return kernel


def _fp32_append_dtype(op: torch._ops.OpOverload, target: torch._ops.OpOverload) -> Callable:
    """Redispatch to `target`, the same op with a trailing dtype: float32 if the first input is eligible."""
    defaults = [a.default_value for a in op._schema.arguments]

    def kernel(*args):
        args = (*args, *defaults[len(args) :])
        dtype = torch.float32 if _eligible(args[0]) else args[0].dtype
        with torch._C._ExcludeDispatchKeyGuard(_NO_AUTOCAST):
            return target(*args, dtype=dtype)

    return kernel


def _promote(op: torch._ops.OpOverload) -> Callable:
    """Run in the widest floating type of the eligible inputs (float64 inputs are left alone, as on CUDA)."""

    def kernel(*args, **kwargs):
        dtype = torch.get_autocast_dtype(_DEVICE)
        for tensor in _tensors((*args, *kwargs.values())):
            if _eligible(tensor):
                dtype = torch.promote_types(dtype, tensor.dtype)
        return _run_cast(op, dtype, args, kwargs)

    return kernel


def _banned(message: str) -> Callable:
    def kernel(*args, **kwargs):
        raise RuntimeError(message)

    return kernel


def policies() -> dict[str, str]:
    """Every op with a neuron autocast kernel ("aten::mm" -> "lower_precision_fp", ...), for docs and tests."""
    table = {f"aten::{name}": "lower_precision_fp" for name in LOWER_PRECISION_FP}
    table.update({f"aten::{name}": "fp32" for name in FP32})
    table.update({f"aten::{name}": "fp32_set_opt_dtype" for name in FP32_SET_OPT_DTYPE})
    table.update({f"aten::{name}": "fp32_append_dtype" for name in FP32_APPEND_DTYPE})
    table.update({f"aten::{name}": "promote" for name in PROMOTE})
    table.update({f"aten::{name}": "banned" for name in BANNED})
    return table


def register() -> None:
    """Install the autocast fallthrough and the policies, and make bfloat16 the default autocast dtype of `neuron`.

    `torch.set_autocast_dtype` is thread-local in torch: threads started later default to torch's float16 unless
    they pass `dtype=` to `torch.autocast` or call `torch.set_autocast_dtype("neuron", torch.bfloat16)` themselves.
    """
    if _libraries:
        return
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, _KEY)
    library = torch.library.Library("aten", "IMPL")
    for name in LOWER_PRECISION_FP:
        library.impl(name, _lower_precision_fp(_overload(name)), _KEY)
    for name in FP32:
        library.impl(name, _fp32(_overload(name)), _KEY)
    for name in FP32_SET_OPT_DTYPE:
        library.impl(name, _fp32_set_opt_dtype(_overload(name)), _KEY)
    for name, target in FP32_APPEND_DTYPE.items():
        library.impl(name, _fp32_append_dtype(_overload(name), _overload(target)), _KEY)
    for name in PROMOTE:
        library.impl(name, _promote(_overload(name)), _KEY)
    for name, message in BANNED.items():
        library.impl(name, _banned(message), _KEY)
    _libraries.extend((fallthrough, library))
    torch.set_autocast_dtype(_DEVICE, DEFAULT_DTYPE)
