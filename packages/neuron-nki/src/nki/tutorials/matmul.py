"""Matrix multiplication in five optimisation steps (``result = lhsT.T @ rhs``), current NKI API.

1. ``matmul_basic``: one tile, K=128, M=64, N=512.
2. ``matmul_tiled``: loop over M/N/K tiles, reload every tile for every output tile.
3. ``matmul_hoist_load``: load each lhsT column block once per M tile.
4. ``matmul_block_free``: block M and N so rhs tiles are reused across several M tiles.
5. ``matmul_fully_optimized``: block all dimensions, big (TILE_K × BLOCK) DMAs, SBUF accumulation.
"""

from __future__ import annotations

import nki
import nki.isa as nisa
import nki.language as nl

TILE_M = 128  # nl.tile_size.gemm_stationary_fmax
TILE_K = 128  # nl.tile_size.pmax
TILE_N = 512  # nl.tile_size.gemm_moving_fmax


@nki.jit
def matmul_basic(lhsT, rhs):
    """[128, 64]ᵀ × [128, 512] → [64, 512]."""
    _, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    a = nl.ndarray(lhsT.shape, dtype=lhsT.dtype, buffer=nl.sbuf)
    b = nl.ndarray(rhs.shape, dtype=rhs.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=lhsT)
    nisa.dma_copy(dst=b, src=rhs)
    acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(acc, a, b)
    out = nl.ndarray((M, N), dtype=result.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out, src=acc)
    nisa.dma_copy(dst=result, src=out)
    return result


@nki.jit
def matmul_tiled(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TILE_M):
        for n in nl.affine_range(N // TILE_N):
            acc = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TILE_K):
                a = nl.ndarray((TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
                b = nl.ndarray((TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=a, src=lhsT[k * TILE_K:(k + 1) * TILE_K, m * TILE_M:(m + 1) * TILE_M])
                nisa.dma_copy(dst=b, src=rhs[k * TILE_K:(k + 1) * TILE_K, n * TILE_N:(n + 1) * TILE_N])
                nisa.nc_matmul(dst=acc, stationary=a, moving=b)
            out = nl.ndarray((TILE_M, TILE_N), dtype=result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=out, src=acc)
            nisa.dma_copy(dst=result[m * TILE_M:(m + 1) * TILE_M, n * TILE_N:(n + 1) * TILE_N], src=out)
    return result


@nki.jit
def matmul_hoist_load(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TILE_M):
        a_tiles = []
        for k in nl.affine_range(K // TILE_K):
            a = nl.ndarray((TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=a, src=lhsT[k * TILE_K:(k + 1) * TILE_K, m * TILE_M:(m + 1) * TILE_M])
            a_tiles.append(a)
        for n in nl.affine_range(N // TILE_N):
            b_tiles = []
            for k in nl.affine_range(K // TILE_K):
                b = nl.ndarray((TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=b, src=rhs[k * TILE_K:(k + 1) * TILE_K, n * TILE_N:(n + 1) * TILE_N])
                b_tiles.append(b)
            acc = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TILE_K):
                nisa.nc_matmul(dst=acc, stationary=a_tiles[k], moving=b_tiles[k])
            out = nl.ndarray((TILE_M, TILE_N), dtype=result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=out, src=acc)
            nisa.dma_copy(dst=result[m * TILE_M:(m + 1) * TILE_M, n * TILE_N:(n + 1) * TILE_N], src=out)
    return result


@nki.jit
def matmul_block_free(lhsT, rhs, TILES_M: int = 2, TILES_N: int = 2):
    K, M = lhsT.shape
    _, N = rhs.shape
    BM, BN = TILE_M * TILES_M, TILE_N * TILES_N
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // BM):
        a_tiles = []
        for bm in nl.affine_range(TILES_M):
            row = []
            for k in nl.affine_range(K // TILE_K):
                a = nl.ndarray((TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
                c0 = (m * TILES_M + bm) * TILE_M
                nisa.dma_copy(dst=a, src=lhsT[k * TILE_K:(k + 1) * TILE_K, c0:c0 + TILE_M])
                row.append(a)
            a_tiles.append(row)
        for n in nl.affine_range(N // BN):
            b_tiles = []
            for bn in nl.affine_range(TILES_N):
                row = []
                for k in nl.affine_range(K // TILE_K):
                    b = nl.ndarray((TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
                    c0 = (n * TILES_N + bn) * TILE_N
                    nisa.dma_copy(dst=b, src=rhs[k * TILE_K:(k + 1) * TILE_K, c0:c0 + TILE_N])
                    row.append(b)
                b_tiles.append(row)
            for bm in nl.affine_range(TILES_M):
                for bn in nl.affine_range(TILES_N):
                    acc = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
                    for k in nl.affine_range(K // TILE_K):
                        nisa.nc_matmul(dst=acc, stationary=a_tiles[bm][k], moving=b_tiles[bn][k])
                    out = nl.ndarray((TILE_M, TILE_N), dtype=result.dtype, buffer=nl.sbuf)
                    nisa.tensor_copy(dst=out, src=acc)
                    r0 = (m * TILES_M + bm) * TILE_M
                    c0 = (n * TILES_N + bn) * TILE_N
                    nisa.dma_copy(dst=result[r0:r0 + TILE_M, c0:c0 + TILE_N], src=out)
    return result


@nki.jit
def matmul_fully_optimized(lhsT, rhs, TILES_M: int = 8, TILES_N: int = 2, TILES_K: int = 8):
    """Blocks of TILES_M×128 rows, TILES_N×512 columns and TILES_K×128 contraction; partial sums in SBUF."""
    K, M = lhsT.shape
    _, N = rhs.shape
    BM, BN, BK = TILE_M * TILES_M, TILE_N * TILES_N, TILE_K * TILES_K
    assert M % BM == 0 and N % BN == 0 and K % BK == 0, "shape must be a multiple of the block sizes"
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for n in nl.affine_range(N // BN):
        acc_sb = [[[None] * TILES_N for _ in range(TILES_M)] for _ in range(M // BM)]
        for m in range(M // BM):
            for bm in range(TILES_M):
                for bn in range(TILES_N):
                    t = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.memset(dst=t, value=0.0)
                    acc_sb[m][bm][bn] = t
        for k in nl.sequential_range(K // BK):
            b_tiles = []
            for bk in range(TILES_K):
                b = nl.ndarray((TILE_K, BN), dtype=rhs.dtype, buffer=nl.sbuf)
                r0 = (k * TILES_K + bk) * TILE_K
                nisa.dma_copy(dst=b, src=rhs[r0:r0 + TILE_K, n * BN:(n + 1) * BN])
                b_tiles.append(b)
            for m in nl.affine_range(M // BM):
                a_tiles = []
                for bk in nl.affine_range(TILES_K):
                    a = nl.ndarray((TILE_K, BM), dtype=lhsT.dtype, buffer=nl.sbuf)
                    r0 = (k * TILES_K + bk) * TILE_K
                    nisa.dma_copy(dst=a, src=lhsT[r0:r0 + TILE_K, m * BM:(m + 1) * BM])
                    a_tiles.append(a)
                for bn in nl.affine_range(TILES_N):
                    for bm in nl.affine_range(TILES_M):
                        ps = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
                        for bk in nl.affine_range(TILES_K):
                            nisa.nc_matmul(dst=ps, stationary=a_tiles[bk][:, bm * TILE_M:(bm + 1) * TILE_M],
                                           moving=b_tiles[bk][:, bn * TILE_N:(bn + 1) * TILE_N])
                        nisa.tensor_tensor(dst=acc_sb[m][bm][bn], data1=acc_sb[m][bm][bn], data2=ps, op=nl.add)
        for m in nl.affine_range(M // BM):
            for bm in nl.affine_range(TILES_M):
                packed = nl.ndarray((TILE_M, BN), dtype=result.dtype, buffer=nl.sbuf)
                for bn in nl.affine_range(TILES_N):
                    nisa.tensor_copy(dst=packed[:, bn * TILE_N:(bn + 1) * TILE_N], src=acc_sb[m][bm][bn])
                r0 = (m * TILES_M + bm) * TILE_M
                nisa.dma_copy(dst=result[r0:r0 + TILE_M, n * BN:(n + 1) * BN], src=packed)
    return result


STEPS = [matmul_basic, matmul_tiled, matmul_hoist_load, matmul_block_free, matmul_fully_optimized]
