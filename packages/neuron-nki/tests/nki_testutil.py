"""Test helpers: bf16 conversion and a tiny 'load → compute → store' kernel harness."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

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


# -- shared references for the tutorial ports of both APIs ----------------------------------------------------
K1_FULL = (8192, 4096, 8192)  # calibration.md K1: lhsT [K, M] = [8192, 4096], rhs [K, N] = [8192, 8192], trn1
# Same M (what fills SBUF in the blocked kernel: its fp32 result block spans all of M) with small K and N.
K1_SMALL = (1024, 4096, 1024)


def k1_inputs(shape, seed: int = 0):
    K, M, N = shape
    rng = np.random.default_rng(seed)
    return bf16(rng.standard_normal((K, M), dtype=np.float32)), bf16(rng.standard_normal((K, N), dtype=np.float32))


def check_k1_result(out, lhsT, rhs, rows: int = 256):
    """The first ``rows`` rows of ``lhsT.T @ rhs`` (a bf16 result of long fp32 sums)."""
    assert out.shape == (lhsT.shape[1], rhs.shape[1]) and out.dtype == ml_dtypes.bfloat16
    ref = np.asarray(lhsT[:, :rows], np.float32).T @ np.asarray(rhs, np.float32)
    tol = 2e-2 * np.sqrt(lhsT.shape[0])
    np.testing.assert_allclose(np.asarray(out[:rows], np.float32), ref, rtol=2e-2, atol=tol)


def k1_cases(kernels) -> list:
    """``(kernel, kw, shape)`` parameters: each ``(kernel, kw)`` at the small shape, and at full size (slow)."""
    shapes = [("small", K1_SMALL, ()), ("full_size", K1_FULL, (pytest.mark.slow,))]
    return [pytest.param(kernel, kw, shape, id=f"{name}-{kernel.__name__}", marks=marks)
            for name, shape, marks in shapes for kernel, kw in kernels]


def check_k1_on_trn1(run_kernel, shape, monkeypatch) -> None:
    """Run a K1 kernel on trn1 (``run_kernel(lhsT, rhs)`` returns its output and cost) and check its result and
    that it fits trn1's SBUF. One check for the ports of both APIs, which launch and cost their kernels differently."""
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    lhsT, rhs = k1_inputs(shape)
    out, cost = run_kernel(lhsT, rhs)
    check_k1_result(out, lhsT, rhs)
    assert cost.sbuf_peak_bytes_per_partition <= 192 * 1024


def mamba_inputs(rng, batch: int, channels: int, seq: int, states: int):
    """delta, u: [batch, channels, seq]; A: [channels, states] (negative: decaying); B, C: [batch, states, seq]."""
    f = np.float32
    return (rng.uniform(0.01, 0.2, (batch, channels, seq)).astype(f), rng.standard_normal((batch, channels, seq)).astype(f),
            -rng.uniform(0.5, 2.0, (channels, states)).astype(f), rng.standard_normal((batch, states, seq)).astype(f),
            rng.standard_normal((batch, states, seq)).astype(f))


def mamba_reference(delta, u, A, B, C) -> np.ndarray:
    """Selective scan in float64: ``h[t] = exp(delta*A) h[t-1] + delta*u*B``, ``out = sum_states h * C``."""
    d, u, A, B, C = (np.asarray(x, np.float64) for x in (delta, u, A, B, C))
    out = np.zeros_like(d)
    for n in range(A.shape[1]):
        decay = np.exp(d * A[None, :, n, None])
        drive = d * u * B[:, None, n, :]
        h = np.zeros(d.shape[:2])
        for t in range(d.shape[2]):
            h = decay[..., t] * h + drive[..., t]
            out[..., t] += h * C[:, None, n, t]
    return out
