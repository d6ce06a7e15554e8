"""Fused self-attention for small head sizes (``softmax(Q Kᵀ · scale) V``), one 128-query tile at a time.

Follows the legacy tutorial's structure: Q and K loaded transposed (head dim on partitions), scores in PSUM,
optional causal mask with ``nisa.affine_select`` on index-expression predicates, max with ``tensor_reduce``,
exp with a fused bias on the Scalar Engine, probabilities transposed on the Tensor Engine for the PV matmul,
and the [d_head, 128] result stored transposed through an index expression.
"""

from __future__ import annotations

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from neuronxcc.nki.language import par_dim


@nki.jit
def fused_self_attn_kernel(q_ref, k_ref, v_ref, use_causal_mask: bool = False, mixed_precision: bool = True):
    """``q``, ``k``, ``v``: [seqlen, d_head] with seqlen % 128 == 0 and d_head ≤ 128; returns [seqlen, d_head]."""
    kernel_dtype = q_ref.dtype
    pe_in_dt = nl.bfloat16 if mixed_precision else np.float32
    seqlen, d_head = q_ref.shape
    out_ref = nl.ndarray((seqlen, d_head), dtype=q_ref.dtype, buffer=nl.shared_hbm)
    softmax_scale = 1.0 / float(np.sqrt(d_head))
    tile = 128
    n_tiles = seqlen // tile

    ip_v = nl.arange(tile)[:, None]
    if_v = nl.arange(d_head)[None, :]
    trans_v = nl.ndarray((par_dim(tile), n_tiles, d_head), dtype=pe_in_dt)
    for j in nl.affine_range(n_tiles):
        trans_v[ip_v, j, if_v] = nl.load(v_ref[j * tile + ip_v, if_v], dtype=pe_in_dt)

    ip_qk = nl.arange(d_head)[:, None]
    if_qk = nl.arange(tile)[None, :]
    q_local = nl.ndarray((par_dim(d_head), n_tiles, tile), dtype=pe_in_dt)
    k_local = nl.ndarray((par_dim(d_head), n_tiles, tile), dtype=pe_in_dt)
    for j in nl.affine_range(n_tiles):
        rows = j * tile + nl.arange(tile)[:, None]
        q_local[ip_qk, j, if_qk] = nl.load_transpose2d(q_ref[rows, if_v], dtype=pe_in_dt) * softmax_scale
        k_local[ip_qk, j, if_qk] = nl.load_transpose2d(k_ref[rows, if_v], dtype=pe_in_dt)

    ip_s = nl.arange(tile)[:, None]
    if_s = nl.arange(tile)[None, :]
    if_all = nl.arange(seqlen)[None, :]
    for i in nl.affine_range(n_tiles):
        qk_res_buf = nl.ndarray((par_dim(tile), seqlen), dtype=kernel_dtype)
        neg_max_res = nl.ndarray((par_dim(tile), n_tiles), dtype=kernel_dtype)
        for j in nl.affine_range(n_tiles):
            qk_psum = nl.ndarray((par_dim(tile), tile), dtype=np.float32, buffer=nl.psum)
            qk_psum[ip_s, if_s] += nisa.nc_matmul(moving=k_local[ip_qk, j, if_qk], stationary=q_local[ip_qk, i, if_qk])
            if use_causal_mask:
                qk_res_buf[ip_s, j * tile + if_s] = nisa.affine_select(
                    pred=(i * tile + ip_s >= j * tile + if_s), on_true_tile=qk_psum[ip_s, if_s],
                    on_false_value=-9984.0, dtype=kernel_dtype)
            else:
                qk_res_buf[ip_s, j * tile + if_s] = nl.copy(qk_psum[ip_s, if_s], dtype=kernel_dtype)
            neg_max_res[ip_s, j] = nisa.tensor_reduce(np.max, data=qk_res_buf[ip_s, j * tile + if_s], axis=(1,),
                                                      dtype=kernel_dtype, negate=True)
        neg_max = nisa.tensor_reduce(np.min, data=neg_max_res, axis=(1,), dtype=kernel_dtype)
        exp_res = nisa.activation(np.exp, data=qk_res_buf[ip_s, if_all], bias=neg_max, scale=1.0)
        sum_res = nisa.tensor_reduce(np.add, data=exp_res, axis=(1,), dtype=kernel_dtype)
        softmax_res = nl.ndarray((par_dim(tile), seqlen), dtype=pe_in_dt)
        softmax_res[ip_s, if_all] = nl.multiply(exp_res, (1.0 / sum_res).broadcast_to((tile, seqlen)), dtype=pe_in_dt)

        trans_softmax = nl.ndarray((par_dim(tile), n_tiles, tile), dtype=pe_in_dt)
        for j in nl.affine_range(n_tiles):
            trans_softmax[ip_s, j, if_s] = nisa.nc_transpose(softmax_res[ip_s, j * tile + if_s])

        ip_out = nl.arange(d_head)[:, None]
        if_out = nl.arange(tile)[None, :]
        attn_psum = nl.zeros((par_dim(d_head), tile), dtype=np.float32, buffer=nl.psum)
        for j in nl.affine_range(n_tiles):
            attn_psum[ip_out, if_out] += nisa.nc_matmul(moving=trans_softmax[ip_s, j, if_s],
                                                        stationary=trans_v[ip_v, j, if_v])
        attn_sbuf = nl.copy(attn_psum[ip_out, if_out], dtype=kernel_dtype)
        nl.store(out_ref[i * tile + if_out, ip_out], value=attn_sbuf)
    return out_ref
