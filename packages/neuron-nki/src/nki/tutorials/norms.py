"""RMSNorm, LayerNorm (v1: reductions and rsqrt; v2: bn_stats/bn_aggr) and row softmax over [N, D] tensors, 128
rows per tile."""

from __future__ import annotations

import nki
import nki.isa as nisa
import nki.language as nl
from nki.library.norms import rms_normalise
from nki.library.softmax import divide_by_row_sums, negated_row_max


def _weight_tile(w, rows: int, D: int, dtype=nl.float32):
    """Broadcast a [D] HBM vector over ``rows`` partitions (a partition-broadcast DMA)."""
    t = nl.ndarray((rows, D), dtype=dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=w.reshape((1, D)).broadcast_to((rows, D)))
    return t


def _row_tiles(N: int):
    """(first row, row count) of each 128-row tile of ``N`` rows, the last one possibly partial (an affine loop)."""
    for i in nl.affine_range((N + 127) // 128):
        r0 = i * 128
        yield r0, min(128, N - r0)


def _normalise(dst, xt, mean, var, eps: float, gamma, beta) -> None:
    """Store ``(x - mean) * rsqrt(var + eps) * gamma + beta`` for one row tile in ``dst``: the two LayerNorm versions
    differ only in how they compute ``mean`` and ``var`` ([rows, 1] fp32 tiles)."""
    rows, D = xt.shape
    rstd = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=rstd, data=var, op0=nl.add, operand0=eps, op1=nl.rsqrt, operand1=None,
                       engine=nisa.engine.gpsimd)
    y = nl.ndarray((rows, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=y, data=xt, op0=nl.subtract, operand0=mean, op1=nl.multiply, operand1=rstd)
    nisa.tensor_tensor(dst=y, data1=y, data2=gamma, op=nl.multiply)
    o = nl.ndarray((rows, D), dtype=dst.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=o, data1=y, data2=beta, op=nl.add)
    nl.store(dst, o)


@nki.jit
def rmsnorm(x, w, eps: float = 1e-6):
    """out = x / sqrt(mean(x², -1) + eps) * w."""
    N, D = x.shape
    out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    wt = _weight_tile(w, 128, D)
    for r0, rows in _row_tiles(N):
        xt = nl.load(x[r0:r0 + rows, :])
        y, _ = rms_normalise(xt, wt, eps, nl.float32)
        o = nl.ndarray((rows, D), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=o, src=y)
        nl.store(out[r0:r0 + rows, :], o)
    return out


@nki.jit
def layernorm_v1(x, gamma, beta, eps: float = 1e-5):
    """The tutorial's first version: mean and mean of squares by free-axis reductions, ``rsqrt(E[x²] - E[x]² + eps)``."""
    N, D = x.shape
    out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    g = _weight_tile(gamma, 128, D)
    b = _weight_tile(beta, 128, D)
    for r0, rows in _row_tiles(N):
        xt = nl.load(x[r0:r0 + rows, :])
        mean = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=mean, op=nl.add, data=xt, axis=1)
        nisa.tensor_scalar(dst=mean, data=mean, op0=nl.multiply, operand0=1.0 / D)
        sq = nl.ndarray((rows, D), dtype=nl.float32, buffer=nl.sbuf)
        msq = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(dst=sq, op=nl.square, data=xt, reduce_op=nl.add, reduce_res=msq)
        var = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=var, data1=mean, data2=mean, op=nl.multiply)
        nisa.scalar_tensor_tensor(dst=var, data=msq, op0=nl.multiply, operand0=1.0 / D, op1=nl.subtract,
                                  operand1=var)
        _normalise(out[r0:r0 + rows, :], xt, mean, var, eps, g[0:rows, :], b[0:rows, :])
    return out


@nki.jit
def layernorm(x, gamma, beta, eps: float = 1e-5):
    """The tutorial's second version: out = (x - mean) / sqrt(var + eps) * gamma + beta, statistics from
    bn_stats/bn_aggr."""
    N, D = x.shape
    FMAX = nl.tile_size.bn_stats_fmax
    nchunks = (D + FMAX - 1) // FMAX
    out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    g = _weight_tile(gamma, 128, D)
    b = _weight_tile(beta, 128, D)
    for r0, rows in _row_tiles(N):
        xt = nl.load(x[r0:r0 + rows, :])
        stats = nl.ndarray((rows, 6 * nchunks), dtype=nl.float32, buffer=nl.sbuf)
        for c in nl.affine_range(nchunks):
            c0 = c * FMAX
            nisa.bn_stats(dst=stats[:, c * 6:(c + 1) * 6], data=xt[:, c0:min(c0 + FMAX, D)])
        mv = nl.ndarray((rows, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=mv, data=stats)
        _normalise(out[r0:r0 + rows, :], xt, mv[:, 0:1], mv[:, 1:2], eps, g[0:rows, :], b[0:rows, :])
    return out


@nki.jit
def softmax(x):
    """Row softmax: exp(x - max) / sum(exp(x - max))."""
    N, D = x.shape
    out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    for r0, rows in _row_tiles(N):
        xt = nl.load(x[r0:r0 + rows, :])
        neg_max = negated_row_max(xt)
        e = nl.ndarray((rows, D), dtype=nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=e, op=nl.exp, data=xt, bias=neg_max, reduce_op=nl.add, reduce_res=s,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nl.store(out[r0:r0 + rows, :], divide_by_row_sums(e, s, x.dtype))
    return out
