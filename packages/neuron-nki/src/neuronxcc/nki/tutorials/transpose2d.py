"""Transpose the two free dimensions of a [P, F1*F2] tensor with 3-D index expressions (no Tensor Engine)."""

from __future__ import annotations

import neuronxcc.nki as nki
import neuronxcc.nki.language as nl


@nki.jit
def tensor_transpose2d_kernel(in_tensor, shape2d):
    """``out[p, f2*F1 + f1] = in[p, f1*F2 + f2]`` for ``shape2d = (F1, F2)``."""
    out_tensor = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
    sz_p, _ = in_tensor.shape
    sz_f1, sz_f2 = shape2d
    i_p0 = nl.arange(sz_p)[:, None, None]
    i_f0 = nl.arange(sz_f1)[None, :, None]
    i_f1 = nl.arange(sz_f2)[None, None, :]
    in_tile = nl.ndarray(shape=(sz_p, sz_f1 * sz_f2), dtype=in_tensor.dtype)
    in_tile[:] = nl.load(in_tensor)
    out_tile = nl.ndarray(shape=(sz_p, sz_f2 * sz_f1), dtype=out_tensor.dtype)
    out_tile[i_p0, i_f1 * sz_f1 + i_f0] = nl.copy(in_tile[i_p0, i_f0 * sz_f2 + i_f1])
    nl.store(out_tensor, value=out_tile)
    return out_tensor
