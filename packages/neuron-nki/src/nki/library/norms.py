"""RMSNorm and LayerNorm over the last dim of x [N, D], forward and backward, 128 rows per tile (ragged N).

Forwards return the per-row statistics the backwards need (``rstd``, and ``mean`` for LayerNorm, fp32 [N, 1]),
as ``aten::_fused_rms_norm`` / ``aten::native_layer_norm`` do. Weight/bias gradients are sums over rows: each tile
adds into a [128, D] SBUF accumulator and one partition reduction (GpSimd) finishes them.
"""

from __future__ import annotations

import nki
import nki.isa as nisa
import nki.language as nl

TILE = 128


def _rows(n: int):
    return [(t * TILE, min(TILE, n - t * TILE)) for t in range((n + TILE - 1) // TILE)]


def _load_rows(r0: int, rows: int, *tensors):
    """Rows ``r0 .. r0 + rows`` of each [N, ...] HBM tensor, loaded to SBUF (one DMA each, in order)."""
    return tuple(nl.load(t[r0:r0 + rows, :]) for t in tensors)


def _broadcast(w, rows: int, D: int):
    """A [D] HBM vector over ``rows`` partitions (partition-broadcast DMA), fp32."""
    t = nl.ndarray((rows, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=w.reshape((1, D)).broadcast_to((rows, D)))
    return t


def _zeros(shape):
    t = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=0.0)
    return t


def rms_normalise(xt, wt, eps: float, dtype):
    """RMSNorm of a [rows, D] SBUF row tile: ``x * rstd * w`` as a new tile of ``dtype``, and
    ``rstd = 1 / sqrt(mean(x², free axis) + eps)`` as a [rows, 1] fp32 tile. One Scalar instruction squares and sums
    each row, one scales by 1/D and adds ``eps``, one takes the rsqrt, and one multiplies by rstd and the weight
    tile ``wt`` (at least ``rows`` partitions). Shared by this kernel and the RMSNorm tutorial."""
    rows, D = xt.shape
    sq = nl.ndarray((rows, D), dtype=nl.float32, buffer=nl.sbuf)
    ss = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation_reduce(dst=sq, op=nl.square, data=xt, reduce_op=nl.add, reduce_res=ss)
    rstd = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=rstd, data=ss, op0=nl.multiply, operand0=1.0 / D, op1=nl.add, operand1=eps)
    nisa.activation(dst=rstd, op=nl.rsqrt, data=rstd)
    o = nl.ndarray((rows, D), dtype=dtype, buffer=nl.sbuf)
    nisa.scalar_tensor_tensor(dst=o, data=xt, op0=nl.multiply, operand0=rstd, op1=nl.multiply,
                              operand1=wt[0:rows, :])
    return o, rstd


def _row_sums_to_hbm(acc, dst) -> None:
    """Sum a [128, D] accumulator over partitions into the [D] HBM vector ``dst``."""
    D = acc.shape[1]
    s = nl.ndarray((1, D), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_partition_reduce(dst=s, op=nl.add, data=acc)
    r = nl.ndarray((1, D), dtype=dst.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=r, src=s)
    nl.store(dst.reshape((1, D)), r)


@nki.jit
def rmsnorm_fwd(x, w, eps: float):
    """out = x · rstd · w with rstd = 1/sqrt(mean(x², -1) + eps); returns (out [N, D], rstd [N, 1] fp32)."""
    N, D = x.shape
    out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    rstd_out = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    wt = _broadcast(w, TILE, D)
    for r0, rows in _rows(N):
        xt = nl.load(x[r0:r0 + rows, :])
        o, rstd = rms_normalise(xt, wt, eps, x.dtype)
        nl.store(out[r0:r0 + rows, :], o)
        nl.store(rstd_out[r0:r0 + rows, :], rstd)
    return out, rstd_out


@nki.jit
def rmsnorm_bwd(g, x, rstd, w):
    """dx = rstd·(g·w) − x·rstd³·mean(g·w·x); dw = Σ_rows g·x·rstd. Returns (dx [N, D], dw [D])."""
    N, D = x.shape
    dx = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    dw = nl.ndarray((D,), dtype=w.dtype, buffer=nl.shared_hbm)
    wt = _broadcast(w, TILE, D)
    dw_acc = _zeros((TILE, D))
    for r0, rows in _rows(N):
        xt, gt, r = _load_rows(r0, rows, x, g, rstd)
        gw = nl.ndarray((rows, D), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=gw, data1=gt, data2=wt[0:rows, :], op=nl.multiply)
        prod = nl.ndarray((rows, D), dtype=nl.float32, buffer=nl.sbuf)
        dot = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=prod, data1=gw, data2=xt, op=nl.multiply)
        nisa.tensor_reduce(dst=dot, op=nl.add, data=prod, axis=1)
        # coef = -mean(g·w·x)·rstd³
        coef = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=coef, data1=r, data2=r, op=nl.multiply)
        nisa.tensor_tensor(dst=coef, data1=coef, data2=r, op=nl.multiply)
        nisa.tensor_tensor(dst=coef, data1=coef, data2=dot, op=nl.multiply)
        nisa.tensor_scalar(dst=coef, data=coef, op0=nl.multiply, operand0=-1.0 / D)
        t = nl.ndarray((rows, D), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=t, data=xt, op0=nl.multiply, operand0=coef)
        o = nl.ndarray((rows, D), dtype=x.dtype, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=o, data=gw, op0=nl.multiply, operand0=r, op1=nl.add, operand1=t)
        nl.store(dx[r0:r0 + rows, :], o)
        gxr = nl.ndarray((rows, D), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=gxr, data=xt, op0=nl.multiply, operand0=r, op1=nl.multiply, operand1=gt)
        nisa.tensor_tensor(dst=dw_acc[0:rows, :], data1=dw_acc[0:rows, :], data2=gxr, op=nl.add)
    _row_sums_to_hbm(dw_acc, dw)
    return dx, dw


@nki.jit
def layernorm_fwd(x, gamma, beta, eps: float):
    """out = (x − mean)·rstd·gamma + beta (bn_stats/bn_aggr statistics); returns (out, mean [N,1], rstd [N,1])."""
    N, D = x.shape
    FMAX = nl.tile_size.bn_stats_fmax
    nchunks = (D + FMAX - 1) // FMAX
    out = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    mean_out = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    rstd_out = nl.ndarray((N, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    g = _broadcast(gamma, TILE, D)
    b = _broadcast(beta, TILE, D)
    for r0, rows in _rows(N):
        xt = nl.load(x[r0:r0 + rows, :])
        stats = nl.ndarray((rows, 6 * nchunks), dtype=nl.float32, buffer=nl.sbuf)
        for c in range(nchunks):
            nisa.bn_stats(dst=stats[:, c * 6:(c + 1) * 6], data=xt[:, c * FMAX:min((c + 1) * FMAX, D)])
        mv = nl.ndarray((rows, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=mv, data=stats)
        rstd = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=rstd, data=mv[:, 1:2], op0=nl.add, operand0=eps, op1=nl.rsqrt, operand1=None,
                           engine=nisa.engine.gpsimd)
        y = nl.ndarray((rows, D), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=xt, op0=nl.subtract, operand0=mv[:, 0:1], op1=nl.multiply, operand1=rstd)
        nisa.tensor_tensor(dst=y, data1=y, data2=g[0:rows, :], op=nl.multiply)
        o = nl.ndarray((rows, D), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=o, data1=y, data2=b[0:rows, :], op=nl.add)
        nl.store(out[r0:r0 + rows, :], o)
        nl.store(mean_out[r0:r0 + rows, :], mv[:, 0:1])
        nl.store(rstd_out[r0:r0 + rows, :], rstd)
    return out, mean_out, rstd_out


@nki.jit
def layernorm_bwd(g, x, mean, rstd, gamma):
    """x̂ = (x − mean)·rstd, ĝ = g·gamma: dx = rstd·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂)); dgamma = Σ g·x̂, dbeta = Σ g."""
    N, D = x.shape
    dx = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    dgamma = nl.ndarray((D,), dtype=gamma.dtype, buffer=nl.shared_hbm)
    dbeta = nl.ndarray((D,), dtype=gamma.dtype, buffer=nl.shared_hbm)
    gam = _broadcast(gamma, TILE, D)
    dg_acc = _zeros((TILE, D))
    db_acc = _zeros((TILE, D))
    for r0, rows in _rows(N):
        xt, gt, r = _load_rows(r0, rows, x, g, rstd)
        xhat = nl.ndarray((rows, D), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=xhat, data=xt, op0=nl.subtract, operand0=nl.load(mean[r0:r0 + rows, :]),
                           op1=nl.multiply, operand1=r)
        gh = nl.ndarray((rows, D), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=gh, data1=gt, data2=gam[0:rows, :], op=nl.multiply)
        mean_gh = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=mean_gh, op=nl.add, data=gh, axis=1)
        nisa.tensor_scalar(dst=mean_gh, data=mean_gh, op0=nl.multiply, operand0=1.0 / D)
        prod = nl.ndarray((rows, D), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=prod, data1=gh, data2=xhat, op=nl.multiply)
        mean_ghx = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=mean_ghx, op=nl.add, data=prod, axis=1)
        nisa.tensor_scalar(dst=mean_ghx, data=mean_ghx, op0=nl.multiply, operand0=1.0 / D)
        t = nl.ndarray((rows, D), dtype=nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=t, data=xhat, op0=nl.multiply, operand0=mean_ghx, op1=nl.subtract,
                                  operand1=gh, reverse1=True)  # gh - x̂·mean(ĝx̂)
        o = nl.ndarray((rows, D), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=o, data=t, op0=nl.subtract, operand0=mean_gh, op1=nl.multiply, operand1=r)
        nl.store(dx[r0:r0 + rows, :], o)
        gx = nl.ndarray((rows, D), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=gx, data1=gt, data2=xhat, op=nl.multiply)
        nisa.tensor_tensor(dst=dg_acc[0:rows, :], data1=dg_acc[0:rows, :], data2=gx, op=nl.add)
        nisa.tensor_tensor(dst=db_acc[0:rows, :], data1=db_acc[0:rows, :], data2=gt, op=nl.add)
    _row_sums_to_hbm(dg_acc, dgamma)
    _row_sums_to_hbm(db_acc, dbeta)
    return dx, dgamma, dbeta
