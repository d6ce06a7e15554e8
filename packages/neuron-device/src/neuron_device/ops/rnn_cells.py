"""Direct `neuron` kernels for the fused LSTM/GRU cell ops.

torch's RNN code (`nn.LSTM`, `nn.GRU`, `lstm_cell`, `gru_cell`) calls `_thnn_fused_lstm_cell` / `_thnn_fused_gru_cell`
for every device except the CPU, and torch ships those kernels for CUDA only, so without these kernels LSTM and GRU
fail on `neuron`. They compute what CUDA's fused kernels compute (same gate order and workspace layout, so torch's
autograd formulas apply), in float32 for bfloat16/float16 inputs with one rounding of each output, like the matmul
numerics policy (`numerics.py`).
"""

from __future__ import annotations

import torch

from .. import allocator
from ..storage import host_alias
from .registry import kernel

_LOW = (torch.bfloat16, torch.float16)


def _on_host(name: str, *tensors: torch.Tensor | None) -> tuple[int, torch.dtype, list[torch.Tensor | None]]:
    """The device index, dtype and compute-dtype host copies of the op's tensors (one device, one dtype)."""
    present = [t for t in tensors if t is not None]
    first = present[0]
    for tensor in present:
        if tensor.device != first.device:
            raise RuntimeError(
                f"{name}: expected all tensors to be on the same device, but found {first.device} and {tensor.device}"
            )
        if tensor.dtype != first.dtype:
            raise RuntimeError(f"{name}: expected all tensors to have dtype {first.dtype}, but found {tensor.dtype}")
    compute = torch.float32 if first.dtype in _LOW else first.dtype
    hosts = [None if t is None else host_alias(t).to(compute) for t in tensors]
    return first.device.index, first.dtype, hosts


def _to_device(index: int, dtype: torch.dtype, *results: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    return tuple(
        None if r is None else allocator.adopt_tracked(r.to(dtype).contiguous(), index) for r in results
    )


def _check_gates(name: str, gates: torch.Tensor, hidden: torch.Tensor, chunks: int) -> None:
    if gates.dim() != 2 or gates.shape[1] != chunks * hidden.shape[-1] or gates.shape[0] != hidden.shape[0]:
        raise RuntimeError(
            f"{name}: gates of shape {list(gates.shape)} do not match a hidden state of shape {list(hidden.shape)} "
            f"({chunks} gates per hidden unit)"
        )


def _cell_on_host(name: str, chunks: int, input_gates, hidden_gates, state, input_bias, hidden_bias):
    """A fused cell's inputs checked (`chunks` gates per hidden unit) and brought to the host."""
    _check_gates(name, input_gates, state, chunks)
    _check_gates(name, hidden_gates, state, chunks)
    return _on_host(name, input_gates, hidden_gates, state, input_bias, hidden_bias)


@kernel("aten::_thnn_fused_lstm_cell")
def fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """hy, cy and the workspace of activated gates (input, forget, cell, output) that the backward reads."""
    index, dtype, (ig, hg, c, ib, hb) = _cell_on_host("_thnn_fused_lstm_cell", 4, input_gates, hidden_gates, cx,
                                                     input_bias, hidden_bias)
    gates = ig + hg
    for bias in (ib, hb):
        if bias is not None:
            gates = gates + bias
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * c + i * g
    hy = o * cy.tanh()
    return _to_device(index, dtype, hy, cy, torch.cat([i, f, g, o], 1))


@kernel("aten::_thnn_fused_lstm_cell_backward_impl")
def fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    """Gradients of the gates (before activation), of cx and, with biases, of the bias."""
    name = "_thnn_fused_lstm_cell_backward_impl"
    if grad_hy is None and grad_cy is None:
        return None, None, None
    index, dtype, (ghy, gcy, c, cy_, ws) = _on_host(name, grad_hy, grad_cy, cx, cy, workspace)
    i, f, g, o = ws.chunk(4, 1)
    tanh_cy = cy_.tanh()
    ghy = torch.zeros_like(c) if ghy is None else ghy
    gc = ghy * o * (1 - tanh_cy * tanh_cy) + (0 if gcy is None else gcy)
    grad_gates = torch.cat(
        [gc * g * i * (1 - i), gc * c * f * (1 - f), gc * i * (1 - g * g), ghy * tanh_cy * o * (1 - o)], 1
    )
    grad_bias = grad_gates.sum(0) if has_bias else None
    return _to_device(index, dtype, grad_gates, gc * f, grad_bias)


@kernel("aten::_thnn_fused_gru_cell")
def fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """hy and the workspace (reset gate, input gate, new gate, hidden part of the new gate, hx)."""
    index, dtype, (ig, hg, h, ib, hb) = _cell_on_host("_thnn_fused_gru_cell", 3, input_gates, hidden_gates, hx,
                                                     input_bias, hidden_bias)
    ig = ig if ib is None else ig + ib
    hg = hg if hb is None else hg + hb
    ir, ii, in_ = ig.chunk(3, 1)
    hr, hi, hn = hg.chunk(3, 1)
    r = (ir + hr).sigmoid()
    z = (ii + hi).sigmoid()
    n = (in_ + r * hn).tanh()
    hy = n + z * (h - n)
    return _to_device(index, dtype, hy, torch.cat([r, z, n, hn, h], 1))


@kernel("aten::_thnn_fused_gru_cell_backward")
def fused_gru_cell_backward(grad_hy, workspace, has_bias):
    """Gradients of the input gates, hidden gates, hx and, with biases, of both biases."""
    index, dtype, (go, ws) = _on_host("_thnn_fused_gru_cell_backward", grad_hy, workspace)
    r, z, n, hn, h = ws.chunk(5, 1)
    grad_n = go * (1 - z) * (1 - n * n)
    grad_r = grad_n * hn * r * (1 - r)
    grad_z = go * (h - n) * z * (1 - z)
    grad_input_gates = torch.cat([grad_r, grad_z, grad_n], 1)
    grad_hidden_gates = torch.cat([grad_r, grad_z, grad_n * r], 1)
    biases = (grad_input_gates.sum(0), grad_hidden_gates.sum(0)) if has_bias else (None, None)
    return _to_device(index, dtype, grad_input_gates, grad_hidden_gates, go * z, *biases)
