"""Fused self-attention softmax(QKᵀ/√d)·V and rotary position embedding, current NKI API."""

from __future__ import annotations

import math

import nki
import nki.isa as nisa
import nki.language as nl
from nki.library.softmax import divide_by_row_sums, negated_row_max


@nki.jit
def fused_self_attention(qT, kT, v):
    """qT, kT: [d, S] (head dim on partitions), v: [S, d]; S a multiple of 128, d ≤ 128. Returns [S, d]."""
    d, S = qT.shape
    KB = 512  # keys per score matmul (moving free size)
    out = nl.ndarray((S, d), dtype=v.dtype, buffer=nl.shared_hbm)
    k_sb = nl.load(kT)
    v_tiles = []
    for j in nl.affine_range(S // 128):
        v_tiles.append(nl.load(v[j * 128:(j + 1) * 128, :]))
    for i in nl.affine_range(S // 128):
        q_sb = nl.load(qT[:, i * 128:(i + 1) * 128])
        scores = nl.ndarray((128, S), dtype=nl.float32, buffer=nl.sbuf)
        for kb in nl.affine_range((S + KB - 1) // KB):
            c0 = kb * KB
            w = min(KB, S - c0)
            ps = nl.ndarray((128, w), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=ps, stationary=q_sb, moving=k_sb[:, c0:c0 + w])
            nisa.tensor_copy(dst=scores[:, c0:c0 + w], src=ps)
        neg_max = negated_row_max(scores)
        scale = 1.0 / math.sqrt(d)
        nisa.tensor_scalar(dst=neg_max, data=neg_max, op0=nl.multiply, operand0=scale)
        probs = nl.ndarray((128, S), dtype=v.dtype, buffer=nl.sbuf)
        denom = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=probs, op=nl.exp, data=scores, bias=neg_max, scale=scale, reduce_op=nl.add,
                        reduce_res=denom, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        acc = nl.ndarray((128, d), dtype=nl.float32, buffer=nl.psum)
        for j in nl.affine_range(S // 128):
            pT_ps = nl.ndarray((128, 128), dtype=v.dtype, buffer=nl.psum)
            nisa.nc_transpose(dst=pT_ps, data=probs[:, j * 128:(j + 1) * 128])
            pT = nl.ndarray((128, 128), dtype=v.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=pT, src=pT_ps)
            nisa.nc_matmul(dst=acc, stationary=pT, moving=v_tiles[j])
        nl.store(out[i * 128:(i + 1) * 128, :], divide_by_row_sums(acc, denom, v.dtype))
    return out


@nki.jit
def rotary_embedding(x, cos, sin):
    """x: [S, D] (D even), cos/sin: [S, D/2]. Rotates halves: [x1·c − x2·s, x2·c + x1·s]."""
    S, D = x.shape
    H = D // 2
    out = nl.ndarray((S, D), dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range((S + 127) // 128):
        r0 = i * 128
        rows = min(128, S - r0)
        xt = nl.load(x[r0:r0 + rows, :])
        c = nl.load(cos[r0:r0 + rows, :])
        s = nl.load(sin[r0:r0 + rows, :])
        x1, x2 = xt[:, 0:H], xt[:, H:D]
        a = nl.ndarray((rows, H), dtype=nl.float32, buffer=nl.sbuf)
        b = nl.ndarray((rows, H), dtype=nl.float32, buffer=nl.sbuf)
        o = nl.ndarray((rows, D), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=a, data1=x1, data2=c, op=nl.multiply)
        nisa.tensor_tensor(dst=b, data1=x2, data2=s, op=nl.multiply)
        nisa.tensor_tensor(dst=o[:, 0:H], data1=a, data2=b, op=nl.subtract)
        nisa.tensor_tensor(dst=a, data1=x2, data2=c, op=nl.multiply)
        nisa.tensor_tensor(dst=b, data1=x1, data2=s, op=nl.multiply)
        nisa.tensor_tensor(dst=o[:, H:D], data1=a, data2=b, op=nl.add)
        nl.store(out[r0:r0 + rows, :], o)
    return out
