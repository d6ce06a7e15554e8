"""K1: the NKI matrix-multiplication tutorial's four performance steps (SDK 2.23 ``matrix_multiplication.rst``).

``result[M, N] = lhsT[K, M].T @ rhs[K, N]``, bf16 inputs, the tutorial's tile sizes (128-row stationary tiles,
512-column moving tiles, 128-deep contraction). Published trn1 latencies at [4096, 8192] @ [8192, 8192]:
51.80 / 42.96 / 22.07 / 6.97 ms.

Step 1 (every (m, n) output tile reloads its lhsT and rhs tiles for each K tile) is the package's legacy tutorial
kernel itself (``neuronxcc.nki.tutorials.matmul.matmul_tiled``), tile sizes included. The other three stay here
because they differ from the package tutorial's steps: the hoisted lhsT strip is sized with TILE_N, the blocked
kernel loads one tile per DMA instead of a block slab, and the fully optimised one keeps a bf16 SBUF result block
and calls ``nisa.nc_matmul`` (16 x 2 x 8 blocks by default).
"""

from __future__ import annotations

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from neuronxcc.nki.tutorials.matmul import TILE_K, TILE_M, TILE_N
from neuronxcc.nki.tutorials.matmul import matmul_tiled as tiled


@nki.jit
def hoisted(lhsT, rhs):
    """Step 2: the lhsT column strip is loaded once per M tile, the rhs strip once per (m, n)."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    ia = nl.mgrid[0:TILE_K, 0:TILE_M]
    ib = nl.mgrid[0:TILE_K, 0:TILE_N]
    io = nl.mgrid[0:TILE_M, 0:TILE_N]
    for m in nl.affine_range(M // TILE_M):
        # the tutorial sizes this strip's free axis with TILE_N (only TILE_M columns are used); kept as written
        a_strip = nl.ndarray((K // TILE_K, nl.par_dim(TILE_K), TILE_N), dtype=lhsT.dtype, buffer=nl.sbuf)
        for k in nl.affine_range(K // TILE_K):
            a_strip[k, ia.p, ia.x] = nl.load(lhsT[k * TILE_K + ia.p, m * TILE_M + ia.x])
        for n in nl.affine_range(N // TILE_N):
            b_strip = nl.ndarray((K // TILE_K, nl.par_dim(TILE_K), TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
            for k in nl.affine_range(K // TILE_K):
                b_strip[k, ib.p, ib.x] = nl.load(rhs[k * TILE_K + ib.p, n * TILE_N + ib.x])
            acc = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TILE_K):
                acc[...] += nl.matmul(a_strip[k, ia.p, ia.x], b_strip[k, ib.p, ib.x], transpose_x=True)
            out = nl.copy(acc, dtype=result.dtype)
            nl.store(result[m * TILE_M + io.p, n * TILE_N + io.x], value=out)
    return result


@nki.jit
def blocked_free(lhsT, rhs):
    """Step 3: M and N blocked by 2 tiles, so each loaded rhs tile serves two M tiles (and lhsT two N tiles)."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    ia = nl.mgrid[0:TILE_K, 0:TILE_M]
    ib = nl.mgrid[0:TILE_K, 0:TILE_N]
    io = nl.mgrid[0:TILE_M, 0:TILE_N]
    tiles_m, tiles_n = 2, 2
    block_m, block_n = TILE_M * tiles_m, TILE_N * tiles_n
    for m in nl.affine_range(M // block_m):
        a_block = nl.ndarray((tiles_m, K // TILE_K, nl.par_dim(TILE_K), TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
        for bm in nl.affine_range(tiles_m):
            for k in nl.affine_range(K // TILE_K):
                a_block[bm, k, ia.p, ia.x] = nl.load(lhsT[k * TILE_K + ia.p, (m * tiles_m + bm) * TILE_M + ia.x])
        for n in nl.affine_range(N // block_n):
            b_block = nl.ndarray((tiles_n, K // TILE_K, nl.par_dim(TILE_K), TILE_N), dtype=rhs.dtype,
                                 buffer=nl.sbuf)
            for bn in nl.affine_range(tiles_n):
                for k in nl.affine_range(K // TILE_K):
                    b_block[bn, k, ib.p, ib.x] = nl.load(rhs[k * TILE_K + ib.p, (n * tiles_n + bn) * TILE_N + ib.x])
            for bm in nl.affine_range(tiles_m):
                for bn in nl.affine_range(tiles_n):
                    acc = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
                    for k in nl.affine_range(K // TILE_K):
                        acc += nl.matmul(a_block[bm, k, ia.p, ia.x], b_block[bn, k, ib.p, ib.x], transpose_x=True)
                    out = nl.copy(acc, dtype=result.dtype)
                    nl.store(result[(m * tiles_m + bm) * TILE_M + io.p, (n * tiles_n + bn) * TILE_N + io.x],
                             value=out)
    return result


@nki.jit
def fully_optimized(lhsT, rhs, tiles_m: int = 16, tiles_n: int = 2, tiles_k: int = 8):
    """Step 4: M, N and K blocked; each K block's partial products are added into an SBUF result block, and
    loads and stores move a whole block row (TILE_K x block) per DMA."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    block_m, block_n, block_k = TILE_M * tiles_m, TILE_N * tiles_n, TILE_K * tiles_k
    assert M % block_m == 0 and N % block_n == 0 and K % block_k == 0, "shape must be a multiple of the blocks"
    for n in nl.affine_range(N // block_n):
        res_block = nl.zeros((M // block_m, tiles_m, tiles_n, nl.par_dim(TILE_M), TILE_N), dtype=lhsT.dtype,
                             buffer=nl.sbuf)
        for k in nl.sequential_range(K // block_k):
            ib = nl.mgrid[0:TILE_K, 0:block_n]
            b_block = nl.ndarray((tiles_k, nl.par_dim(TILE_K), block_n), dtype=rhs.dtype, buffer=nl.sbuf)
            for bk in nl.affine_range(tiles_k):
                b_block[bk, ib.p, ib.x] = nl.load(rhs[(tiles_k * k + bk) * TILE_K + ib.p, block_n * n + ib.x])
            for m in nl.affine_range(M // block_m):
                ia = nl.mgrid[0:TILE_K, 0:block_m]
                a_block = nl.ndarray((tiles_k, nl.par_dim(TILE_K), block_m), dtype=lhsT.dtype, buffer=nl.sbuf)
                for bk in nl.affine_range(tiles_k):
                    a_block[bk, ia.p, ia.x] = nl.load(lhsT[(tiles_k * k + bk) * TILE_K + ia.p, block_m * m + ia.x])
                ia_mm = nl.mgrid[0:TILE_K, 0:TILE_M]
                ib_mm = nl.mgrid[0:TILE_K, 0:TILE_N]
                io_mm = nl.mgrid[0:TILE_M, 0:TILE_N]
                for bn in nl.affine_range(tiles_n):
                    for bm in nl.affine_range(tiles_m):
                        ps = nl.zeros((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
                        for bk in nl.affine_range(tiles_k):
                            ps[...] += nisa.nc_matmul(a_block[bk, ia_mm.p, bm * TILE_M + ia_mm.x],
                                                      b_block[bk, ib_mm.p, bn * TILE_N + ib_mm.x])
                        res_block[m, bm, bn, io_mm.p, io_mm.x] += ps[io_mm.p, io_mm.x]
        for m in nl.affine_range(M // block_m):
            for bm in nl.affine_range(tiles_m):
                io = nl.mgrid[0:TILE_K, 0:TILE_N]
                io_row = nl.mgrid[0:TILE_K, 0:block_n]
                row = nl.ndarray((TILE_K, block_n), dtype=res_block.dtype, buffer=nl.sbuf)
                for bn in nl.affine_range(tiles_n):
                    row[io.p, bn * TILE_N + io.x] = nl.copy(res_block[m, bm, bn, io.p, io.x])
                nl.store(result[(tiles_m * m + bm) * TILE_K + io_row.p, block_n * n + io_row.x],
                         value=row[io_row.p, io_row.x])
    return result


KERNELS = {"tiled": tiled, "hoisted": hoisted, "blocked_free": blocked_free, "fully_optimized": fully_optimized}
PUBLISHED_MS = {"tiled": 51.80, "hoisted": 42.96, "blocked_free": 22.07, "fully_optimized": 6.97}
