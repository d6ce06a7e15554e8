"""`scaled_dot_product_attention` on `neuron` takes the fused attention op, as TorchNeuron's does.

torch picks an SDPA backend per device through `_fused_sdp_choice`, a C++ dispatch stub that a Python backend cannot
fill, so on `neuron` every call would take the math decomposition: a dozen ops and an S x S score matrix. TorchNeuron's
C++ stub answers `SDPBackend.overrideable`, so SDPA runs `_scaled_dot_product_fused_attention_overrideable` (the
fused op torch keeps for out-of-tree backends, with its own derivative formula), whose `neuron` kernel is an NKI flash
kernel. This route sits above autograd (AutogradPrivateUse1), as the C++ choice does, and on the backend key too
(`inference_mode` skips autograd's keys; the C++ choice is made all the same), and sends each call where the
CPU's `use_flash_attention_cpp` would send it to that fused op, else to the math decomposition.

The fused op's `neuron` kernels (forward and backward) run the flash kernel `_scaled_dot_product_flash_attention_for_cpu`
(+ `_backward`) on the same `neuron` tensors: a native Tensor-engine op (`simulation.ledger`) whose `neuron` kernel is
the CPU kernel on host aliases, or neuron-nki's NKI flash attention when that plugin registers one; so the numerics
are the CPU's and the time is one flash kernel's. Compiled graphs lower the fused op to the same flash op
(`fused_attention_decompositions`, in neuron-compile's table). Context parallelism shards the fused op
(`_patches._patch_context_parallel_fused_attention`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .. import allocator
from . import registry

__all__ = ["cpu_would_use_flash", "fused_attention_decompositions"]

_aten = torch.ops.aten
_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_flash_sdp_enabled = torch._C._get_flash_sdp_enabled  # `torch.backends.cuda.flash_sdp_enabled`, minus its frame
# The overloads' C callables (`OpOverload.__call__` forwards to them): each SDPA call makes both calls, after a
# kernel that evicts the host's caches, where every Python frame of the route costs several times its hot time
_FUSED = _aten._scaled_dot_product_fused_attention_overrideable.default._op
_FLASH = _aten._scaled_dot_product_flash_attention_for_cpu.default._op


def cpu_would_use_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
                        dropout_p: float, enable_gqa: bool) -> bool:
    """CPU's `use_flash_attention_cpp` constraints (dropout-free): where the CPU runs its flash kernel."""
    if dropout_p != 0.0 or not _flash_sdp_enabled():
        return False
    if attn_mask is not None and attn_mask.requires_grad and torch.is_grad_enabled():
        return False  # the flash op has no gradient for the mask: CPU takes the math path then
    if q.is_nested or k.is_nested or v.is_nested:
        return False
    qs, ks, vs = q.shape, k.shape, v.shape
    if not (len(qs) == len(ks) == len(vs) == 4):
        return False
    dtype = q.dtype
    if not (dtype == k.dtype == v.dtype) or dtype not in _FLASH_DTYPES:
        return False
    if not (qs[3] == ks[3] == vs[3]) or min(qs[2], ks[2]) == 0:
        return False
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1 or not (qs[0] == ks[0] == vs[0]):
        return False
    if ks[1] != vs[1]:
        return False
    return qs[1] == ks[1] or (enable_gqa and qs[1] % ks[1] == 0)


@registry.kernel("aten::scaled_dot_product_attention", dispatch_key="AutogradPrivateUse1")
@registry.kernel("aten::scaled_dot_product_attention", is_composite=True)
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
                                 enable_gqa=False):
    if cpu_would_use_flash(query, key, value, attn_mask, dropout_p, enable_gqa):
        if attn_mask is not None and attn_mask.dtype == torch.bool:  # as CPU's convert_boolean_attn_mask
            attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill_(~attn_mask, -math.inf)
        return _FUSED(query, key, value, attn_mask, dropout_p, is_causal, False, scale=scale)[0]
    return _aten.scaled_dot_product_attention.default.decompose(query, key, value, attn_mask, dropout_p, is_causal,
                                                                scale=scale, enable_gqa=enable_gqa)


@registry.kernel("aten::_scaled_dot_product_fused_attention_overrideable", is_composite=True)
def fused_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_bias: torch.Tensor | None = None,
                    dropout_p: float = 0.0, is_causal: bool = False, return_debug_mask: bool = False, *,
                    scale: float | None = None) -> tuple:
    """The fused op as the flash kernel computes it: output and logsumexp ([B, H, Sq], float32), the sequence lengths
    (a dense batch has no cumulative ones), an RNG seed and offset (the flash kernel draws none) and no debug mask
    (the meta function's outputs)."""
    if return_debug_mask:
        raise NotImplementedError("_scaled_dot_product_fused_attention_overrideable on neuron: return_debug_mask=True "
                                  "is not supported (the flash kernel materialises no attention probabilities)")
    out, logsumexp = _FLASH(query, key, value, dropout_p, is_causal, attn_mask=attn_bias, scale=scale)
    seed, offset = _rng_scalars(query)
    return out, logsumexp, None, None, query.size(-2), key.size(-2), seed, offset, None


def _rng_scalars(query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two uninitialised int64 scalars on `query`'s device: the fused op's RNG seed and offset outputs. A real
    `neuron` tensor is a host scalar adopted and charged as an op's result (a dispatch and a Python kernel fewer than
    `torch.empty`; its allocation queued with the op results', `allocator.track`, where `allocator.empty` would
    replay the queue); a fake or traced one (plan mode, graphs this decomposition lowers) comes from `torch.empty`."""
    device = query.device
    if type(query) is torch.Tensor and device.type == "neuron":
        index = device.index
        return (allocator.adopt_tracked(torch.empty((), dtype=torch.long), index),
                allocator.adopt_tracked(torch.empty((), dtype=torch.long), index))
    return torch.empty((), dtype=torch.long, device=device), torch.empty((), dtype=torch.long, device=device)


@registry.kernel("aten::_scaled_dot_product_fused_attention_overrideable_backward", is_composite=True)
def fused_attention_backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attn_bias: torch.Tensor | None, grad_input_mask: list[bool], out: torch.Tensor,
                             logsumexp: torch.Tensor, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p: float,
                             is_causal: bool, philox_seed, philox_offset, *, scale: float | None = None) -> tuple:
    """The flash kernel's backward; the bias gets no gradient (SDPA takes the math path for a bias that needs one)."""
    if grad_input_mask[3]:
        raise NotImplementedError("_scaled_dot_product_fused_attention_overrideable_backward on neuron: the flash "
                                  "kernel computes no gradient for attn_bias")
    grads = _aten._scaled_dot_product_flash_attention_for_cpu_backward(grad_out, query, key, value, out, logsumexp,
                                                                       dropout_p, is_causal, attn_mask=attn_bias,
                                                                       scale=scale)
    return *grads, None


def fused_attention_decompositions() -> dict[torch._ops.OpOverload, Callable]:
    """The fused op and its backward as the flash op they run (the compiler's lowering of them)."""
    return {_aten._scaled_dot_product_fused_attention_overrideable.default: fused_attention,
            _aten._scaled_dot_product_fused_attention_overrideable_backward.default: fused_attention_backward}


@registry.kernel("aten::_native_multi_head_attention", is_composite=True)
def native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                mask=None, need_weights=True, average_attn_weights=True, mask_type=None):
    """`nn.MultiheadAttention`'s inference fast path: the input projections, `scaled_dot_product_attention` (the
    flash route above), the output projection, as ops on `neuron` (the CPU's fused kernel would be a CPU fallback).
    Weights asked for (`need_weights`) need the probabilities themselves: those are computed explicitly."""
    batch, length, _ = query.shape
    head_dim = embed_dim // num_head
    if query is key and key is value:
        q, k, v = torch.nn.functional.linear(query, qkv_weight, qkv_bias).chunk(3, dim=-1)
    else:
        weights, biases = qkv_weight.chunk(3), qkv_bias.chunk(3)
        q, k, v = (torch.nn.functional.linear(x, w, b) for x, w, b in zip((query, key, value), weights, biases,
                                                                          strict=True))

    def heads(x: torch.Tensor) -> torch.Tensor:
        return x.view(batch, -1, num_head, head_dim).transpose(1, 2)

    q, k, v = heads(q), heads(k), heads(v)
    attend = _mha_mask(mask, mask_type, batch)
    if need_weights:
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(head_dim)
        if attend is not None:
            scores = scores.masked_fill(~attend, -math.inf) if attend.dtype == torch.bool else scores + attend
        probabilities = torch.softmax(scores, dim=-1)
        out = probabilities @ v
        weights = probabilities.mean(dim=1) if average_attn_weights else probabilities
    else:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attend)
        weights = None  # as the CPU kernel: an undefined tensor
    out = out.transpose(1, 2).reshape(batch, length, embed_dim)
    return torch.nn.functional.linear(out, proj_weight, proj_bias), weights


def _mha_mask(mask, mask_type, batch: int):
    """The fast path's mask as SDPA's: boolean masks mark what to hide (SDPA's mark what to attend); mask_type 1 is
    a key padding mask (batch, source), 0 an attention mask (target, source), 2 both merged (batch, heads, ...)."""
    if mask is None:
        return None
    if mask_type == 1:
        mask = mask.view(batch, 1, 1, -1)
    return ~mask if mask.dtype == torch.bool else mask
