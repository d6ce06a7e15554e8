"""Legacy names and keyword forms public kernels use (issue 20 item 6), each from the NKI 0.1 documentation."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from nki import NkiValidationError


def test_tile_reshape_accepts_shape_keyword():
    def k(a):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)  # [128, 8, 8]
        nl.store(out, t.reshape(shape=(128, 64)))
        return out

    a = np.arange(128 * 64, dtype=np.float32).reshape(128, 8, 8)
    np.testing.assert_array_equal(nki.simulate_kernel(nki.jit(k), a), a.reshape(128, 64))


def test_isa_constants_module():
    from neuronxcc.nki.isa.constants import oob_mode

    assert oob_mode is nisa.oob_mode and oob_mode.skip.name == "skip"
    import neuronxcc.nki.isa.constants as c

    assert c.dge_mode is nisa.dge_mode


def test_tensor_scalar_cumulative_running_sum():
    def running(a):
        out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        x = nl.load(a)
        r = nl.ndarray(a.shape, nl.float32)
        nisa.tensor_scalar_cumulative(src=x, dst=r, op0=nl.multiply, op1=nl.add, imm0=2.0)
        nl.store(out, r)
        return out

    a = np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32)
    np.testing.assert_allclose(nki.simulate_kernel(nki.jit(running), a), np.cumsum(2 * a, axis=1), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("mode", ["double_row", "double_row_gen3"])
def test_nc_matmul_double_row_perf_mode(monkeypatch, mode):
    """FP8 double-row mode: [K, 2, M] x [K, 2, N] contracts over 2K rows (NeuronCore-v3+)."""
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    fp8 = ml_dtypes.float8_e4m3

    def k(s, m):
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.copy(nisa.nc_matmul(nl.load(s), nl.load(m), perf_mode=mode)))
        return out

    rng = np.random.default_rng(1)
    s = rng.integers(-3, 4, (128, 2, 128)).astype(fp8)
    m = rng.integers(-3, 4, (128, 2, 512)).astype(fp8)
    ref = s.astype(np.float32).reshape(256, 128).T @ m.astype(np.float32).reshape(256, 512)
    np.testing.assert_array_equal(nki.simulate_kernel(nki.jit(k), s, m), ref)


def test_nc_matmul_unknown_perf_mode():
    def k(a):
        nisa.nc_matmul(nl.load(a), nl.load(a), perf_mode="triple_row")

    with pytest.raises(NkiValidationError, match="unknown nc_matmul perf_mode 'triple_row'"):
        nki.simulate_kernel(nki.jit(k), np.zeros((128, 128), np.float32))


def test_dma_copy_oob_skip_leaves_out_of_bounds_rows():
    def gather_rows(data, idx):
        out = nl.ndarray((4, 8), nl.float32, buffer=nl.shared_hbm)
        rows = nl.load(idx)  # [4, 1] int32, one row index per partition
        t = nl.full((4, 8), -1.0, nl.float32)
        nisa.dma_copy(dst=t, src=data[rows, nl.arange(8)[None, :]], oob_mode=nisa.oob_mode.skip)
        nl.store(out, t)
        return out

    data = np.arange(6 * 8, dtype=np.float32).reshape(6, 8)
    idx = np.array([[2], [9], [0], [5]], dtype=np.int32)  # row 9 is out of bounds: skipped
    out = nki.simulate_kernel(nki.jit(gather_rows), data, idx)
    np.testing.assert_array_equal(out[[0, 2, 3]], data[[2, 0, 5]])
    np.testing.assert_array_equal(out[1], -1.0)

    def no_skip(data, idx):
        t = nl.ndarray((4, 8), nl.float32)
        nisa.dma_copy(dst=t, src=data[nl.load(idx), nl.arange(8)[None, :]])

    with pytest.raises(NkiValidationError, match="Out-of-bound access"):
        nki.simulate_kernel(nki.jit(no_skip), data, idx)


def test_python_and_of_predicates_keeps_the_second():
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:8, 0:8]
        nl.store(out[i_p, i_f], nl.load(a[i_p, i_f]), mask=(i_p < 2) and (i_f < 3))
        return out

    a = np.ones((8, 8), np.float32)
    with pytest.warns(SyntaxWarning, match="keeps only one of them"):
        out = nki.simulate_kernel(nki.jit(k), a)
    np.testing.assert_array_equal(out[:, :3], 1.0)  # every row: the first predicate is dropped
