"""`flex_attention` on `neuron`: its higher-order ops run as one flash-attention kernel each.

`torch.nn.attention.flex_attention` reaches the device through two higher-order ops, `flex_attention` and
`flex_attention_backward` (autograd's), which torch implements for any device with the dense math of
`CompositeExplicitAutograd` (`sdpa_dense`: the full score matrix, a batched matmul, the score and mask functions
applied elementwise). On `neuron` that would be a dozen separately charged ops and an S x S score matrix in HBM,
where Trainium runs attention as one fused flash kernel (NKI's flash attention) that skips the blocks the block mask
hides. These PrivateUse1 kernels compute the same numbers (the dense math, on host aliases: the CPU's results) and
charge one flash kernel: eager SDPA's Tensor-engine work (`catalogue.attention_flops`) over the fraction of score
blocks the block mask visits, the backward 2.5 times the forward.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch._C import DispatchKey
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from .. import allocator
from ..simulation import ledger as _ledger
from ..storage import host_alias
from ..topology import topology
from .catalogue import attention_flops

__all__ = ["charge_kernel", "nbytes", "visible_fraction"]

# the module, not the op: `torch._higher_order_ops` re-exports the op under the module's name
_hop = importlib.import_module("torch._higher_order_ops.flex_attention")

_NEURON = "neuron"


def _to_host(value: Any) -> Any:
    """A `neuron` tensor's host alias, which says whether the tensor requires grad: the backward computes gradients
    only for the captured tensors that do."""
    if not (isinstance(value, torch.Tensor) and value.device.type == _NEURON):
        return value
    return host_alias(value).requires_grad_(value.requires_grad)


class _OnHost(TorchDispatchMode):
    """Tensors the score and mask functions create on `neuron` (their traced graphs name the device they were
    traced on: a constant, the no-op mask's `ones`) are created on the host, beside the host aliases they meet."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == _NEURON:
            kwargs = {**kwargs, "device": torch.device("cpu")}
        return func(*args, **kwargs)


def _to_device(value: Any, index: int) -> Any:
    return allocator.adopt_tracked(value.contiguous(), index) if isinstance(value, torch.Tensor) else value


def visible_fraction(block_mask: tuple, kv_length: int) -> float:
    """The fraction of [q block, kv block] tiles a flash kernel visits under `block_mask` (`BlockMask.as_tuple()`:
    partial and full blocks per query block, then the block sizes)."""
    kv_num_blocks, full_kv_num_blocks = block_mask[2], block_mask[4]
    kv_block_size = block_mask[-2]
    tiles = kv_num_blocks.numel() * -(-kv_length // kv_block_size)
    visited = int(kv_num_blocks.sum()) + (int(full_kv_num_blocks.sum()) if full_kv_num_blocks is not None else 0)
    return min(1.0, visited / tiles) if tiles else 0.0


def charge_kernel(name: str, query: torch.Tensor, key: torch.Tensor, visible: float, backward: bool,
                  moved: int) -> None:
    """Account one flash-attention launch on the query's device that visits the `visible` fraction of the score
    tiles (`visible_fraction`) and moves `moved` bytes; plan mode charges a planned call with it too."""
    work = _ledger.Work((("tensor", attention_flops(query, key, visible, backward)),), moved, query.dtype)
    signature = (tuple(query.shape), tuple(key.shape), query.dtype, round(visible, 6))
    _ledger.record_kernel(name, query.device.index, signature, work.seconds(topology().target), work)


def nbytes(*values: Any) -> int:
    """The bytes of every tensor among `values` (nested), as the kernels count what they move."""
    return sum(t.numel() * t.element_size() for t in _ledger.flat_tensors(list(values)))


@_hop.flex_attention.py_impl(DispatchKey.PrivateUse1)
def flex_attention(query, key, value, score_mod, block_mask, scale, kernel_options, score_mod_other_buffers=(),
                   mask_mod_other_buffers=()):
    """out, logsumexp and max score of the attention: the dense math on host aliases, charged as one flash kernel."""
    hosts = tree_map(_to_host, (query, key, value, score_mod, block_mask, scale, kernel_options,
                                score_mod_other_buffers, mask_mod_other_buffers))
    with torch.no_grad(), _OnHost():
        results = _hop.sdpa_dense(*hosts)
    charge_kernel("flex_attention", query, key, visible_fraction(hosts[4], key.shape[-2]), False,
                  nbytes(query, key, value, results))
    return tuple(_to_device(r, query.device.index) for r in results)


@_hop.flex_attention_backward.py_impl(DispatchKey.PrivateUse1)
def flex_attention_backward(query, key, value, out, logsumexp, grad_out, grad_logsumexp, fw_graph, joint_graph,
                            block_mask, scale, kernel_options, score_mod_other_buffers, mask_mod_other_buffers):
    """Gradients of query, key, value and the score function's captured tensors, as one flash backward kernel."""
    hosts = tree_map(_to_host, (query, key, value, out, logsumexp, grad_out, grad_logsumexp, fw_graph, joint_graph,
                                block_mask, scale, kernel_options, score_mod_other_buffers, mask_mod_other_buffers))
    with torch.no_grad(), _OnHost():
        grad_query, grad_key, grad_value, grad_buffers = _hop.sdpa_dense_backward(*hosts)
    charge_kernel("flex_attention_backward", query, key, visible_fraction(hosts[9], key.shape[-2]), True,
                  nbytes(query, key, value, out, grad_out, grad_query, grad_key, grad_value))
    index = query.device.index
    return (_to_device(grad_query, index), _to_device(grad_key, index), _to_device(grad_value, index),
            tuple(_to_device(g, index) for g in grad_buffers))
