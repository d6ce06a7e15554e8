"""SPMD tensor add, 2-D (free-dim) transpose and 2-D average pooling, current NKI API."""

from __future__ import annotations

import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def tensor_add(a, b):
    """SPMD: launch as ``tensor_add[M // 128, N // 512](a, b)``; each instance adds one 128×512 tile."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    r0 = nl.program_id(0) * 128
    c0 = nl.program_id(1) * 512
    x = nl.load(a[nl.ds(r0, 128), nl.ds(c0, 512)])
    y = nl.load(b[nl.ds(r0, 128), nl.ds(c0, 512)])
    s = nl.ndarray(x.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=s, data1=x, data2=y, op=nl.add)
    nl.store(out[nl.ds(r0, 128), nl.ds(c0, 512)], s)
    return out


@nki.jit
def transpose2d(x, f1: int, f2: int):
    """Per partition, view the free dim as [f1, f2] and transpose it: out[p, j*f1+i] = x[p, i*f2+j]."""
    P = x.shape[0]
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    r = nl.ndarray((P, f2, f1), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=r, src=t.reshape((P, f1, f2)).permute(0, 2, 1))
    nl.store(out, r.reshape((P, f1 * f2)))
    return out


@nki.jit
def avg_pool2d(x, pool: int):
    """[C, H, W] → [C, H/pool, W/pool]: mean of each pool×pool window (C ≤ 128 on partitions)."""
    C, H, W = x.shape
    Ho, Wo = H // pool, W // pool
    out = nl.ndarray((C, Ho, Wo), dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    windows = t.reshape((C, Ho, pool, Wo, pool)).permute(0, 1, 3, 2, 4)  # [C, Ho, Wo, pool, pool]
    s = nl.ndarray((C, Ho, Wo), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_reduce(dst=s, op=nl.add, data=windows, axis=(3, 4))
    r = nl.ndarray((C, Ho, Wo), dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=r, data=s, op0=nl.multiply, operand0=1.0 / (pool * pool))
    nl.store(out, r)
    return out
