"""nki.isa instructions (dst-first) against NumPy references."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from nki_testutil import bf16, sim

import nki
import nki.isa as nisa
import nki.language as nl


def _new(shape, dtype=nl.float32, buffer=nl.sbuf):
    return nl.ndarray(shape, dtype, buffer=buffer)


def _side_by_side(*tiles):
    """One fp32 tile holding `tiles` next to each other along the free axis: a kernel's several results in one
    output."""
    out = _new((tiles[0].shape[0], sum(t.shape[1] for t in tiles)))
    start = 0
    for t in tiles:
        nisa.tensor_copy(out[:, start:start + t.shape[1]], t)
        start += t.shape[1]
    return out


def test_nc_matmul_fp32_bf16_fp8(rng):
    for dt_, tol in ((np.float32, 1e-4), (ml_dtypes.bfloat16, 1e-3), (ml_dtypes.float8_e4m3, 1e-3)):
        s = (rng.standard_normal((128, 96)) * 2).astype(dt_)
        m = (rng.standard_normal((128, 512)) * 2).astype(dt_)

        def body(a, b):
            d = _new((96, 512), buffer=nl.psum)
            nisa.nc_matmul(d, a, b)
            return d

        ref = s.astype(np.float32).T @ m.astype(np.float32)
        np.testing.assert_allclose(sim(body, s, m), ref, rtol=tol, atol=tol * 10)


def test_nc_matmul_accumulate_modes(rng):
    s = rng.standard_normal((64, 32)).astype(np.float32)
    m = rng.standard_normal((64, 48)).astype(np.float32)
    p = s.T @ m

    def body(a, b):
        d = _new((32, 48), buffer=nl.psum)
        nisa.nc_matmul(d, a, b)  # first write: overwrite (NaN-filled PSUM is not read)
        nisa.nc_matmul(d, a, b)  # auto: accumulate
        nisa.nc_matmul(d, a, b, accumulate=True)
        e = _new((32, 48), buffer=nl.psum)
        nisa.nc_matmul(e, a, b)
        nisa.nc_matmul(e, a, b, accumulate=False)  # overwrite
        return _side_by_side(d, e)

    out = sim(body, s, m)
    np.testing.assert_allclose(out[:, :48], 3 * p, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out[:, 48:], p, rtol=1e-4, atol=1e-4)


def test_nc_matmul_pe_tiling_and_double_row(rng):
    s = rng.standard_normal((64, 64)).astype(np.float32)
    m = rng.standard_normal((64, 128)).astype(np.float32)

    def body(a, b):
        d = _new((64, 128), buffer=nl.psum)
        nisa.nc_matmul(d, a, b, tile_position=(64, 0), tile_size=(64, 64))
        return d

    np.testing.assert_allclose(sim(body, s, m), s.T @ m, rtol=1e-4, atol=1e-4)
    s8 = rng.standard_normal((128, 2, 16)).astype(ml_dtypes.float8_e4m3)
    m8 = rng.standard_normal((128, 2, 32)).astype(ml_dtypes.float8_e4m3)

    def body2(a, b):
        d = _new((16, 32), buffer=nl.psum)
        nisa.nc_matmul(d, a, b, perf_mode=nisa.matmul_perf_mode.double_row)
        return d

    ref = s8.astype(np.float32).reshape(256, 16).T @ m8.astype(np.float32).reshape(256, 32)
    np.testing.assert_allclose(sim(body2, s8, m8), ref, rtol=1e-4, atol=1e-3)


def test_nc_transpose_tensor_and_vector(rng):
    a = rng.standard_normal((128, 96)).astype(np.float32)

    def body(x):
        d = _new((96, 128), buffer=nl.psum)
        nisa.nc_transpose(d, x, engine=nisa.engine.tensor)
        return d

    np.testing.assert_array_equal(sim(body, a), a.T)
    b = rng.standard_normal((32, 16)).astype(np.float32)

    def body2(x):
        d = _new((16, 32))
        nisa.nc_transpose(d, x)
        return d

    np.testing.assert_array_equal(sim(body2, b), b.T)


def test_activation_scale_bias_and_reduce(rng):
    a = rng.standard_normal((64, 32)).astype(np.float32)
    bias = rng.standard_normal((64, 1)).astype(np.float32)

    def body(x, b):
        d = _new(x.shape)
        r = _new((64, 1))
        nisa.activation(d, nl.exp, x, bias=b, scale=0.5, reduce_op=nl.add, reduce_res=r,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        return _side_by_side(d, r)

    out = sim(body, a, bias)
    ref = np.exp(a * 0.5 + bias)
    np.testing.assert_allclose(out[:, :32], ref, rtol=1e-5)
    np.testing.assert_allclose(out[:, 32], ref.sum(1), rtol=1e-5)


def test_activation_register_accumulates_across_instructions(rng):
    a = rng.standard_normal((16, 8)).astype(np.float32)

    def body(x):
        d = _new(x.shape)
        r = _new((16, 1))
        nisa.activation(d, nl.copy, x, reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.activation(d, nl.square, x, reduce_op=nl.add, reduce_res=r, reduce_cmd=nisa.reduce_cmd.reduce)
        return r

    np.testing.assert_allclose(sim(body, a)[:, 0], a.sum(1) + (a * a).sum(1), rtol=1e-5)


def test_activation_reduce_and_numpy_ops(rng):
    a = rng.standard_normal((32, 16)).astype(np.float32)

    def body(x):
        d = _new(x.shape)
        r = _new((32, 1))
        nisa.activation_reduce(d, np.square, x, reduce_op=nl.add, reduce_res=r, scale=2.0)
        return r

    np.testing.assert_allclose(sim(body, a)[:, 0], ((2 * a) ** 2).sum(1), rtol=1e-5)


def test_activate2_on_trn3(monkeypatch, rng):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    a = rng.standard_normal((16, 32)).astype(np.float32)

    def body(x):
        d = _new(x.shape)
        nisa.activate2(d, nl.relu, x, imm0=2.0, imm1=0.5, op0=nl.multiply, op1=nl.add)
        return d

    np.testing.assert_allclose(sim(body, a), np.maximum(a * 2 + 0.5, 0), rtol=1e-6)


@pytest.mark.parametrize("op,ref", [(nl.add, np.add), (nl.subtract, np.subtract), (nl.multiply, np.multiply),
                                    (nl.maximum, np.maximum), (nl.divide, np.divide), (nl.power, np.power),
                                    (nl.greater, lambda a, b: (a > b).astype(np.float32))])
def test_tensor_tensor(op, ref, rng):
    a = rng.uniform(0.5, 2, (64, 128)).astype(np.float32)
    b = rng.uniform(0.5, 2, (64, 128)).astype(np.float32)

    def body(x, y):
        d = _new(x.shape)
        nisa.tensor_tensor(d, x, y, op)
        return d

    np.testing.assert_allclose(sim(body, a, b), ref(a, b), rtol=1e-5)


def test_tensor_tensor_bitvec_and_psum_operand(rng):
    a = rng.integers(0, 255, (8, 8)).astype(np.int32)
    b = rng.integers(0, 255, (8, 8)).astype(np.int32)

    def body(x, y):
        d = nl.ndarray(x.shape, nl.int32)
        nisa.tensor_tensor(d, x, y, nl.bitwise_xor)
        return d

    np.testing.assert_array_equal(sim(body, a, b), a ^ b)
    f = rng.standard_normal((16, 16)).astype(np.float32)

    def body2(x):
        p = _new(x.shape, buffer=nl.psum)
        nisa.tensor_copy(p, x)
        d = _new(x.shape)
        nisa.tensor_tensor(d, p, x, np.add)
        return d

    np.testing.assert_allclose(sim(body2, f), 2 * f)


def test_tensor_scalar_two_ops_reverse_and_vector_operand(rng):
    a = rng.standard_normal((32, 64)).astype(np.float32)
    v = rng.standard_normal((32, 1)).astype(np.float32)

    def body(x, vv):
        d = _new(x.shape)
        nisa.tensor_scalar(d, x, nl.subtract, vv, reverse0=True, op1=nl.multiply, operand1=3.0)
        return d

    np.testing.assert_allclose(sim(body, a, v), (v - a) * 3.0, rtol=1e-6)


def test_scalar_tensor_tensor(rng):
    a, b = rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal((16, 32)).astype(np.float32)

    def body(x, y):
        d = _new(x.shape)
        nisa.scalar_tensor_tensor(dst=d, data=x, op0=nl.multiply, operand0=2.0, op1=nl.add, operand1=y)
        return d

    np.testing.assert_allclose(sim(body, a, b), a * 2 + b, rtol=1e-6)


@pytest.mark.parametrize("negate", [False, True])
def test_tensor_reduce(negate, rng):
    a = rng.standard_normal((64, 4, 32)).astype(np.float32)

    def body(x):
        d = _new((64, 4))
        nisa.tensor_reduce(d, nl.maximum, x, axis=2, negate=negate)
        return d

    ref = a.max(axis=2)
    np.testing.assert_allclose(sim(body, a), -ref if negate else ref)


def test_tensor_reduce_bf16_add_and_keepdims(rng):
    a = bf16(rng.standard_normal((32, 64)))

    def body(x):
        d = nl.ndarray((32, 1), nl.float32)
        nisa.tensor_reduce(d, nl.add, x, axis=(1,), keepdims=True)
        return d

    np.testing.assert_allclose(sim(body, a), a.astype(np.float32).sum(1, keepdims=True), rtol=1e-5)


def test_tensor_partition_reduce(rng):
    a = rng.standard_normal((32, 16)).astype(np.float32)

    def body(x):
        d = _new((1, 16))
        nisa.tensor_partition_reduce(d, nl.add, x)
        return d

    np.testing.assert_allclose(sim(body, a), a.sum(0, keepdims=True), rtol=1e-5)


def test_tensor_scalar_reduce_and_cumulative(rng):
    a = rng.standard_normal((16, 32)).astype(np.float32)

    def body(x):
        d = _new(x.shape)
        r = _new((16, 1))
        nisa.tensor_scalar_reduce(dst=d, data=x, op0=nl.multiply, operand0=2.0, reduce_op=nl.add, reduce_res=r)
        c = _new(x.shape)
        nisa.tensor_scalar_cumulative(c, x, op0=nl.add, op1=nl.add, imm0=1.0)
        return _side_by_side(d, r, c)

    out = sim(body, a)
    np.testing.assert_allclose(out[:, :32], 2 * a, rtol=1e-6)
    np.testing.assert_allclose(out[:, 32], (2 * a).sum(1), rtol=1e-5)
    np.testing.assert_allclose(out[:, 33:], np.cumsum(a + 1, axis=1), rtol=1e-5, atol=1e-5)


def test_tensor_tensor_scan(rng):
    a = rng.uniform(0.5, 1, (16, 24)).astype(np.float32)
    b = rng.standard_normal((16, 24)).astype(np.float32)
    init = rng.standard_normal((16, 1)).astype(np.float32)

    def body(x, y, i0):
        d = _new(x.shape)
        nisa.tensor_tensor_scan(d, x, y, i0, op0=nl.multiply, op1=nl.add)
        return d

    ref = np.empty_like(a)
    prev = init[:, 0]
    for i in range(a.shape[1]):
        prev = a[:, i] * prev + b[:, i]
        ref[:, i] = prev
    np.testing.assert_allclose(sim(body, a, b, init), ref, rtol=1e-5, atol=1e-5)

    def body2(x, y):
        d = _new(x.shape)
        nisa.tensor_tensor_scan(d, x, y, 0.0, op0=nl.maximum, op1=nl.add)
        return d

    ref2 = np.empty_like(a)
    prev = np.zeros(16, np.float32)
    for i in range(a.shape[1]):
        prev = np.maximum(a[:, i], prev) + b[:, i]
        ref2[:, i] = prev
    np.testing.assert_allclose(sim(body2, a, b), ref2, rtol=1e-5, atol=1e-5)


def test_tensor_copy_casts_and_engines(rng):
    a = rng.standard_normal((16, 16)).astype(np.float32)
    for eng in (nisa.engine.vector, nisa.engine.scalar, nisa.engine.gpsimd):
        def body(x, e=eng):
            d = nl.ndarray(x.shape, nl.bfloat16)
            nisa.tensor_copy(d, x, engine=e)
            return d

        np.testing.assert_array_equal(sim(body, a), bf16(a))


def test_tensor_copy_predicated(rng):
    a, b = rng.standard_normal((8, 8)).astype(np.float32), rng.standard_normal((8, 8)).astype(np.float32)
    pred = (rng.random((8, 8)) > 0.5).astype(np.uint8)

    def body(x, y, p):
        nisa.tensor_copy_predicated(dst=x, src=y, predicate=p)
        return x

    np.testing.assert_array_equal(sim(body, a, b, pred), np.where(pred != 0, b, a))


def test_memset_iota(rng):
    def body(x):
        d = nl.ndarray((8, 4, 6), nl.int32)
        nisa.iota(d, [[6, 4], [1, 6]], offset=3, channel_multiplier=100)
        z = nl.ndarray((8, 24), nl.float32)
        nisa.memset(z, 1.5)
        out = nl.ndarray((8, 48), nl.float32)
        nisa.tensor_copy(out[:, 0:24], d.reshape((8, 24)))
        nisa.tensor_copy(out[:, 24:48], z)
        return out

    out = sim(body, np.zeros((1, 1), np.float32))
    ref = 3 + 100 * np.arange(8)[:, None] + np.arange(24)[None, :]
    np.testing.assert_array_equal(out[:, :24], ref)
    assert (out[:, 24:] == 1.5).all()


def test_affine_select_causal_mask(rng):
    a = rng.standard_normal((16, 16)).astype(np.float32)

    def body(x):
        d = _new(x.shape)
        # keep where row - col >= 0  (lower triangle)
        nisa.affine_select(d, pattern=[[-1, 16]], channel_multiplier=1, on_true_tile=x, on_false_value=-9999.0,
                           cmp_op=nl.greater_equal)
        return d

    np.testing.assert_array_equal(sim(body, a), np.where(np.tri(16, dtype=bool), a, -9999.0))


def test_range_select_and_select_reduce(rng):
    a = rng.standard_normal((8, 16)).astype(np.float32)
    lo = np.full((8, 1), 2, np.float32)
    hi = np.full((8, 1), 10, np.float32)

    def body(x, b0, b1):
        d = _new(x.shape)
        r = _new((8, 1))
        nisa.range_select(dst=d, on_true_tile=x, comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=b0, bound1=b1,
                          reduce_res=r, reduce_op=nl.maximum, range_start=0, on_false_value=-1e30)
        return _side_by_side(d, r)

    out = sim(body, a, lo, hi)
    keep = (np.arange(16) >= 2) & (np.arange(16) < 10)
    ref = np.where(keep[None, :], a, np.float32(-1e30))
    np.testing.assert_array_equal(out[:, :16], ref)
    np.testing.assert_array_equal(out[:, 16], ref.max(1))
    pred = (rng.random((8, 16)) > 0.5).astype(np.uint8)

    def body2(x, p):
        d = _new(x.shape)
        r = _new((8, 1))
        nisa.select_reduce(dst=d, predicate=p, on_true=x, on_false=0.0, reduce_res=r,
                           reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_op=nl.maximum)
        return _side_by_side(d, r)

    out = sim(body2, a, pred)
    ref = np.where(pred != 0, a, 0)
    np.testing.assert_array_equal(out[:, :16], ref)
    np.testing.assert_array_equal(out[:, 16], ref.max(1))


def test_bn_stats_bn_aggr(rng):
    a = rng.standard_normal((32, 1024)).astype(np.float32) * 3 + 1

    def body(x):
        st = _new((32, 12))
        for i in range(2):
            nisa.bn_stats(st[:, i * 6:(i + 1) * 6], x[:, i * 512:(i + 1) * 512])
        mv = _new((32, 2))
        nisa.bn_aggr(mv, st)
        return mv

    out = sim(body, a)
    np.testing.assert_allclose(out[:, 0], a.mean(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[:, 1], a.var(1), rtol=1e-4)


def test_reciprocal_exponential(monkeypatch, rng):
    a = rng.uniform(0.5, 2, (16, 16)).astype(np.float32)

    def body(x):
        d = _new(x.shape)
        nisa.reciprocal(d, x)
        return d

    np.testing.assert_allclose(sim(body, a), 1 / a, rtol=1e-6)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    m = a.max(1, keepdims=True)

    def body2(x, mx):
        d = _new(x.shape)
        r = _new((16, 1))
        nisa.exponential(d, x, max_value=mx, reduce_res=r, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        return r

    np.testing.assert_allclose(sim(body2, a, m)[:, 0], np.exp(a - m).sum(1), rtol=1e-5)


def test_max8_find_index8_match_replace8(rng):
    a = rng.permutation(np.arange(4 * 64, dtype=np.float32)).reshape(4, 64)
    top = -np.sort(-a, axis=1)[:, :8]

    def body(x):
        m = _new((4, 8))
        nisa.max8(m, x)
        i = nl.ndarray((4, 8), nl.uint32)
        nisa.nc_find_index8(i, x, m)
        r = _new(x.shape)
        nisa.nc_match_replace8(r, x, m, imm=-1.0)
        return _side_by_side(m, i, r)

    out = sim(body, a)
    np.testing.assert_array_equal(out[:, :8], top)
    np.testing.assert_array_equal(out[:, 8:16], np.argsort(-a, axis=1)[:, :8])
    ref = a.copy()
    np.put_along_axis(ref, np.argsort(-a, axis=1)[:, :8], -1.0, axis=1)
    np.testing.assert_array_equal(out[:, 16:], ref)


def test_nc_n_gather_and_stream_shuffle(rng):
    a = rng.standard_normal((32, 16)).astype(np.float32)
    idx = rng.integers(0, 16, (32, 5)).astype(np.uint32)

    def body(x, i):
        d = _new((32, 5))
        nisa.nc_n_gather(d, x, i)
        return d

    np.testing.assert_array_equal(sim(body, a, idx), np.take_along_axis(a, idx.astype(np.int64), 1))
    mask = list(range(31, -1, -1))

    def body2(x):
        d = _new(x.shape)
        nisa.nc_stream_shuffle(d, x, mask)
        return d

    np.testing.assert_array_equal(sim(body2, a), a[::-1])


def test_nonzero_with_count_and_sequence_bounds():
    a = np.zeros((32, 8), np.float32)
    a[0] = [0, 1, 1, 0, 0, 1, 0, 0]
    a[16] = [1, 0, 0, 0, 0, 0, 0, 1]

    def body(x):
        d = nl.ndarray((32, 9), nl.int32)
        nisa.memset(d, 0)
        nisa.nonzero_with_count(d, x, index_offset=16, padding_val=-1)
        return d

    out = sim(body, a)
    np.testing.assert_array_equal(out[0], [17, 18, 21, -1, -1, -1, -1, -1, 3])
    np.testing.assert_array_equal(out[16], [16, 23, -1, -1, -1, -1, -1, -1, 2])
    assert (out[1] == 0).all()
    seg = np.array([[1, 1, 2, 2, 2, 0, 3, 0]], np.int32)

    def body2(s):
        d = nl.ndarray((1, 2, 8), nl.int32)
        nisa.sequence_bounds(d, s)
        return d

    out = sim(body2, seg)
    np.testing.assert_array_equal(out[0, 0], [0, 0, 2, 2, 2, 8, 6, 8])
    np.testing.assert_array_equal(out[0, 1], [2, 2, 5, 5, 5, -1, 7, -1])


def test_dma_copy_cast_dma_transpose_dma_compute(rng):
    a = rng.standard_normal((16, 32)).astype(np.float32)
    b = rng.standard_normal((16, 32)).astype(np.float32)

    @nki.jit
    def k(x, y):
        t = nl.ndarray((32, 16), nl.float32, buffer=nl.sbuf)
        nisa.dma_transpose(t, x)
        s = nl.ndarray(x.shape, nl.float32, buffer=nl.shared_hbm)
        nisa.dma_compute(s, [x, y], reduce_op=nl.add)
        o = nl.ndarray((32, 16), nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o, src=t)
        return o, s

    o, s = nki.simulate(k)(a, b)
    np.testing.assert_array_equal(o, bf16(a.T))
    np.testing.assert_allclose(s, a + b, rtol=1e-6)


def test_rng_dropout_rand2_seeds(monkeypatch):
    def body(x):
        seed = nl.ndarray((1, 1), nl.uint32)
        nisa.memset(seed, 42)
        nisa.set_rng_seed(seed)
        r = nl.ndarray((8, 16), nl.uint16)
        nisa.rng(r)
        d = _new(x.shape)
        nisa.dropout(d, x, 0.0)
        st = nl.ndarray((8, 6), nl.uint32)
        nisa.rand_set_state(nl.full((8, 6), 3, nl.uint32))
        nisa.rand_get_state(st)
        return _side_by_side(r, d, st)

    x = np.ones((8, 16), np.float32)
    o1, o2 = sim(body, x), sim(body, x)
    np.testing.assert_array_equal(o1, o2)
    assert (o1[:, 16:32] == 1).all() and (o1[:, 32:] == 3).all() and o1[:, :16].max() < 65536
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")

    def body2(x):
        d = _new(x.shape)
        nisa.rand2(d, 2.0, 3.0)
        return d

    o = sim(body2, x)
    assert ((o >= 2) & (o <= 3)).all()


def test_registers_and_dynamic_range():
    @nki.jit
    def k(n):
        reg = nisa.register_alloc()
        nisa.register_load(reg, n)
        acc = nl.zeros((1, 1), nl.int32)
        for _ in nl.dynamic_range(reg):
            nisa.tensor_scalar(acc, acc, nl.add, 2)
        r2 = nisa.register_alloc(0)
        nisa.register_move(r2, reg)
        out = nl.ndarray((1, 2), nl.int32, buffer=nl.shared_hbm)
        nisa.register_store(out[:, 1:2], r2)
        nisa.dma_copy(dst=out[:, 0:1], src=acc)
        return out

    np.testing.assert_array_equal(nki.simulate(k)(np.array([[5]], np.int32)), [[10, 5]])


def test_get_nc_version(monkeypatch):
    assert nisa.get_nc_version() == nisa.nc_version.gen3
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    assert nisa.get_nc_version() == nisa.nc_version.gen2


def test_enums():
    assert {e.name for e in nisa.engine} == {"tensor", "vector", "scalar", "gpsimd", "dma", "sync", "unknown"}
    assert {e.name for e in nisa.reduce_cmd} == {"idle", "reset", "reduce", "reset_reduce", "load_reduce"}
    assert {e.name for e in nisa.dge_mode} == {"unknown", "swdge", "hwdge", "none"}
    assert {e.name for e in nisa.oob_mode} == {"error", "skip"}


@pytest.mark.parametrize("k", [5, 24])
def test_topk_per_16_partition_group_in_snake_layout(k, rng):
    """AWS's nki.isa.topk page: each 16-partition group is one problem read in a snake layout (element e at
    partition e % 16, position e // 16) over its first n elements; the k results (ascending) and their indices
    are written in the same snake layout; slots past the k results keep their values."""
    n = 40
    src = rng.permutation(np.arange(32 * 4)).reshape(32, 4).astype(ml_dtypes.bfloat16)  # distinct, exact in bf16

    def body(x):
        v = nl.ndarray((32, k), nl.bfloat16)
        i = nl.ndarray((32, k), nl.uint32)
        nisa.memset(v, -1.0)
        nisa.memset(i, 7777)
        nisa.topk(v, i, x, n)
        out = _new((32, 2 * k))
        nisa.tensor_copy(out[:, 0:k], v)
        nisa.tensor_copy(out[:, k:2 * k], i)
        return out

    out = sim(body, src)
    cols = -(-k // 16)
    for g in range(2):
        snake = src[16 * g:16 * g + 16].astype(np.float32).T.reshape(-1)[:n]
        idx = np.argsort(snake, kind="stable")[n - k:]  # the k largest, ascending
        for arr, ref, fill in ((out[:, :k], snake[idx], -1.0), (out[:, k:], idx, 7777)):
            block = arr[16 * g:16 * g + 16]
            laid = np.full((cols * 16,), fill, np.float64)
            laid[:k] = ref
            np.testing.assert_array_equal(block[:, :cols], laid.reshape(cols, 16).T)
            np.testing.assert_array_equal(block[:, cols:], fill)


def test_topk_checks_the_documented_constraints():
    def body(x, dtype=nl.bfloat16, n=16):
        v = nl.ndarray((16, 4), dtype)
        nisa.topk(v, nl.ndarray((16, 4), nl.uint32), x, n)
        return v

    x = np.ones((16, 2), ml_dtypes.bfloat16)
    with pytest.raises(nki.NkiValidationError, match="bfloat16 src"):
        sim(lambda t: body(t, dtype=nl.float32), x)
    with pytest.raises(nki.NkiValidationError, match="8 <= n"):
        sim(lambda t: body(t, n=33), x)  # src holds 16 * 2 = 32 snake slots
    with pytest.raises(nki.NkiValidationError, match="multiple of 16"):
        sim(lambda t: body(t), np.ones((8, 2), ml_dtypes.bfloat16))


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3, ml_dtypes.float8_e5m2])
def test_low_precision_inputs_compute_fp32_round_once(dtype, rng):
    a = rng.uniform(-4, 4, (32, 64)).astype(dtype)
    b = rng.uniform(-4, 4, (32, 64)).astype(dtype)
    af, bf = a.astype(np.float32), b.astype(np.float32)

    def body(x, y):
        tt = nl.ndarray(x.shape, dtype)
        nisa.tensor_tensor(tt, x, y, nl.multiply)
        ts = nl.ndarray(x.shape, dtype)
        nisa.tensor_scalar(ts, x, nl.multiply, 0.5, op1=nl.add, operand1=1.0)
        act = nl.ndarray(x.shape, dtype)
        nisa.activation(act, nl.tanh, x, scale=0.5)
        red = nl.ndarray((32, 1), nl.float32)
        nisa.tensor_reduce(red, nl.add, y, axis=1)
        out = nl.ndarray((32, 193), nl.float32)
        for i, t in enumerate((tt, ts, act)):
            nisa.tensor_copy(out[:, i * 64:(i + 1) * 64], t)
        nisa.tensor_copy(out[:, 192:193], red)
        return out

    out = sim(body, a, b)
    np.testing.assert_array_equal(out[:, 0:64], (af * bf).astype(dtype).astype(np.float32))
    np.testing.assert_array_equal(out[:, 64:128], (af * 0.5 + 1.0).astype(dtype).astype(np.float32))
    np.testing.assert_array_equal(out[:, 128:192], np.tanh(af * 0.5).astype(dtype).astype(np.float32))
    np.testing.assert_allclose(out[:, 192], bf.sum(1), rtol=1e-5, atol=1e-5)


def test_bitvec_tensor_scalar_and_reduce(rng):
    a = rng.integers(0, 1 << 16, (16, 32)).astype(np.int32)

    def body(x):
        d = nl.ndarray(x.shape, nl.int32)
        nisa.tensor_scalar(d, x, nl.bitwise_and, 0xFF, op1=nl.left_shift, operand1=2)
        r = nl.ndarray((16, 1), nl.int32)
        nisa.tensor_reduce(r, nl.bitwise_or, x, axis=1)
        out = nl.ndarray((16, 33), nl.int32)
        nisa.tensor_copy(out[:, 0:32], d)
        nisa.tensor_copy(out[:, 32:33], r)
        return out

    out = sim(body, a)
    np.testing.assert_array_equal(out[:, :32], (a & 0xFF) << 2)
    np.testing.assert_array_equal(out[:, 32], np.bitwise_or.reduce(a, axis=1))


def test_bitvec_on_float_is_rejected():
    def body(x):
        d = nl.ndarray(x.shape, nl.float32)
        nisa.tensor_tensor(d, x, x, nl.bitwise_and)
        return d

    with pytest.raises(nki.NkiValidationError, match="needs integer inputs"):
        sim(body, np.ones((4, 4), np.float32))


def test_activation_reads_psum_writes_psum(rng):
    a = rng.standard_normal((32, 64)).astype(np.float32)

    def body(x):
        p = nl.ndarray(x.shape, nl.float32, buffer=nl.psum)
        nisa.tensor_copy(p, x)
        q = nl.ndarray(x.shape, nl.float32, buffer=nl.psum)
        nisa.activation(q, nl.sigmoid, p, scale=2.0, bias=1.0)
        return q

    np.testing.assert_allclose(sim(body, a), 1 / (1 + np.exp(-(2 * a + 1))), rtol=1e-6)


def test_local_gather_per_core_indices(rng):
    src = (rng.random((128, 64, 4)) * 100).astype(np.float32)
    per_core = rng.integers(0, 64, (16, 4)).astype(np.uint16)
    index = np.tile(per_core, (8, 1))
    k, nv = 4, 48

    def body(x, i):
        d = nl.ndarray((128, nv, k), nl.float32)
        ii = nl.ndarray(i.shape, nl.uint16)
        nisa.tensor_copy(ii, i)
        nisa.tensor_scalar(ii, ii, nl.multiply, k)  # hardware indices are element offsets
        nisa.local_gather(d, x, ii, num_elem_per_idx=k, num_valid_indices=nv)
        return d

    out = sim(body, src, index)
    ref = np.empty((128, nv, k), np.float32)
    for c in range(8):
        ids = index[16 * c:16 * c + 16].flatten(order="F")[:nv]
        ref[16 * c:16 * c + 16] = np.take(src[16 * c:16 * c + 16], ids.astype(np.int64), axis=1)
    np.testing.assert_array_equal(out, ref)


# -- MX formats (AWS's nki.isa.quantize_mx / nc_matmul_mx pages and the MXFP matmul deep dive) ----------------
def _mx_scale_rows(p):
    """Scale partition of each 8-partition group: the first 4 partitions of each 32-partition quadrant."""
    return np.array([32 * (g // 4) + g % 4 for g in range(p // 8)])


def _pack_x4(values_fp8):
    """[P, 4F] fp8 -> [P, F] uint32, value i of each group of 4 in byte i."""
    p, f4 = values_fp8.shape
    return np.ascontiguousarray(values_fp8).view(np.uint8).reshape(p, f4 // 4, 4).view("<u4").reshape(p, f4 // 4)


def test_quantize_mx_scales_groups_of_8_partitions_by_4_values(monkeypatch, rng):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    x = (rng.standard_normal((64, 16)) * np.exp2(rng.integers(-6, 6, (64, 1)))).astype(ml_dtypes.bfloat16)
    x[8:16, 4:8] = 0  # an all-zero group

    def quantized(x_t, want_scale):
        q = nl.ndarray((64, 4), nl.float8_e4m3fn_x4)
        sc = nl.ndarray((64, 4), nl.uint8)
        nisa.memset(sc, 0)
        nisa.quantize_mx(dst=q, src=x_t, dst_scale=sc)
        return sc if want_scale else q

    packed = sim(lambda t: quantized(t, False), x)
    scale = sim(lambda t: quantized(t, True), x)
    xf = x.astype(np.float32).reshape(8, 8, 4, 4)
    amax = np.abs(xf).max(axis=(1, 3))
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(amax)) - 8 + 1, -127)  # e4m3fn emax 8, block scale x2
    ref_q = (xf / np.exp2(e)[:, None, :, None]).reshape(64, 16).astype(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(np.asarray(packed).astype(np.uint32), _pack_x4(ref_q))
    ref_scale = np.zeros((64, 4), np.uint8)
    ref_scale[_mx_scale_rows(64)] = (e + 127).astype(np.uint8)
    np.testing.assert_array_equal(scale, ref_scale)
    assert np.abs(ref_q.astype(np.float32)).max() <= 448  # the doubled scale leaves headroom: no saturation


def test_nc_matmul_mx_dequantizes_and_contracts_4_values_per_x4_element(monkeypatch, rng):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    k, m, n = 32, 16, 24
    s_vals = rng.uniform(-4, 4, (k, 4 * m)).astype(ml_dtypes.float8_e5m2)
    m_vals = rng.uniform(-4, 4, (k, 4 * n)).astype(ml_dtypes.float8_e5m2)
    s_exp = rng.integers(120, 134, (k // 8, m)).astype(np.uint8)
    m_exp = rng.integers(120, 134, (k // 8, n)).astype(np.uint8)
    s_scale = np.zeros((k, m), np.uint8)
    m_scale = np.zeros((k, n), np.uint8)
    s_scale[_mx_scale_rows(k)] = s_exp
    m_scale[_mx_scale_rows(k)] = m_exp

    @nki.jit
    def kernel(sd, ss, md, ms):
        tiles = []
        for a, dtype in ((sd, nl.float8_e5m2_x4), (ss, nl.uint8), (md, nl.float8_e5m2_x4), (ms, nl.uint8)):
            t = nl.ndarray(a.shape, dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=a.ap(pattern=[[a.shape[1], a.shape[0]], [1, a.shape[1]]], dtype=dtype))
            tiles.append(t)
        ps = nl.ndarray((m, n), nl.float32, buffer=nl.psum)
        nisa.nc_matmul_mx(ps, tiles[0], tiles[2], tiles[1], tiles[3])
        sb = nl.ndarray((m, n), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=sb, src=ps)
        out = nl.ndarray((m, n), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=sb)
        return out

    out = nki.simulate(kernel)(_pack_x4(s_vals), s_scale, _pack_x4(m_vals), m_scale)
    # value (p, 4j + i) is contraction index 4p + i of column j; its scale is 2^(exp[p // 8, j] - 127)
    s_deq = s_vals.astype(np.float64).reshape(k, m, 4) * np.exp2(np.repeat(s_exp, 8, 0) - 127.0)[:, :, None]
    m_deq = m_vals.astype(np.float64).reshape(k, n, 4) * np.exp2(np.repeat(m_exp, 8, 0) - 127.0)[:, :, None]
    ref = np.einsum("kmi,kni->mn", s_deq, m_deq)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_mx_instructions_need_neuroncore_v4():
    def body(x):
        q = nl.ndarray((32, 1), nl.float8_e4m3fn_x4)
        nisa.quantize_mx(dst=q, src=x, dst_scale=nl.ndarray((32, 1), nl.uint8))
        return x

    with pytest.raises(nki.NkiValidationError, match="NeuronCore-v4"):
        sim(body, np.ones((32, 4), ml_dtypes.bfloat16))
