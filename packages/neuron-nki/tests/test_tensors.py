"""Tensors, buffers, indexing, views and storage semantics."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from nki_testutil import bf16

import nki
import nki.isa as nisa
import nki.language as nl


def test_new_tensors_are_nan_and_four_filled():
    @nki.jit
    def k():
        f = nl.ndarray((4, 8), nl.float32, buffer=nl.shared_hbm)
        i = nl.ndarray((4, 8), nl.int32, buffer=nl.shared_hbm)
        b = nl.ndarray((4, 8), nl.bfloat16, buffer=nl.shared_hbm)
        return f, i, b

    f, i, b = nki.simulate(k)()
    assert np.isnan(f).all() and np.isnan(b.astype(np.float32)).all()
    assert (i == 4).all() and i.dtype == np.int32 and b.dtype == nl.bfloat16


def test_uninitialised_sbuf_read_propagates_nan():
    @nki.jit
    def k(x):
        t = nl.ndarray(x.shape, nl.float32, buffer=nl.sbuf)
        out = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    assert np.isnan(nki.simulate(k)(np.zeros((2, 2), np.float32))).all()


def test_partly_written_tile_reads_uninitialised_elsewhere():
    """On-chip tensors are filled with their uninitialised value lazily (not when a whole-tensor write comes
    first): a partial write, a view's write or a bitcast must still leave NaN / 4 in the elements not written."""
    @nki.jit
    def k(x):
        t = nl.ndarray((2, 4), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[:, 0:2], src=x[:, 0:2])  # half of t
        whole = nl.ndarray((2, 4), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=whole, src=x)  # all of it: no fill needed
        ints = nl.ndarray((2, 4), nl.int32, buffer=nl.sbuf)
        bits = ints.view(nl.float32)
        outs = []
        for src in (t, whole, bits):
            o = nl.ndarray((2, 4), nl.float32, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=o, src=src)
            outs.append(o)
        return tuple(outs)

    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    half, whole, bits = nki.simulate(k)(x)
    np.testing.assert_array_equal(half[:, :2], x[:, :2])
    assert np.isnan(half[:, 2:]).all()
    np.testing.assert_array_equal(whole, x)
    assert (bits.view(np.int32) == 4).all()


def test_zeros_ones_full_and_like():
    @nki.jit
    def k():
        outs = []
        for t in (nl.zeros((8, 4), nl.float32), nl.ones((8, 4), nl.bfloat16), nl.full((8, 4), 2.5, nl.float32),
                  nl.zeros_like(nl.ones((8, 4), nl.int32)), nl.full_like(nl.zeros((8, 4), nl.float32), 7)):
            o = nl.ndarray(t.shape, t.dtype, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=o, src=t)
            outs.append(o)
        e = nl.empty_like(outs[0])
        assert e.shape == (8, 4) and e.buffer is nl.shared_hbm
        return tuple(outs)

    z, o, f, zi, fl = nki.simulate(k)()
    assert (z == 0).all() and (o.astype(np.float32) == 1).all() and (f == 2.5).all()
    assert (zi == 0).all() and zi.dtype == np.int32 and (fl == 7).all()


def test_dtypes_are_real_numpy_dtypes():
    assert nl.bfloat16 == np.dtype(ml_dtypes.bfloat16)
    assert nl.float8_e4m3 == np.dtype(ml_dtypes.float8_e4m3)
    assert nl.float8_e4m3fn == np.dtype(ml_dtypes.float8_e4m3fn)
    assert nl.float8_e5m2 == np.dtype(ml_dtypes.float8_e5m2)
    assert nl.tfloat32 == np.float32 and nl.float32 == np.float32
    assert np.zeros(3, nl.bfloat16).dtype == nl.bfloat16
    assert nl.fp32.max == np.finfo(np.float32).max and nl.bf16.max == float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    assert nl.finfo(nl.float8_e4m3).max == 240.0


def test_indexing_slices_ds_and_views(rng):
    x = rng.standard_normal((256, 64)).astype(np.float32)

    @nki.jit
    def k(a):
        out = nl.ndarray((128, 16), nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a[nl.ds(128, 128), 8:24])
        nl.store(out, t)
        return out

    np.testing.assert_array_equal(nki.simulate(k)(x), x[128:256, 8:24])


def test_negative_and_integer_index_and_ellipsis(rng):
    x = rng.standard_normal((4, 8, 16)).astype(np.float32)

    @nki.jit
    def k(a):
        out = nl.ndarray((8, 16), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a[-1, ...])
        return out

    np.testing.assert_array_equal(nki.simulate(k)(x), x[-1])


def test_writes_to_hbm_inputs_are_visible_to_caller(rng):
    x = rng.standard_normal((128, 32)).astype(np.float32)
    y = np.zeros_like(x)

    @nki.jit
    def k(a, out):
        t = nl.load(a)
        nl.store(out[:, :], nl.multiply(t, 2.0))

    k(x, y)
    np.testing.assert_allclose(y, 2 * x)


def test_reshape_permute_broadcast_views(rng):
    x = rng.standard_normal((128, 4, 8)).astype(np.float32)

    @nki.jit
    def k(a):
        t = nl.load(a)
        flat = t.reshape((128, 32))
        perm = t.permute(0, 2, 1)
        assert perm.shape == (128, 8, 4)
        o1 = nl.ndarray((128, 32), nl.float32, buffer=nl.shared_hbm)
        o2 = nl.ndarray((128, 8, 4), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o1, src=flat)
        c = nl.ndarray((128, 8, 4), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=c, src=perm)
        nisa.dma_copy(dst=o2, src=c)
        row = nl.load(a[0:1, 0, :])
        b = row.broadcast_to((4, 8))
        o3 = nl.ndarray((4, 8), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o3, src=b)
        return o1, o2, o3

    o1, o2, o3 = nki.simulate(k)(x)
    np.testing.assert_array_equal(o1, x.reshape(128, 32))
    np.testing.assert_array_equal(o2, x.transpose(0, 2, 1))
    np.testing.assert_array_equal(o3, np.broadcast_to(x[0:1, 0, :], (4, 8)))


def test_access_pattern_ap_and_vector_offset_gather(rng):
    data = rng.standard_normal((16, 8)).astype(np.float32)
    idx = np.array([[3], [0], [15], [7]], dtype=np.uint32)

    @nki.jit
    def k(d, ind):
        P, F = ind.shape[0], d.shape[1]
        i_sb = nl.ndarray((P, 1), nl.uint32, buffer=nl.sbuf)
        nisa.dma_copy(dst=i_sb, src=ind)
        g = nl.ndarray((P, F), d.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=g, src=d.ap(pattern=[[F, P], [1, F]], vector_offset=i_sb, indirect_dim=0))
        ev = nl.ndarray((16, 4), d.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=ev, src=d.ap([[8, 16], [2, 4]], offset=1))  # odd columns
        o1 = nl.ndarray((P, F), d.dtype, buffer=nl.shared_hbm)
        o2 = nl.ndarray((16, 4), d.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o1, src=g)
        nisa.dma_copy(dst=o2, src=ev)
        return o1, o2

    o1, o2 = nki.simulate(k)(data, idx)
    np.testing.assert_array_equal(o1, data[idx[:, 0]])
    np.testing.assert_array_equal(o2, data[:, 1::2])


def test_setitem_copies_and_fills(rng):
    x = rng.standard_normal((8, 8)).astype(np.float32)

    @nki.jit
    def k(a):
        t = nl.load(a)
        u = nl.zeros((8, 16), nl.float32)
        u[:, 0:8] = t
        u[:, 8:16] = 3.0
        out = nl.ndarray((8, 16), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, u)
        return out

    o = nki.simulate(k)(x)
    np.testing.assert_array_equal(o[:, :8], x)
    assert (o[:, 8:] == 3).all()


@pytest.mark.parametrize("precise", ["1", "0"])
def test_precise_fp_storage(monkeypatch, precise):
    monkeypatch.setenv("NKI_PRECISE_FP", precise)
    x = np.array([[1.0 + 2 ** -10, 3.0]], dtype=np.float32)

    @nki.jit
    def k(a):
        t = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        f = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=f, src=t)
        o = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=f)
        return o

    o = nki.simulate(k)(x)
    if precise == "1":
        np.testing.assert_array_equal(o, bf16(x).astype(np.float32))  # rounded to bf16
    else:
        np.testing.assert_array_equal(o, x)  # fp32 precision kept


def test_fp8_storage_rounds_and_overflows():
    x = np.array([[1.0, 300.0, 0.3, -1e6]], dtype=np.float32)

    @nki.jit
    def k(a):
        t = nl.ndarray(a.shape, nl.float8_e4m3, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a)
        o = nl.ndarray(a.shape, nl.float8_e4m3, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=t)
        return o

    o = nki.simulate(k)(x)
    assert o.dtype == nl.float8_e4m3
    np.testing.assert_array_equal(o.astype(np.float32), x.astype(ml_dtypes.float8_e4m3).astype(np.float32))


def test_fp32_overflow_gives_inf():
    x = np.array([[100.0, -100.0, 1.0]], dtype=np.float32)

    @nki.jit
    def k(a):
        t = nl.load(a)
        e = nl.exp(t)
        o = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        nl.store(o, e)
        return o

    o = nki.simulate(k)(x)
    assert np.isinf(o[0, 0]) and o[0, 1] < 1e-40 and not np.isnan(o).any()


def test_buffer_predicates_and_repr():
    @nki.jit
    def k(a):
        t = nl.load(a)
        assert nl.is_sbuf(t) and nl.is_on_chip(t) and not nl.is_hbm(t) and nl.is_hbm(a)
        p = nl.zeros((4, 4), nl.float32, buffer=nl.psum)
        assert nl.is_psum(p) and "psum" in repr(p)
        return a

    nki.simulate(k)(np.zeros((4, 4), np.float32))


def test_string_buffer_rejected():
    @nki.jit
    def k():
        nl.ndarray((4, 4), nl.float32, buffer="sbuf")

    with pytest.raises(nki.NkiValidationError, match="strings are not accepted"):
        nki.simulate(k)()


def test_api_outside_kernel_is_an_error():
    with pytest.raises(nki.NkiError, match="outside of NKI kernels"):
        nl.ndarray((4, 4), nl.float32)


def test_rearrange_slice_select(rng):
    x = rng.standard_normal((8, 12)).astype(np.float32)

    @nki.jit
    def k(a):
        t = nl.load(a)
        r = t.rearrange("p (a b) -> p b a", a=3)
        assert r.shape == (8, 4, 3)
        c = nl.ndarray((8, 4, 3), nl.float32)
        nisa.tensor_copy(dst=c, src=r)
        o1 = nl.ndarray((8, 4, 3), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o1, src=c)
        o2 = nl.ndarray((8, 3), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o2, src=t.slice(1, 2, 8, 2))
        o3 = nl.ndarray((12,), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o3, src=t.select(0, 5))
        return o1, o2, o3

    o1, o2, o3 = nki.simulate(k)(x)
    np.testing.assert_array_equal(o1, x.reshape(8, 3, 4).transpose(0, 2, 1))
    np.testing.assert_array_equal(o2, x[:, 2:8:2])
    np.testing.assert_array_equal(o3, x[5])


def test_write_masked_and_advanced_index_hook(rng):
    """Core hooks used by the legacy API: ``__nki_index__`` index expressions and masked writes."""
    x = rng.standard_normal((8, 10)).astype(np.float32)

    class Expr:
        def __init__(self, arr):
            self.arr = arr

        def __nki_index__(self):
            return self.arr

    @nki.jit
    def k(a):
        out = nl.ndarray((8, 10), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a)
        p = Expr(np.arange(8)[:, None])
        cols = np.arange(12)[None, :]
        mask = cols < 10
        view = out[p, Expr(np.where(mask, cols, 0))]  # clamp masked-out columns, then write only where mask
        assert view.shape == (8, 12)
        view.write_masked(np.zeros((8, 12), np.float32) - 1, mask & (np.arange(8)[:, None] % 2 == 0))
        return out

    out = nki.simulate(k)(x)
    ref = x.copy()
    ref[::2, :] = -1
    np.testing.assert_array_equal(out, ref)
