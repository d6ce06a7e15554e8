"""Row softmax over the last dim of x [N, D], forward and backward, 128 rows per tile (ragged N)."""

from __future__ import annotations

import nki
import nki.isa as nisa
import nki.language as nl

TILE = 128


def negated_row_max(xt):
    """``-max(x, free axis)`` of a [rows, D] SBUF tile as a [rows, 1] fp32 tile (one Vector reduction): the bias
    that keeps ``exp(x - max)`` from overflowing, shared by this kernel and the softmax and attention tutorials."""
    neg_max = nl.ndarray((xt.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=neg_max, op=nl.maximum, data=xt, axis=1, negate=True)
    return neg_max


def divide_by_row_sums(values, sums, dtype):
    """``values / sums`` for a [rows, F] tile and its [rows, 1] fp32 sums, as a new SBUF tile of ``dtype``: one
    reciprocal per row, then one multiply. The last step of softmax and attention, shared by the library kernels and
    the tutorials."""
    rows, F = values.shape
    inv = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=inv, data=sums)
    out = nl.ndarray((rows, F), dtype=dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=out, data=values, op0=nl.multiply, operand0=inv)
    return out


@nki.jit
def softmax_fwd(x):
    """exp(x − max) / Σ exp(x − max), fp32 math, stored in x's dtype."""
    N, D = x.shape
    out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    for r0 in range(0, N, TILE):
        rows = min(TILE, N - r0)
        xt = nl.load(x[r0:r0 + rows, :])
        neg_max = negated_row_max(xt)
        e = nl.ndarray((rows, D), dtype=nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=e, op=nl.exp, data=xt, reduce_op=nl.add, reduce_res=s, bias=neg_max)
        nl.store(out[r0:r0 + rows, :], divide_by_row_sums(e, s, x.dtype))
    return out


@nki.jit
def softmax_bwd(g, y):
    """dx = y · (g − Σ g·y) for y = softmax(x)."""
    N, D = y.shape
    dx = nl.ndarray((N, D), dtype=y.dtype, buffer=nl.shared_hbm)
    for r0 in range(0, N, TILE):
        rows = min(TILE, N - r0)
        yt = nl.load(y[r0:r0 + rows, :])
        gt = nl.load(g[r0:r0 + rows, :])
        prod = nl.ndarray((rows, D), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=prod, data1=gt, data2=yt, op=nl.multiply)
        dot = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=dot, op=nl.add, data=prod, axis=1)
        o = nl.ndarray((rows, D), dtype=y.dtype, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=o, data=gt, op0=nl.subtract, operand0=dot, op1=nl.multiply, operand1=yt)
        nl.store(dx[r0:r0 + rows, :], o)
    return dx
