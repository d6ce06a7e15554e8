"""Flash attention forward and backward (FlashAttention-2 tiling), current NKI API.

Layout: ``q`` [B, H, Sq, d], ``k``/``v`` [B, Hkv, Sk, d] with H a multiple of Hkv (grouped-query attention);
d ≤ 128, any Sq/Sk (ragged last tiles). Transposed operands (``qT`` = q with its last two dims swapped, etc.) are
strided views of the same HBM tensors, so the Tensor Engine gets head-dim-on-partition tiles without copies.
Masks: ``causal`` keeps key j ≤ query i (top-left aligned, as ``torch.nn.functional.scaled_dot_product_attention``);
``window > 0`` additionally keeps only i - window < j (sliding window). Tiles that are fully masked are skipped.
``lse`` is the logsumexp of each query row of the scaled scores (what the backward pass needs), stored [B, Sq, H]
as torch's CPU kernel stores it.
Launch grids: forward ``[B, H]`` (one query head per instance), backward ``[B, Hkv]`` (an instance owns one KV
head and sums the dK/dV contributions of its query-head group).
"""

from __future__ import annotations

import nki
import nki.isa as nisa
import nki.language as nl

from .softmax import divide_by_row_sums

TILE = 128
NEG = -1.0e30  # masked score: exp(NEG - m) underflows to 0 for any reachable row maximum m


def _tiles(n: int):
    """(start, size) of the 128-row tiles covering n rows (the last one ragged)."""
    return [(t * TILE, min(TILE, n - t * TILE)) for t in range((n + TILE - 1) // TILE)]


def _visible(q0: int, rows: int, k0: int, kw: int, causal: bool, window: int) -> bool:
    """Whether any (query, key) pair of the tile pair survives the masks."""
    if causal and k0 > q0 + rows - 1:
        return False
    return not (window and k0 + kw - 1 <= q0 - window)


def _mask(s, q0: int, rows: int, k0: int, kw: int, causal: bool, window: int) -> None:
    """Set masked scores of tile ``s`` [rows, kw] to NEG (GpSimd affine_select on j - i)."""
    if causal and k0 + kw - 1 > q0:
        nisa.affine_select(dst=s, pattern=[[1, kw]], channel_multiplier=-1, on_true_tile=s, on_false_value=NEG,
                           cmp_op=nl.less_equal, offset=k0 - q0)
    if window and k0 <= q0 + rows - 1 - window:
        nisa.affine_select(dst=s, pattern=[[1, kw]], channel_multiplier=-1, on_true_tile=s, on_false_value=NEG,
                           cmp_op=nl.greater, offset=k0 - q0 + window)


def _scores(qT_sb, kT_sb, rows: int, kw: int, scale: float, q0: int, k0: int, causal: bool, window: int):
    """Scaled, masked scores q·kᵀ·scale of one tile pair, fp32 in SBUF."""
    ps = nl.ndarray((rows, kw), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=ps, stationary=qT_sb, moving=kT_sb)
    s = nl.ndarray((rows, kw), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=s, data=ps, op0=nl.multiply, operand0=scale)
    _mask(s, q0, rows, k0, kw, causal, window)
    return s


def _transpose(x, dtype):
    """[P, F] SBUF tile → [F, P] SBUF tile through the Tensor Engine."""
    p, f = x.shape
    ps = nl.ndarray((f, p), dtype=x.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=ps, data=x)
    t = nl.ndarray((f, p), dtype=dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=t, src=ps)
    return t


@nki.jit
def flash_attention_fwd(qT, kT, v, scale: float, causal: bool = False, window: int = 0, bshd: bool = False):
    """qT [B, H, d, Sq], kT [B, Hkv, d, Sk], v [B, Hkv, Sk, d] → (out [B, H, Sq, d], lse [B, Sq, H, 1] fp32);
    ``bshd=True`` stores out as [B, Sq, H, d] (the layout torch's CPU kernel gives a transposed query)."""
    B, H, d, Sq = qT.shape
    Hkv, Sk = kT.shape[1], kT.shape[3]
    b, h = nl.program_id(0), nl.program_id(1)
    hk = h // (H // Hkv)
    out = nl.ndarray((B, Sq, H, d) if bshd else (B, H, Sq, d), dtype=v.dtype, buffer=nl.shared_hbm)
    lse = nl.ndarray((B, Sq, H, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    for q0, rows in _tiles(Sq):
        q_sb = nl.load(qT[b, h, :, q0:q0 + rows])
        m = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=m, value=NEG)
        denom = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=denom, value=0.0)
        acc = nl.ndarray((rows, d), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        for k0, kw in _tiles(Sk):
            if not _visible(q0, rows, k0, kw, causal, window):
                continue
            k_sb = nl.load(kT[b, hk, :, k0:k0 + kw])
            v_sb = nl.load(v[b, hk, k0:k0 + kw, :])
            s = _scores(q_sb, k_sb, rows, kw, scale, q0, k0, causal, window)
            m_new = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_reduce(dst=m_new, op=nl.maximum, data=s, axis=1)
            nisa.tensor_tensor(dst=m_new, data1=m_new, data2=m, op=nl.maximum)
            neg_m = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=neg_m, data=m_new, op0=nl.multiply, operand0=-1.0)
            p = nl.ndarray((rows, kw), dtype=v.dtype, buffer=nl.sbuf)
            rowsum = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation_reduce(dst=p, op=nl.exp, data=s, reduce_op=nl.add, reduce_res=rowsum, bias=neg_m)
            alpha = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.activation(dst=alpha, op=nl.exp, data=m, bias=neg_m)
            nisa.scalar_tensor_tensor(dst=denom, data=denom, op0=nl.multiply, operand0=alpha, op1=nl.add,
                                      operand1=rowsum)
            pv = nl.ndarray((rows, d), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=pv, stationary=_transpose(p, v.dtype), moving=v_sb)
            nisa.scalar_tensor_tensor(dst=acc, data=acc, op0=nl.multiply, operand0=alpha, op1=nl.add, operand1=pv)
            nisa.tensor_copy(dst=m, src=m_new)
        o = divide_by_row_sums(acc, denom, v.dtype)
        nl.store(out[b, q0:q0 + rows, h, :] if bshd else out[b, h, q0:q0 + rows, :], o)
        row_lse = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=row_lse, op=nl.log, data=denom)
        nisa.tensor_tensor(dst=row_lse, data1=row_lse, data2=m, op=nl.add)
        nl.store(lse[b, q0:q0 + rows, h, :], row_lse)
    return out, lse


@nki.jit
def flash_attention_bwd(q, qT, k, kT, vT, o, do, doT, lse, scale: float, causal: bool = False, window: int = 0,
                        bshd: bool = False):
    """Gradients of :func:`flash_attention_fwd`: q/o/do [B, H, Sq, d] (+ transposed views qT/doT [B, H, d, Sq]),
    k [B, Hkv, Sk, d] (+ kT, vT [B, Hkv, d, Sk]), lse [B, H, Sq, 1] (a view: forward's lse transposed) → (dq, dk, dv), each [B, S, heads, d] when
    ``bshd`` (torch's CPU layout for these gradients), else [B, heads, S, d]."""
    B, H, Sq, d = q.shape
    Hkv, Sk = k.shape[1], k.shape[2]
    group = H // Hkv
    b, hk = nl.program_id(0), nl.program_id(1)
    dq = nl.ndarray((B, Sq, H, d) if bshd else (B, H, Sq, d), dtype=q.dtype, buffer=nl.shared_hbm)
    dk = nl.ndarray((B, Sk, Hkv, d) if bshd else (B, Hkv, Sk, d), dtype=k.dtype, buffer=nl.shared_hbm)
    dv = nl.ndarray((B, Sk, Hkv, d) if bshd else (B, Hkv, Sk, d), dtype=vT.dtype, buffer=nl.shared_hbm)
    q_tiles = _tiles(Sq)
    # per query tile of each head of the group: D = rowsum(dO ∘ O), -lse, and the dQ accumulator
    stats = []
    for g in range(group):
        h = hk * group + g
        row = []
        for q0, rows in q_tiles:
            prod = nl.ndarray((rows, d), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=prod, data1=nl.load(do[b, h, q0:q0 + rows, :]),
                               data2=nl.load(o[b, h, q0:q0 + rows, :]), op=nl.multiply)
            dsum = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_reduce(dst=dsum, op=nl.add, data=prod, axis=1)
            neg_lse = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(dst=neg_lse, data=nl.load(lse[b, h, q0:q0 + rows, :]), op0=nl.multiply,
                               operand0=-1.0)
            dq_acc = nl.ndarray((rows, d), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=dq_acc, value=0.0)
            row.append((dsum, neg_lse, dq_acc))
        stats.append(row)
    for k0, kw in _tiles(Sk):
        kT_sb = nl.load(kT[b, hk, :, k0:k0 + kw])
        vT_sb = nl.load(vT[b, hk, :, k0:k0 + kw])
        k_sb = nl.load(k[b, hk, k0:k0 + kw, :])
        dk_acc = nl.ndarray((kw, d), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=dk_acc, value=0.0)
        dv_acc = nl.ndarray((kw, d), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=dv_acc, value=0.0)
        for g in range(group):
            h = hk * group + g
            for t, (q0, rows) in enumerate(q_tiles):
                if not _visible(q0, rows, k0, kw, causal, window):
                    continue
                dsum, neg_lse, dq_acc = stats[g][t]
                s = _scores(nl.load(qT[b, h, :, q0:q0 + rows]), kT_sb, rows, kw, scale, q0, k0, causal, window)
                p = nl.ndarray((rows, kw), dtype=nl.float32, buffer=nl.sbuf)
                nisa.activation(dst=p, op=nl.exp, data=s, bias=neg_lse)
                p_lo = nl.ndarray((rows, kw), dtype=vT.dtype, buffer=nl.sbuf)
                nisa.tensor_copy(dst=p_lo, src=p)
                do_sb = nl.load(do[b, h, q0:q0 + rows, :])
                dv_ps = nl.ndarray((kw, d), dtype=nl.float32, buffer=nl.psum)
                nisa.nc_matmul(dst=dv_ps, stationary=p_lo, moving=do_sb)
                nisa.tensor_tensor(dst=dv_acc, data1=dv_acc, data2=dv_ps, op=nl.add)
                dp_ps = nl.ndarray((rows, kw), dtype=nl.float32, buffer=nl.psum)
                nisa.nc_matmul(dst=dp_ps, stationary=nl.load(doT[b, h, :, q0:q0 + rows]), moving=vT_sb)
                ds = nl.ndarray((rows, kw), dtype=q.dtype, buffer=nl.sbuf)
                nisa.scalar_tensor_tensor(dst=ds, data=dp_ps, op0=nl.subtract, operand0=dsum, op1=nl.multiply,
                                          operand1=p)
                dk_ps = nl.ndarray((kw, d), dtype=nl.float32, buffer=nl.psum)
                nisa.nc_matmul(dst=dk_ps, stationary=ds, moving=nl.load(q[b, h, q0:q0 + rows, :]))
                nisa.scalar_tensor_tensor(dst=dk_acc, data=dk_ps, op0=nl.multiply, operand0=scale, op1=nl.add,
                                          operand1=dk_acc)
                dq_ps = nl.ndarray((rows, d), dtype=nl.float32, buffer=nl.psum)
                nisa.nc_matmul(dst=dq_ps, stationary=_transpose(ds, q.dtype), moving=k_sb)
                nisa.scalar_tensor_tensor(dst=dq_acc, data=dq_ps, op0=nl.multiply, operand0=scale, op1=nl.add,
                                          operand1=dq_acc)
        for acc, dst in ((dk_acc, dk), (dv_acc, dv)):
            t = nl.ndarray((kw, d), dtype=dst.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=t, src=acc)
            nl.store(dst[b, k0:k0 + kw, hk, :] if bshd else dst[b, hk, k0:k0 + kw, :], t)
    for g in range(group):
        for t, (q0, rows) in enumerate(q_tiles):
            r = nl.ndarray((rows, d), dtype=q.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=r, src=stats[g][t][2])
            h = hk * group + g
            nl.store(dq[b, q0:q0 + rows, h, :] if bshd else dq[b, h, q0:q0 + rows, :], r)
    return dq, dk, dv
