"""Rotary position embedding (half-split form) with index expressions selecting the two halves."""

from __future__ import annotations

import neuronxcc.nki as nki
import neuronxcc.nki.language as nl


@nki.jit
def rope_kernel(x_tensor, cos_tensor, sin_tensor):
    """For ``x`` [S, D] and ``cos``/``sin`` [S, D/2]: ``[x1*cos - x2*sin, x2*cos + x1*sin]``."""
    seqlen, d = x_tensor.shape
    half = d // 2
    out_tensor = nl.ndarray((seqlen, d), dtype=x_tensor.dtype, buffer=nl.shared_hbm)
    ip = nl.arange(128)[:, None]
    i_h = nl.arange(half)[None, :]
    for i in nl.affine_range(seqlen // 128):
        x1 = nl.load(x_tensor[i * 128 + ip, i_h])
        x2 = nl.load(x_tensor[i * 128 + ip, half + i_h])
        cos = nl.load(cos_tensor[i * 128 + ip, i_h])
        sin = nl.load(sin_tensor[i * 128 + ip, i_h])
        out_tile = nl.ndarray((128, d), dtype=x_tensor.dtype)
        out_tile[ip, i_h] = nl.subtract(x1 * cos, x2 * sin, dtype=x_tensor.dtype)
        out_tile[ip, half + i_h] = nl.add(x2 * cos, x1 * sin, dtype=x_tensor.dtype)
        nl.store(out_tensor[i * 128 + ip, nl.arange(d)[None, :]], value=out_tile)
    return out_tensor
