"""Matrix multiplication ``result = lhsT.T @ rhs`` in the legacy tutorial's five optimisation steps.

1. ``matmul_basic``: one [128, 64] × [128, 512] tile, ``nl.mgrid`` indexing.
2. ``matmul_tiled``: M/N/K loops, every tile reloaded per output tile, PSUM accumulation (``+=``).
3. ``matmul_hoist_load``: the lhsT column block is loaded once per M tile (block dimension + ``nl.par_dim``).
4. ``matmul_block_free_dimension``: M and N blocked so rhs tiles are reused across several M tiles.
5. ``matmul_fully_optimized``: all dimensions blocked, SBUF accumulation across K blocks, big DMAs.
"""

from __future__ import annotations

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.language as nl

TILE_M = 128  # nl.tile_size.gemm_stationary_fmax
TILE_K = 128  # nl.tile_size.pmax
TILE_N = 512  # nl.tile_size.gemm_moving_fmax


@nki.jit
def matmul_basic(lhsT, rhs):
    """[128, 64]ᵀ × [128, 512] → [64, 512]."""
    result = nl.ndarray((64, 512), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    i_lhsT_p, i_lhsT_f = nl.mgrid[0:128, 0:64]
    i_rhs_p, i_rhs_f = nl.mgrid[0:128, 0:512]
    i_out_p, i_out_f = nl.mgrid[0:64, 0:512]
    lhs_tile = nl.load(lhsT[i_lhsT_p, i_lhsT_f])
    rhs_tile = nl.load(rhs[i_rhs_p, i_rhs_f])
    result_psum = nl.matmul(lhs_tile, rhs_tile, transpose_x=True)
    result_sbuf = nl.copy(result_psum, dtype=result.dtype)
    nl.store(result[i_out_p, i_out_f], value=result_sbuf)
    return result


@nki.jit
def matmul_tiled(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TILE_M):
        for n in nl.affine_range(N // TILE_N):
            res_psum = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TILE_K):
                lhsT_tile = nl.ndarray((TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
                rhs_tile = nl.ndarray((TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
                lhsT_tile[...] = nl.load(lhsT[k * TILE_K:(k + 1) * TILE_K, m * TILE_M:(m + 1) * TILE_M])
                rhs_tile[...] = nl.load(rhs[k * TILE_K:(k + 1) * TILE_K, n * TILE_N:(n + 1) * TILE_N])
                res_psum += nl.matmul(lhsT_tile[...], rhs_tile[...], transpose_x=True)
            res_sb = nl.copy(res_psum, dtype=result.dtype)
            nl.store(result[m * TILE_M:(m + 1) * TILE_M, n * TILE_N:(n + 1) * TILE_N], value=res_sb)
    return result


@nki.jit
def matmul_hoist_load(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    i_lhsT = nl.mgrid[0:TILE_K, 0:TILE_M]
    i_rhs = nl.mgrid[0:TILE_K, 0:TILE_N]
    i_res = nl.mgrid[0:TILE_M, 0:TILE_N]
    for m in nl.affine_range(M // TILE_M):
        lhsT_tiles = nl.ndarray((K // TILE_K, nl.par_dim(TILE_K), TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
        for k in nl.affine_range(K // TILE_K):
            lhsT_tiles[k, i_lhsT.p, i_lhsT.x] = nl.load(lhsT[k * TILE_K + i_lhsT.p, m * TILE_M + i_lhsT.x])
        for n in nl.affine_range(N // TILE_N):
            rhs_tiles = nl.ndarray((K // TILE_K, nl.par_dim(TILE_K), TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
            for k in nl.affine_range(K // TILE_K):
                rhs_tiles[k, i_rhs.p, i_rhs.x] = nl.load(rhs[k * TILE_K + i_rhs.p, n * TILE_N + i_rhs.x])
            res_psum = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TILE_K):
                res_psum[...] += nl.matmul(lhsT_tiles[k, i_lhsT.p, i_lhsT.x], rhs_tiles[k, i_rhs.p, i_rhs.x],
                                           transpose_x=True)
            res_sb = nl.copy(res_psum, dtype=result.dtype)
            nl.store(result[m * TILE_M + i_res.p, n * TILE_N + i_res.x], value=res_sb)
    return result


@nki.jit
def matmul_block_free_dimension(lhsT, rhs, tiles_in_block_m: int = 2, tiles_in_block_n: int = 2):
    """Each [K, BLOCK] slab of lhsT and rhs is loaded once (one DMA per K tile) and reused for all tile pairs."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    block_m, block_n = TILE_M * tiles_in_block_m, TILE_N * tiles_in_block_n
    num_k = K // TILE_K
    for m in nl.affine_range(M // block_m):
        lhsT_tiles = nl.ndarray((num_k, nl.par_dim(TILE_K), block_m), dtype=lhsT.dtype, buffer=nl.sbuf)
        for k in nl.affine_range(num_k):
            lhsT_tiles[k] = nl.load(lhsT[k * TILE_K:(k + 1) * TILE_K, m * block_m:(m + 1) * block_m])
        for n in nl.affine_range(N // block_n):
            rhs_tiles = nl.ndarray((num_k, nl.par_dim(TILE_K), block_n), dtype=rhs.dtype, buffer=nl.sbuf)
            for k in nl.affine_range(num_k):
                rhs_tiles[k] = nl.load(rhs[k * TILE_K:(k + 1) * TILE_K, n * block_n:(n + 1) * block_n])
            for bm in nl.affine_range(tiles_in_block_m):
                for bn in nl.affine_range(tiles_in_block_n):
                    res_psum = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
                    for k in nl.affine_range(num_k):
                        res_psum += nl.matmul(lhsT_tiles[k, :, bm * TILE_M:(bm + 1) * TILE_M],
                                              rhs_tiles[k, :, bn * TILE_N:(bn + 1) * TILE_N], transpose_x=True)
                    res_sb = nl.copy(res_psum, dtype=result.dtype)
                    r0 = m * block_m + bm * TILE_M
                    c0 = n * block_n + bn * TILE_N
                    nl.store(result[r0:r0 + TILE_M, c0:c0 + TILE_N], value=res_sb)
    return result


@nki.jit
def matmul_fully_optimized(lhsT, rhs, tiles_in_block_m: int = 2, tiles_in_block_n: int = 2,
                           tiles_in_block_k: int = 2):
    """Blocks over M, N and K; partial products of each K block accumulate into an SBUF result block."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    block_m, block_n, block_k = TILE_M * tiles_in_block_m, TILE_N * tiles_in_block_n, TILE_K * tiles_in_block_k
    for n in nl.affine_range(N // block_n):
        result_tiles = nl.zeros((M // block_m, tiles_in_block_m, tiles_in_block_n, nl.par_dim(TILE_M), TILE_N),
                                dtype=np.float32, buffer=nl.sbuf)
        for k in nl.sequential_range(K // block_k):
            rhs_block = nl.ndarray((tiles_in_block_k, nl.par_dim(TILE_K), block_n), dtype=rhs.dtype,
                                   buffer=nl.sbuf)
            for bk in nl.affine_range(tiles_in_block_k):
                k0 = (k * tiles_in_block_k + bk) * TILE_K
                rhs_block[bk] = nl.load(rhs[k0:k0 + TILE_K, n * block_n:(n + 1) * block_n])
            for m in nl.affine_range(M // block_m):
                lhsT_block = nl.ndarray((tiles_in_block_k, nl.par_dim(TILE_K), block_m), dtype=lhsT.dtype,
                                        buffer=nl.sbuf)
                for bk in nl.affine_range(tiles_in_block_k):
                    k0 = (k * tiles_in_block_k + bk) * TILE_K
                    lhsT_block[bk] = nl.load(lhsT[k0:k0 + TILE_K, m * block_m:(m + 1) * block_m])
                for bn in nl.affine_range(tiles_in_block_n):
                    for bm in nl.affine_range(tiles_in_block_m):
                        res_psum = nl.zeros((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
                        for bk in nl.affine_range(tiles_in_block_k):
                            res_psum += nl.matmul(lhsT_block[bk, :, bm * TILE_M:(bm + 1) * TILE_M],
                                                  rhs_block[bk, :, bn * TILE_N:(bn + 1) * TILE_N], transpose_x=True)
                        result_tiles[m, bm, bn] = nl.add(result_tiles[m, bm, bn], res_psum)
        for m in nl.affine_range(M // block_m):
            for bm in nl.affine_range(tiles_in_block_m):
                row = nl.ndarray((nl.par_dim(TILE_M), block_n), dtype=result.dtype, buffer=nl.sbuf)
                for bn in nl.affine_range(tiles_in_block_n):
                    row[:, bn * TILE_N:(bn + 1) * TILE_N] = nl.copy(result_tiles[m, bm, bn])
                r0 = (m * tiles_in_block_m + bm) * TILE_M
                nl.store(result[r0:r0 + TILE_M, n * block_n:(n + 1) * block_n], value=row)
    return result
