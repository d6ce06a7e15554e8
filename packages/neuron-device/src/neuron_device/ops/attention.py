"""`scaled_dot_product_attention` on `neuron` takes the fused flash kernel where the CPU would.

torch picks an SDPA backend per device through `_fused_sdp_choice`, a C++ dispatch stub that a Python backend cannot
fill, so on `neuron` every call would take the math decomposition: a dozen ops and an S x S score matrix, where the
CPU runs one fused kernel. This route sits above autograd (AutogradPrivateUse1), as the CPU's choice does, and sends
each call where the CPU's `use_flash_attention_cpp` would send it: to `_scaled_dot_product_flash_attention_for_cpu`,
whose derivative formula autograd then uses, else to the math decomposition. The flash op itself is a native
Tensor-engine op (`optracking`): its `neuron` kernel is the CPU kernel on host aliases, or neuron-nki's NKI flash
attention when that plugin registers one.
"""

from __future__ import annotations

import math

import torch

from . import registry

__all__ = ["cpu_would_use_flash"]

_aten = torch.ops.aten
_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def cpu_would_use_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
                        dropout_p: float, enable_gqa: bool) -> bool:
    """CPU's `use_flash_attention_cpp` constraints (dropout-free): where the CPU runs its flash kernel."""
    if not torch.backends.cuda.flash_sdp_enabled() or dropout_p != 0.0:
        return False
    if attn_mask is not None and attn_mask.requires_grad and torch.is_grad_enabled():
        return False  # the flash op has no gradient for the mask: CPU takes the math path then
    if any(t.is_nested for t in (q, k, v)) or not (q.dim() == k.dim() == v.dim() == 4):
        return False
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in _FLASH_DTYPES:
        return False
    if not (q.size(-1) == k.size(-1) == v.size(-1)) or min(q.size(2), k.size(2)) == 0:
        return False
    if any(t.stride(-1) != 1 for t in (q, k, v)) or not (q.size(0) == k.size(0) == v.size(0)):
        return False
    if k.size(1) != v.size(1):
        return False
    return q.size(1) == k.size(1) or (enable_gqa and q.size(1) % k.size(1) == 0)


@registry.kernel("aten::scaled_dot_product_attention", dispatch_key="AutogradPrivateUse1")
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
                                 enable_gqa=False):
    if cpu_would_use_flash(query, key, value, attn_mask, dropout_p, enable_gqa):
        if attn_mask is not None and attn_mask.dtype == torch.bool:  # as CPU's convert_boolean_attn_mask
            attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill_(~attn_mask, -math.inf)
        return _aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal,
                                                                 attn_mask=attn_mask, scale=scale)[0]
    return _aten.scaled_dot_product_attention.default.decompose(query, key, value, attn_mask, dropout_p, is_causal,
                                                                scale=scale, enable_gqa=enable_gqa)
