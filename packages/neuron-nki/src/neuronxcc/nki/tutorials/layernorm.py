"""LayerNorm, two versions as in the legacy tutorial.

* ``layernorm_kernel_v1``: ``nl`` only (mean, mean of squares, rsqrt), indices from one 3-D ``nl.mgrid`` whose
  size-1 axis addresses the [1, N] parameter rows;
* ``layernorm_kernel``: ``nisa.bn_stats``/``bn_aggr`` in ≤512-column chunks, ragged rows and columns masked.
"""

from __future__ import annotations

import math

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@nki.jit
def layernorm_kernel_v1(input_tensor, epsilon, gamma_vector, beta_vector):
    """``(x - mean) * rsqrt(mean(x²) - mean² + eps) * gamma + beta`` with ``nl`` operations only."""
    output_tensor = nl.ndarray(input_tensor.shape, dtype=input_tensor.dtype, buffer=nl.shared_hbm)
    num_rows, num_cols = input_tensor.shape
    i_p, i_f, i_param = nl.mgrid[0:nl.tile_size.pmax, 0:num_cols, 0:1]
    gamma = nl.load(gamma_vector.reshape((1, num_cols))[i_param, i_f]).broadcast_to((nl.tile_size.pmax, num_cols))
    beta = nl.load(beta_vector.reshape((1, num_cols))[i_param, i_f]).broadcast_to((nl.tile_size.pmax, num_cols))
    for i in nl.affine_range(math.ceil(num_rows / nl.tile_size.pmax)):
        rows = i * nl.tile_size.pmax + i_p < num_rows
        x = nl.load(input_tensor[i * nl.tile_size.pmax + i_p, i_f], mask=rows)
        mean = nl.mean(x, axis=1)
        var = nl.mean(nl.square(x), axis=1) - mean * mean
        y = (x - mean) * nl.rsqrt(var + epsilon) * gamma + beta
        nl.store(output_tensor[i * nl.tile_size.pmax + i_p, i_f], value=y, mask=rows)
    return output_tensor


@nki.jit
def layernorm_kernel(input_tensor, epsilon, gamma_vector, beta_vector):
    """``(x - mean) / sqrt(var + eps) * gamma + beta`` per row."""
    output_tensor = nl.ndarray(input_tensor.shape, dtype=input_tensor.dtype, buffer=nl.shared_hbm)
    num_rows, num_cols = input_tensor.shape
    i_p_io = nl.arange(128)[:, None]
    i_f_io = nl.arange(num_cols)[None, :]
    i_p_param = nl.arange(1)[:, None]
    gamma_sb = nl.load(gamma_vector.reshape((1, num_cols))[i_p_param, i_f_io])
    beta_sb = nl.load(beta_vector.reshape((1, num_cols))[i_p_param, i_f_io])
    bn_fmax = nl.tile_size.bn_stats_fmax
    n_chunks = math.ceil(num_cols / bn_fmax)
    for i in nl.affine_range(math.ceil(num_rows / 128)):
        row_mask = i * 128 + i_p_io < num_rows
        input_sb = nl.load(input_tensor[i * 128 + i_p_io, i_f_io], mask=row_mask)
        stats = nl.ndarray((128, 6 * n_chunks), dtype=np.float32)
        i_f_stats = nl.arange(6)[None, :]
        for j in nl.affine_range(n_chunks):
            i_f_chunk = j * bn_fmax + nl.arange(bn_fmax)[None, :]
            stats[i_p_io, j * 6 + i_f_stats] = nisa.bn_stats(input_sb[i_p_io, i_f_chunk],
                                                             mask=row_mask & (i_f_chunk < num_cols),
                                                             dtype=np.float32)
        mean_var = nisa.bn_aggr(stats, mask=row_mask)
        mean = mean_var[i_p_io, 0]
        var = mean_var[i_p_io, 1]
        rstd = nl.rsqrt(var + epsilon, mask=row_mask)
        normed = nisa.tensor_scalar(input_sb, op0=np.subtract, operand0=mean, op1=np.multiply, operand1=rstd,
                                    mask=row_mask)
        scaled = nl.multiply(normed, gamma_sb.broadcast_to((128, num_cols)), mask=row_mask)
        out = nl.add(scaled, beta_sb.broadcast_to((128, num_cols)), mask=row_mask, dtype=output_tensor.dtype)
        nl.store(output_tensor[i * 128 + i_p_io, i_f_io], value=out, mask=row_mask)
    return output_tensor
