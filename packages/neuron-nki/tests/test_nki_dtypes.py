"""Every NKI dtype round-trips through HBM → SBUF → HBM, stored exactly (NKI_PRECISE_FP=1)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nki
import nki.isa as nisa
import nki.language as nl

ALL = ["bool_", "int8", "int16", "int32", "uint8", "uint16", "uint32", "float16", "float32", "bfloat16", "tfloat32",
       "float8_e4m3", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"]


@pytest.mark.parametrize("name", ALL)
def test_roundtrip_and_cast_from_fp32(name, rng):
    dtype = getattr(nl, name)
    vals = rng.uniform(0.25, 8, (16, 8)).astype(np.float32)

    @nki.jit
    def k(src):
        t = nl.ndarray(src.shape, dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=src)  # cast via fp32, rounds to dtype
        out = nl.ndarray(src.shape, dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    out = nki.simulate(k)(vals)
    assert out.dtype == dtype
    if name == "tfloat32":
        bits = out.view(np.uint32)
        assert (bits & 0x1FFF == 0).all()  # 10-bit mantissa
        np.testing.assert_allclose(out, vals, rtol=2 ** -10)
    elif name == "bool_":
        assert out.all()
    elif np.dtype(dtype).kind in "iu":
        np.testing.assert_array_equal(out, np.rint(vals).astype(dtype))
    else:
        np.testing.assert_array_equal(out, vals.astype(dtype))


def test_packed_mx_types_are_tagged_uint32():
    for name in ("float8_e5m2_x4", "float8_e4m3fn_x4", "float4_e2m1fn_x4"):
        d = getattr(nl, name)
        assert d == np.uint32 and d.metadata["nki"] == name and d.itemsize == 4


def test_int_saturation_and_nan_to_zero():
    vals = np.array([[1e10, -1e10, np.nan, 2.5, -2.5]], np.float32)

    @nki.jit
    def k(src):
        t = nl.ndarray(src.shape, nl.int8)
        nisa.dma_copy(dst=t, src=src)
        out = nl.ndarray(src.shape, nl.int8, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    np.testing.assert_array_equal(nki.simulate(k)(vals), [[127, -128, 0, 2, -2]])


def test_private_hbm_scratch_no_reorder_and_tile_size():
    @nki.jit
    def k(x):
        scratch = nl.ndarray(x.shape, x.dtype, buffer=nl.private_hbm)
        with nl.no_reorder():
            nisa.dma_copy(dst=scratch, src=x)
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=scratch)
        ts = nl.tile_size
        assert (ts.psum_bank_fmax, ts.psum_bank_fmax_bytes, ts.psum_min_align, ts.sbuf_min_align) == (512, 2048, 4, 1)
        assert ts.sbuf_size_bytes == 28 * 2 ** 20 and ts.sbuf_fmax == 224 * 1024 // 4
        return out

    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(nki.simulate(k)(x), x)


def test_hbm_partition_broadcast_view(rng):
    w = rng.standard_normal(16).astype(np.float32)

    @nki.jit
    def k(v):
        t = nl.ndarray((128, 16), nl.float32)
        nisa.dma_copy(dst=t, src=v.reshape((1, 16)).broadcast((128, 16)))
        out = nl.ndarray((128, 16), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    np.testing.assert_array_equal(nki.simulate(k)(w), np.broadcast_to(w, (128, 16)))


def test_ml_dtypes_inputs_accepted(rng):
    x = rng.standard_normal((4, 4)).astype(ml_dtypes.float8_e5m2)

    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.copy(nl.load(a), dtype=nl.float32))
        return out

    np.testing.assert_array_equal(nki.simulate(k)(x), x.astype(np.float32))
