"""Test helpers: bf16 conversion and a tiny 'load → compute → store' kernel harness."""

from __future__ import annotations

import ml_dtypes
import numpy as np

import nki
import nki.language as nl


def bf16(a):
    return np.asarray(a, dtype=np.float32).astype(ml_dtypes.bfloat16)


def sim(body, *arrays, out_shape=None, out_dtype=None, grid=None):
    """Run ``body(*sbuf_tiles) -> tile`` in a kernel: inputs are DMA'd to SBUF, the result stored to HBM."""

    def kernel(*hbm_in):
        tiles = []
        for x in hbm_in:
            t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
            nki.isa.dma_copy(dst=t, src=x)
            tiles.append(t)
        res = body(*tiles)
        if isinstance(res, nl.NkiTensor) and res.buffer is nl.psum:
            tmp = nl.ndarray(res.shape, res.dtype, buffer=nl.sbuf)
            nki.isa.tensor_copy(dst=tmp, src=res)
            res = tmp
        out = nl.ndarray(res.shape, res.dtype, buffer=nl.shared_hbm)
        nki.isa.dma_copy(dst=out, src=res)
        return out

    k = nki.jit(kernel)
    if grid is not None:
        k = k[grid]
    return nki.simulate(k)(*arrays)
