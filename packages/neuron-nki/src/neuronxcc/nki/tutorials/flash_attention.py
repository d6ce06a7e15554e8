"""Flash-attention forward (online softmax over 512-key blocks), in the style of the legacy reference kernel.

Per SPMD instance (batch, head) and 128-query tile, running row maxima ``m``, row sums ``l`` and the output
accumulator ``o`` live in SBUF; each key block is handled by a ``mode='trace'`` sub-kernel that rescales them
(``exp(m_old - m_new)``), adds ``exp(s - m_new)`` and its product with V. Blocks entirely above the diagonal are
skipped under the causal mask; the diagonal block is masked with ``nisa.affine_select``.
"""

from __future__ import annotations

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from neuronxcc.nki.language import par_dim

B_P = 128  # query rows per tile (partitions)
B_F = 512  # keys per block (moving free size)


@nki.jit(mode="trace")
def _attention_block(q_tile, k_tile, v_tile, o_buf, l_buf, m_buf, q_idx: int, k_idx: int, causal: bool):
    """Online-softmax update of ``o_buf`` [128, d], ``l_buf``/``m_buf`` [128, 1] with one key block."""
    qk = nl.ndarray((par_dim(B_P), B_F), dtype=np.float32, buffer=nl.psum)
    qk[...] = nl.matmul(q_tile, k_tile, transpose_x=True)
    s = nl.ndarray((par_dim(B_P), B_F), dtype=np.float32)
    if causal:
        i_q, i_k = nl.mgrid[0:B_P, 0:B_F]
        s[...] = nisa.affine_select(pred=(q_idx * B_P + i_q >= k_idx * B_F + i_k), on_true_tile=qk,
                                    on_false_value=nl.fp32.min, dtype=np.float32)
    else:
        s[...] = nl.copy(qk, dtype=np.float32)
    m_prev = nl.copy(m_buf[:, 0])
    m_buf[:, 0] = nl.maximum(m_prev, nisa.tensor_reduce(np.max, s, axis=(1,)))
    m_cur = m_buf[:, 0]
    alpha = nisa.activation(np.exp, m_cur, bias=m_prev, scale=-1.0)  # exp(m_prev - m_cur)
    row_sum = nl.ndarray((par_dim(B_P), 1), dtype=np.float32)
    p = nisa.activation_reduce(np.exp, s, bias=-1 * m_cur, reduce_op=nl.add, reduce_res=row_sum,
                               dtype=nl.bfloat16)
    l_buf[:, 0] = nl.add(nl.multiply(l_buf[:, 0], alpha), row_sum)
    p_t = nl.ndarray((par_dim(B_P), B_F // B_P, B_P), dtype=nl.bfloat16)
    for j in nl.affine_range(B_F // B_P):
        p_t[:, j, :] = nisa.nc_transpose(p[:, nl.ds(j * B_P, B_P)])
    pv = nl.zeros((par_dim(B_P), o_buf.shape[1]), dtype=np.float32, buffer=nl.psum)
    for j in nl.affine_range(B_F // B_P):
        pv += nl.matmul(p_t[:, j, :], v_tile[j], transpose_x=True)
    o_buf[...] = nl.add(nl.multiply(o_buf, alpha), pv)


@nki.jit
def flash_attention_fwd(q, k, v, use_causal_mask: bool = True):
    """``q``, ``k``: [bs, heads, d, seq]; ``v``: [bs, heads, seq, d]; launch grid [bs, heads];
    returns ``o``: [bs, heads, seq, d] (seq % 512 == 0, d ≤ 128)."""
    b, h = nl.program_id(0), nl.program_id(1)
    _, _, d, seqlen = q.shape
    o = nl.ndarray((q.shape[0], q.shape[1], seqlen, d), dtype=q.dtype, buffer=nl.shared_hbm)
    scale = 1.0 / float(np.sqrt(d))
    for i in nl.affine_range(seqlen // B_P):
        o_buf = nl.zeros((par_dim(B_P), d), dtype=np.float32)
        l_buf = nl.zeros((par_dim(B_P), 1), dtype=np.float32)
        m_buf = nl.full((par_dim(B_P), 1), fill_value=nl.fp32.min, dtype=np.float32)
        q_tile = nl.ndarray((par_dim(d), B_P), dtype=nl.bfloat16)
        q_tile[...] = nl.load(q[b, h, :, nl.ds(i * B_P, B_P)], dtype=nl.bfloat16) * scale
        for j in nl.sequential_range(seqlen // B_F):
            if not use_causal_mask or i * B_P + B_P - 1 >= j * B_F:  # skip blocks above the diagonal
                k_tile = nl.load(k[b, h, :, nl.ds(j * B_F, B_F)], dtype=nl.bfloat16)
                v_tile = nl.ndarray((B_F // B_P, par_dim(B_P), d), dtype=nl.bfloat16)
                for t in nl.affine_range(B_F // B_P):
                    v_tile[t] = nl.load(v[b, h, nl.ds(j * B_F + t * B_P, B_P), :], dtype=nl.bfloat16)
                _attention_block(q_tile, k_tile, v_tile, o_buf, l_buf, m_buf, i, j, use_causal_mask)
        nl.store(o[b, h, nl.ds(i * B_P, B_P), :], nl.multiply(o_buf, nl.reciprocal(l_buf), dtype=q.dtype))
    return o
