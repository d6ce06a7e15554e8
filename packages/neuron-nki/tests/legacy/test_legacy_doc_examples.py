"""Semantics of the legacy SDK documentation examples (``general/nki/test/test_nki_*.py``), rewritten here:
each kernel uses the same legacy constructs and is checked the way the SDK checks it (default ``np.allclose``)."""

from __future__ import annotations

import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from neuronxcc.nki.typing import tensor


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def test_activation_bf16_output_keeps_fp32_precision(rng):
    """A bf16-typed result compares to an fp32 golden with default tolerances: legacy storage is fp32."""
    @nki.jit(mode="simulation")
    def k(a_t, b_t, c_t):
        a_out = nl.ndarray(a_t.shape, dtype=a_t.dtype, buffer=nl.shared_hbm)
        b_out = nl.ndarray(b_t.shape, dtype=b_t.dtype, buffer=nl.shared_hbm)
        nl.store(a_out, nisa.activation(op=nl.exp, data=nl.load(a_t)))
        b, c = nl.load(b_t), nl.load(c_t)
        nl.store(b_out, nisa.activation(op=np.square, data=b, bias=c, scale=2.0, dtype=nl.bfloat16))
        return a_out, b_out

    a = rng.random((128, 1024)).astype(np.float32) * 100  # exp overflows to inf, not NaN
    b = rng.random((128, 512)).astype(np.float32)
    c = rng.random((128, 1)).astype(np.float32)
    a_act, b_act = k(a, b, c)
    with np.errstate(over="ignore"):
        assert np.allclose(a_act, np.exp(a))
    assert np.isinf(a_act).any() and not np.isnan(a_act).any()
    assert np.allclose(b_act, np.square(b * 2 + c))


def test_affine_select_upper_triangle(rng):
    @nki.jit(mode="simulation")
    def k(a_t):
        out = nl.ndarray(a_t.shape, dtype=a_t.dtype, buffer=nl.shared_hbm)
        ix, iy = nl.mgrid[0:128, 0:128]
        a = nl.load(a_t[ix, iy])
        nl.store(out[ix, iy], nisa.affine_select(pred=(iy < ix), on_true_tile=a[ix, iy], on_false_value=-9984.0))
        return out

    a = rng.random((128, 128)).astype(np.float32)
    ref = a.copy()
    ref[np.triu_indices_from(ref)] = -9984.0
    assert np.allclose(k(a), ref)


def test_iota_patterns_into_output_arguments():
    @nki.trace
    def k(a_t, b_t, c_t, d_t, e_t):
        ea = nl.arange(0, 512)[None, :]
        eb = nl.arange(0, 128)[:, None]
        nl.store(a_t[0, ea], nisa.iota(ea, dtype=np.int32))
        nl.store(b_t[eb, 0], nisa.iota(eb, dtype=np.int32))
        nl.store(c_t[0, ea], nisa.iota(ea * -1, dtype=np.int32))
        nl.store(d_t[eb, 0], nisa.iota(5 + eb * 2, dtype=np.int32))
        nl.store(e_t[eb, ea], nisa.iota(ea + eb, dtype=np.int32))

    a, c = np.zeros((1, 512), np.float32), np.zeros((1, 512), np.float32)
    b, d = np.zeros((128, 1), np.float32), np.zeros((128, 1), np.float32)
    e = np.zeros((128, 512), np.float32)
    nki.simulate_kernel(k, a, b, c, d, e)
    assert np.allclose(a, np.arange(512)[None]) and np.allclose(b, np.arange(128)[:, None])
    assert np.allclose(c, -np.arange(512)[None]) and np.allclose(d, np.arange(5, 260, 2)[:, None])
    assert np.allclose(e, np.arange(512)[None] + np.arange(128)[:, None])


def test_indirect_load_and_store_through_index_tiles(rng):
    @nki.jit(mode="simulation")
    def load_hbm_idx(data, idx):
        out = nl.ndarray([64, 512], dtype=data.dtype, buffer=nl.shared_hbm)
        i_p, i_f = nl.arange(64)[:, None], nl.arange(512)[None, :]
        idx_tile = nl.load(idx[i_p])
        nl.store(out, value=nl.load(data[idx_tile[i_p, 0], i_f]))
        return out

    @nki.jit(mode="simulation")
    def store_iota_idx(src):
        out = nl.ndarray([128, 512], dtype=src.dtype, buffer=nl.shared_hbm)
        idx_tile = nisa.iota(2 * nl.arange(64)[:, None], dtype=np.int32)
        nl.store(out[idx_tile, nl.arange(512)[None, :]], value=nl.load(src)[0:64, 0:512])
        return out

    data = rng.random((128, 512)).astype(np.float32)
    idx = 2 * np.arange(64, dtype=np.int32)
    assert np.allclose(load_hbm_idx(data, idx), data[idx])
    src = rng.random((64, 512)).astype(np.float32)
    assert np.allclose(store_iota_idx(src)[idx], src)


def test_mask_on_compute_and_out_of_bounds_store(rng):
    @nki.jit(mode="simulation")
    def k(x):
        out = nl.ndarray([64, 256], dtype=x.dtype, buffer=nl.shared_hbm)
        i_p, i_f = nl.arange(128)[:, None], nl.arange(512)[None, :]
        t = nl.square(nl.load(x[i_p, i_f]), mask=((i_p < 64) & (i_f < 256)))
        nl.store(out[i_p, i_f], t[i_p, i_f], mask=((i_p < 64) & (i_f < 256)))
        return out

    a = rng.random((128, 512)).astype(np.float32)
    assert np.allclose(k(a), np.square(a[:64, :256]))


def test_block_dimension_tensors(rng):
    @nki.jit(mode="simulation")
    def k(a_ptr):
        B, N, M = a_ptr.shape
        loaded = nl.ndarray((B, nl.par_dim(N), M), dtype=a_ptr.dtype, buffer=nl.sbuf)
        exp_out = nl.ndarray((B, nl.par_dim(N), M), dtype=a_ptr.dtype, buffer=nl.sbuf)
        out = nl.ndarray((B, nl.par_dim(N), M), dtype=a_ptr.dtype, buffer=nl.shared_hbm)
        for b in nl.affine_range(B):
            loaded[b] = nl.load(a_ptr[b])
            exp_out[b] = nl.exp(loaded[b])
            nl.store(out[b], value=exp_out[b])
        return out

    a = rng.random((4, 128, 512)).astype(np.float32)
    with pytest.warns(DeprecationWarning, match="block dimensions"):
        assert np.allclose(k(a), np.exp(a))


@pytest.mark.parametrize("grid", ["plain", "blocked", "blocked_sugar", "interleaved", "interleaved_sugar"])
def test_spmd_grid_forms(rng, grid):
    def copy_kernel(a):
        b = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        i, j = nl.program_id(0), nl.program_id(1)
        nl.store(b[i, j], nl.load(a[i, j]))
        return b

    k = nki.jit(nki.jit(copy_kernel), mode="simulation")
    grids = {"plain": (4, 2), "blocked": (nl.spmd_dim(nl.nc(2), 2), 2), "blocked_sugar": (nl.nc(2) * 2, 2),
             "interleaved": (nl.spmd_dim(2, nl.nc(2)), 2), "interleaved_sugar": (2 * nl.nc(2), 2)}
    src = rng.random((4, 2, 1, 1)).astype(np.float32)
    assert np.allclose(k[grids[grid]](src), src)


def test_simulate_kernel_with_device_print(capsys):
    @nki.jit
    def print_kernel():
        a = nl.ndarray([4, 4], dtype=nl.float32, buffer=nl.shared_hbm)
        y = nl.zeros([4, 4], dtype=np.float32)
        nl.device_print("value of y:", y)
        nl.store(a, value=y)
        return a

    assert np.allclose(nki.simulate_kernel(print_kernel), np.zeros([4, 4]))
    assert "value of y:" in capsys.readouterr().out


def test_broadcast_int_rows(rng):
    @nki.jit(mode="simulation")
    def k(x):
        out = nl.ndarray([128, 64], x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.broadcast_to(nl.load(x, dtype=x.dtype), shape=(128, x.shape[1])))
        return out

    src = (rng.random((1, 64)) * 100).astype(np.int32)
    assert np.allclose(k(src), np.repeat(src, 128, axis=0))


def test_bn_stats_bn_aggr_in_chunks(rng):
    @nki.jit(mode="simulation")
    def k(b_t):
        mean_t = nl.ndarray([b_t.shape[0], 1], dtype=b_t.dtype, buffer=nl.shared_hbm)
        var_t = nl.ndarray([b_t.shape[0], 1], dtype=b_t.dtype, buffer=nl.shared_hbm)
        b: tensor[128, 1024] = nl.load(b_t)
        stats = nl.ndarray((128, 6 * 2), dtype=nl.float32)
        n = nl.tile_size.bn_stats_fmax
        ix, iy = nl.mgrid[0:128, 0:n]
        iz, iw = nl.mgrid[0:128, 0:6]
        for i in range(1024 // n):
            stats[iz, i * 6 + iw] = nisa.bn_stats(b[ix, i * n + iy], dtype=nl.float32)
        mv = nisa.bn_aggr(stats)
        nl.store(mean_t, mv[:, 0])
        nl.store(var_t, mv[:, 1])
        return mean_t, var_t

    b = rng.random((128, 1024)).astype(np.float32)
    mean, var = k(b)
    assert np.allclose(mean, b.mean(1, keepdims=True)) and np.allclose(var, b.var(1, keepdims=True))


def test_tensor_reduce_then_store_with_mgrid(rng):
    @nki.jit(mode="simulation")
    def k(a_t):
        out = nl.ndarray([a_t.shape[0], 1], dtype=a_t.dtype, buffer=nl.shared_hbm)
        i_p, i_f = nl.arange(128)[:, None], nl.arange(512)[None, :]
        a = nl.load(a_t[i_p, i_f])
        r = nisa.tensor_reduce(np.add, a[i_p, i_f], axis=[1])
        i_pb, i_fb = nl.mgrid[0:128, 0:1]
        nl.store(out[i_pb, i_fb], r)
        return out

    a = rng.random((128, 512)).astype(np.float32)
    assert np.allclose(k(a), a.sum(1, keepdims=True))


def test_masked_instruction_assigned_into_a_tile_updates_only_masked_elements(rng):
    """``dst[...] = op(..., mask=m)`` writes ``dst`` only where ``m`` holds; ``mask=False`` (a compile-time
    constant, as in the flash-attention sample) leaves ``dst`` untouched."""
    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:128, 0:64]
        t = nl.load(x)
        buf = nl.zeros((128, 64), dtype=nl.float32)
        buf[...] = nl.exp(t, mask=(i_f < 16))
        buf[...] = nl.add(t, 100.0, mask=False)
        buf[:, :] = nisa.affine_select(pred=(i_p >= i_f), on_true_tile=t, on_false_value=-1.0, mask=(i_f >= 48))
        nl.store(out, buf)
        return out

    x = rng.standard_normal((128, 64)).astype(np.float32)
    ref = np.zeros_like(x)
    ref[:, :16] = np.exp(x[:, :16])
    ip, jf = np.mgrid[0:128, 0:64]
    ref[:, 48:] = np.where(ip >= jf, x, -1.0)[:, 48:]
    np.testing.assert_allclose(k(x), ref, rtol=1e-6)


def test_nc_version_is_comparable():
    @nki.jit
    def k(x):
        out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
        nl.store(out, nl.full((1, 1), int(nisa.get_nc_version() >= nisa.nc_version.gen3), dtype=nl.int32))
        return out

    assert k(np.zeros(1, np.float32))[0, 0] == 1
