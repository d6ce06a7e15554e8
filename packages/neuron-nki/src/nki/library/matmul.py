"""General matmul ``a @ b`` for a [M, K], b [K, N] of any sizes (ragged tiles), current NKI API.

``aT`` (a with its dims swapped, a strided view of the same HBM tensor) gives the Tensor Engine K-on-partition
stationary tiles. Output tiles are 128 × 512 (one PSUM bank); the K tiles accumulate in PSUM (fp32).
"""

from __future__ import annotations

import nki
import nki.isa as nisa
import nki.language as nl

TILE_M, TILE_K, TILE_N = 128, 128, 512


def _tiles(n: int, size: int):
    return [(t * size, min(size, n - t * size)) for t in range((n + size - 1) // size)]


@nki.jit
def matmul(aT, b):
    """aT [K, M], b [K, N] → aTᵀ·b [M, N] in b's dtype (fp32 accumulation)."""
    K, M = aT.shape
    N = b.shape[1]
    out = nl.ndarray((M, N), dtype=b.dtype, buffer=nl.shared_hbm)
    k_tiles = _tiles(K, TILE_K)
    for n0, nw in _tiles(N, TILE_N):
        b_tiles = [nl.load(b[k0:k0 + kw, n0:n0 + nw]) for k0, kw in k_tiles]
        for m0, mw in _tiles(M, TILE_M):
            acc = nl.ndarray((mw, nw), dtype=nl.float32, buffer=nl.psum)
            for (k0, kw), b_sb in zip(k_tiles, b_tiles, strict=True):
                nisa.nc_matmul(dst=acc, stationary=nl.load(aT[k0:k0 + kw, m0:m0 + mw]), moving=b_sb)
            o = nl.ndarray((mw, nw), dtype=b.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=o, src=acc)
            nl.store(out[m0:m0 + mw, n0:n0 + nw], o)
    return out
