"""Shared test helper: run a tile function inside a legacy kernel on NumPy inputs."""

from __future__ import annotations

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.language as nl


def run_tiles(body, *arrays, grid=None):
    """Load each array into SBUF, call ``body(*tiles)`` (→ tile or tuple of tiles), store results to HBM."""

    def kernel(*hbm_in):
        tiles = [nl.load(x) for x in hbm_in]
        res = body(*tiles)
        outs = []
        for r in res if isinstance(res, tuple) else (res,):
            o = nl.ndarray(r.shape, dtype=r.dtype, buffer=nl.shared_hbm)
            nl.store(o, r)
            outs.append(o)
        return tuple(outs) if isinstance(res, tuple) else outs[0]

    k = nki.jit(kernel)
    return nki.simulate_kernel(k if grid is None else k[grid], *arrays)


def f32(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)
