"""The NKI kernel library as the native ``neuron`` implementation of aten ops (registered by ``plugin``).

Direct ``neuron`` kernels (PrivateUse1), each running its NKI kernel when the inputs are inside the kernel's
supported shapes/dtypes and otherwise the ordinary implementation (the CPU kernel on host aliases, or the op's own
decomposition), so an unsupported input is never computed wrongly:

* ``_scaled_dot_product_flash_attention_for_cpu`` (+ ``_backward``): flash attention, causal/GQA, no mask/dropout;
* ``_fused_rms_norm`` (+ ``_backward``, which has no CPU kernel at all), ``native_layer_norm`` (+ ``_backward``),
  ``_softmax`` (+ ``_softmax_backward_data``) over the last dim.

Composite ops are routed to those fused ops above autograd (AutogradPrivateUse1), as CPU routes them, so autograd
uses the fused ops' derivative formulas: ``scaled_dot_product_attention`` takes the flash op wherever CPU's
``use_flash_attention_cpp`` would (else torch's math decomposition), and ``rms_norm`` takes ``_fused_rms_norm``
when the NKI kernel supports the input. ``aten::mm`` is left to neuron-device: its matmul kernel is already a native
Tensor-engine kernel with the numerics policy, so an NKI replacement would not change the estimate (``nki.library.
matmul`` is available to ``nki_op`` users and compiled graphs). ``NEURON_NKI_NATIVE_KERNELS=0`` disables all of this.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["ENV", "MAX_HEAD_DIM", "MAX_ROW", "register"]

ENV = "NEURON_NKI_NATIVE_KERNELS"
MAX_HEAD_DIM = 128  # one partition tile of the head dim
MAX_ROW = 8192  # elements per row the norm/softmax kernels keep in SBUF per tile (fp32 working copies)
_FLOATS = (torch.float32, torch.bfloat16)
_aten = torch.ops.aten


def _run(module: str, kernel: str, grid: Any, *args: Any) -> Any:
    """Launch ``nki.library.<module>.<kernel>`` on neuron tensors (imported on first use)."""
    import importlib

    from .adapter import launch

    k = getattr(importlib.import_module(f"nki.library.{module}"), kernel)
    return launch(k, grid, args, {}, name=f"nki::{kernel}")


def _host(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    from neuron_device.ops.host_exec import run_on_host

    return run_on_host(op, *args, **kwargs)


def _uniform(*tensors: torch.Tensor | None) -> bool:
    """Non-empty neuron tensors of one device and one supported float dtype (None entries ignored)."""
    present = [t for t in tensors if t is not None]
    first = present[0]
    return all(t.device == first.device and t.device.type == "neuron" and t.dtype == first.dtype
               and t.dtype in _FLOATS and t.numel() > 0 for t in present)


# -- attention ------------------------------------------------------------------------------------------------------
def _attention_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, attn_mask: Any) -> bool:
    return (attn_mask is None and dropout_p == 0.0 and _uniform(q, k, v) and q.dim() == k.dim() == v.dim() == 4
            and q.size(-1) == k.size(-1) == v.size(-1) <= MAX_HEAD_DIM and q.size(0) == k.size(0) == v.size(0)
            and k.shape[:3] == v.shape[:3] and q.size(1) % k.size(1) == 0)


def _flash_fwd(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    if not _attention_supported(query, key, value, dropout_p, attn_mask):
        return _host(_aten._scaled_dot_product_flash_attention_for_cpu.default, query, key, value, dropout_p,
                     is_causal, attn_mask=attn_mask, scale=scale)
    B, H = query.shape[:2]
    s = scale if scale is not None else 1.0 / math.sqrt(query.size(-1))
    # torch's CPU kernel (and its meta function) lays out: out like the query ([B, S, H, d] memory for a transposed
    # query, else contiguous), logsumexp always [B, S, H] memory. Same layouts here, so compiled graphs' stride
    # checks hold.
    bshd = query.transpose(1, 2).is_contiguous() and not query.is_contiguous()
    out, lse = _run("attention", "flash_attention_fwd", (B, H), query.transpose(-1, -2), key.transpose(-1, -2),
                    value, s, bool(is_causal), 0, bshd)
    return (out.transpose(1, 2) if bshd else out), lse.view(lse.shape[:3]).permute(0, 2, 1)


def _flash_bwd(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask=None, scale=None):
    if not (_attention_supported(query, key, value, dropout_p, attn_mask) and _uniform(grad_out, out, query)
            and logsumexp.dtype == torch.float32):
        return _host(_aten._scaled_dot_product_flash_attention_for_cpu_backward.default, grad_out, query, key, value,
                     out, logsumexp, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
    B, Hkv = key.shape[:2]
    s = scale if scale is not None else 1.0 / math.sqrt(query.size(-1))
    grads = _run("attention", "flash_attention_bwd", (B, Hkv), query, query.transpose(-1, -2), key,
                key.transpose(-1, -2), value.transpose(-1, -2), out, grad_out, grad_out.transpose(-1, -2),
                logsumexp.unsqueeze(-1), s, bool(is_causal), 0, True)
    return tuple(g.transpose(1, 2) for g in grads)  # [B, S, heads, d] memory, as torch's CPU kernel


def _cpu_would_use_flash(q, k, v, attn_mask, dropout_p: float, enable_gqa: bool) -> bool:
    """CPU's `use_flash_attention_cpp` constraints (and dropout-free): where CPU runs its flash kernel."""
    if not torch.backends.cuda.flash_sdp_enabled() or dropout_p != 0.0:
        return False
    if attn_mask is not None and attn_mask.requires_grad and torch.is_grad_enabled():
        return False  # the flash op has no gradient for the mask: CPU takes the math path then
    if any(t.is_nested for t in (q, k, v)) or not (q.dim() == k.dim() == v.dim() == 4):
        return False
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float32, torch.float64, *_FLOATS, torch.float16):
        return False
    if not (q.size(-1) == k.size(-1) == v.size(-1)) or min(q.size(2), k.size(2)) == 0:
        return False
    if any(t.stride(-1) != 1 for t in (q, k, v)) or not (q.size(0) == k.size(0) == v.size(0)):
        return False
    if k.size(1) != v.size(1):
        return False
    return q.size(1) == k.size(1) or (enable_gqa and q.size(1) % k.size(1) == 0)


def _sdpa_route(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    if _cpu_would_use_flash(query, key, value, attn_mask, dropout_p, enable_gqa):
        if attn_mask is not None and attn_mask.dtype == torch.bool:  # as CPU's convert_boolean_attn_mask
            attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill_(~attn_mask, -math.inf)
        return _aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal,
                                                                 attn_mask=attn_mask, scale=scale)[0]
    return _aten.scaled_dot_product_attention.default.decompose(query, key, value, attn_mask, dropout_p, is_causal,
                                                                scale=scale, enable_gqa=enable_gqa)


# -- normalisation and softmax ---------------------------------------------------------------------------------------
def _rows(x: torch.Tensor, normalized_shape) -> tuple[int, int]:
    d = math.prod(normalized_shape)
    return x.numel() // d, d


def _norm_supported(x: torch.Tensor, normalized_shape, *params: torch.Tensor | None) -> bool:
    n = len(normalized_shape)
    return (_uniform(x, *params) and 0 < n <= x.dim() and tuple(x.shape[x.dim() - n:]) == tuple(normalized_shape)
            and 0 < math.prod(normalized_shape) <= MAX_ROW
            and all(p is None or tuple(p.shape) == tuple(normalized_shape) for p in params))


def _stat_shape(x: torch.Tensor, normalized_shape) -> tuple[int, ...]:
    return tuple(x.shape[:x.dim() - len(normalized_shape)]) + (1,) * len(normalized_shape)


def _ones(n: int, like: torch.Tensor) -> torch.Tensor:
    return torch.ones(n, dtype=like.dtype, device=like.device)


def _rms_eps(x: torch.Tensor, eps: float | None) -> float:
    return torch.finfo(x.dtype).eps if eps is None else float(eps)


def _fused_rms_norm(input, normalized_shape, weight=None, eps=None):
    if not _norm_supported(input, normalized_shape, weight):
        return _aten._fused_rms_norm.default.decompose(input, normalized_shape, weight, eps)
    n, d = _rows(input, normalized_shape)
    w = weight.reshape(d) if weight is not None else _ones(d, input)
    out, rstd = _run("norms", "rmsnorm_fwd", (), input.reshape(n, d), w, _rms_eps(input, eps))
    return out.view(input.shape), rstd.view(_stat_shape(input, normalized_shape))


def _fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight, output_mask):
    n, d = _rows(input, normalized_shape)
    if _norm_supported(input, normalized_shape, weight) and _uniform(grad_out, input) and rstd.dtype == torch.float32:
        w = weight.reshape(d) if weight is not None else _ones(d, input)
        dx, dw = _run("norms", "rmsnorm_bwd", (), grad_out.reshape(n, d), input.reshape(n, d),
                      rstd.reshape(n, 1), w)
        return (dx.view(input.shape) if output_mask[0] else None,
                dw.view(weight.shape) if output_mask[1] and weight is not None else None)
    # No CPU kernel exists for this op: the same formula with ordinary ops (below autograd, on neuron).
    dims = tuple(range(input.dim() - len(normalized_shape), input.dim()))
    x, g, r = input.float(), grad_out.float(), rstd.float()
    xhat = x * r
    gw = g * weight.float() if weight is not None else g
    dx = r * (gw - xhat * (gw * xhat).mean(dims, keepdim=True))
    dw = (g * xhat).sum(tuple(range(input.dim() - len(normalized_shape)))) if weight is not None else None
    return (dx.to(input.dtype) if output_mask[0] else None,
            dw.to(weight.dtype) if output_mask[1] and dw is not None else None)


def _rms_norm_route(input, normalized_shape, weight=None, eps=None):
    if _norm_supported(input, normalized_shape, weight):
        return _aten._fused_rms_norm(input, normalized_shape, weight, eps)[0]
    return _aten.rms_norm.default.decompose(input, normalized_shape, weight, eps)


def _layer_norm(input, normalized_shape, weight, bias, eps):
    if not _norm_supported(input, normalized_shape, weight, bias):
        return _host(_aten.native_layer_norm.default, input, normalized_shape, weight, bias, eps)
    n, d = _rows(input, normalized_shape)
    w = weight.reshape(d) if weight is not None else _ones(d, input)
    b = bias.reshape(d) if bias is not None else torch.zeros(d, dtype=input.dtype, device=input.device)
    out, mean, rstd = _run("norms", "layernorm_fwd", (), input.reshape(n, d), w, b, float(eps))
    stat = _stat_shape(input, normalized_shape)
    return out.view(input.shape), mean.to(input.dtype).view(stat), rstd.to(input.dtype).view(stat)


def _layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    if not (_norm_supported(input, normalized_shape, weight, bias) and _uniform(grad_out, input)):
        return _host(_aten.native_layer_norm_backward.default, grad_out, input, normalized_shape, mean, rstd, weight,
                     bias, output_mask)
    n, d = _rows(input, normalized_shape)
    w = weight.reshape(d) if weight is not None else _ones(d, input)
    dx, dw, db = _run("norms", "layernorm_bwd", (), grad_out.reshape(n, d), input.reshape(n, d),
                      mean.reshape(n, 1), rstd.reshape(n, 1), w)
    return (dx.view(input.shape) if output_mask[0] else None,
            dw.view(weight.shape) if output_mask[1] and weight is not None else None,
            db.view(bias.shape) if output_mask[2] and bias is not None else None)


def _last_dim(x: torch.Tensor, dim: int) -> bool:
    return x.dim() >= 1 and dim % x.dim() == x.dim() - 1 and 0 < x.size(-1) <= MAX_ROW


def _softmax(self, dim, half_to_float):
    if half_to_float or not (_uniform(self) and _last_dim(self, dim)):
        return _host(_aten._softmax.default, self, dim, half_to_float)
    return _run("softmax", "softmax_fwd", (), self.reshape(-1, self.size(-1))).view(self.shape)


def _softmax_backward(grad_output, output, dim, input_dtype):
    if input_dtype != output.dtype or not (_uniform(grad_output, output) and _last_dim(output, dim)):
        return _host(_aten._softmax_backward_data.default, grad_output, output, dim, input_dtype)
    d = output.size(-1)
    return _run("softmax", "softmax_bwd", (), grad_output.reshape(-1, d), output.reshape(-1, d)).view(output.shape)


KERNELS: dict[str, Callable] = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": _flash_fwd,
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": _flash_bwd,
    "aten::_fused_rms_norm": _fused_rms_norm,
    "aten::_fused_rms_norm_backward": _fused_rms_norm_backward,
    "aten::native_layer_norm": _layer_norm,
    "aten::native_layer_norm_backward": _layer_norm_backward,
    "aten::_softmax": _softmax,
    "aten::_softmax_backward_data": _softmax_backward,
}
ROUTES: dict[str, Callable] = {
    "aten::scaled_dot_product_attention": _sdpa_route,
    "aten::rms_norm": _rms_norm_route,
}


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false")


def register(registry: Any) -> None:
    """Register the kernels and routes with neuron-device's op registry (the ``neuron_register`` hook)."""
    if not enabled():
        return
    with warnings.catch_warnings():
        # torch 2.13 itself puts a kernel for native_layer_norm on the PrivateUse1 key; replacing it is the point
        warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered kernel", category=UserWarning)
        for name, fn in KERNELS.items():
            registry.register(name, fn)
    for name, fn in ROUTES.items():
        registry.register(name, fn, dispatch_key="AutogradPrivateUse1")
