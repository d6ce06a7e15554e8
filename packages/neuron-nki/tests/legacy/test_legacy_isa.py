"""One test per legacy ``nisa`` instruction against a NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest
from legacy_harness import run_tiles

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl


@pytest.fixture
def rng():
    return np.random.default_rng(11)


def test_nc_matmul_and_transpose_engines(rng):
    s = rng.standard_normal((128, 64)).astype(np.float32)
    m = rng.standard_normal((128, 512)).astype(np.float32)
    small = rng.standard_normal((16, 24)).astype(np.float32)
    mm, tt, tv = run_tiles(lambda a, b, c: (nl.copy(nisa.nc_matmul(a, b)), nl.copy(nisa.nc_transpose(a)),
                                            nisa.nc_transpose(c)), s, m, small)
    np.testing.assert_allclose(mm, s.T @ m, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(tt, s.T)
    np.testing.assert_array_equal(tv, small.T)


def test_nc_transpose_engine_choice_sets_buffer():
    @nki.jit
    def k(x):
        t = nl.load(x)
        assert nisa.nc_transpose(t).buffer is nl.sbuf  # ≤32×32 → Vector Engine
        assert nisa.nc_transpose(t, engine=nisa.tensor_engine).buffer is nl.psum
        return x

    k(np.zeros((8, 8), np.float32))


def test_activation_and_activation_reduce(rng):
    x = rng.standard_normal((64, 32)).astype(np.float32)
    bias = rng.standard_normal((64, 1)).astype(np.float32)

    def body(t, b):
        red = nl.ndarray((64, 1), dtype=nl.float32)
        act = nisa.activation_reduce(op=np.tanh, data=t, reduce_op=np.add, reduce_res=red, bias=b, scale=0.5)
        return nisa.activation(op=nl.exp, data=t, bias=b, scale=2.0), act, red

    a, act, red = run_tiles(body, x, bias)
    np.testing.assert_allclose(a, np.exp(2 * x + bias), rtol=1e-5)
    np.testing.assert_allclose(act, np.tanh(0.5 * x + bias), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(red, np.tanh(0.5 * x + bias).sum(1, keepdims=True), rtol=1e-5, atol=1e-5)


def test_tensor_tensor_and_tensor_scalar(rng):
    x = rng.uniform(1, 2, (32, 16)).astype(np.float32)
    y = rng.uniform(1, 2, (32, 16)).astype(np.float32)
    col = rng.uniform(1, 2, (32, 1)).astype(np.float32)
    tt, ts, tsr = run_tiles(lambda a, b, c: (
        nisa.tensor_tensor(a, b, op=nl.multiply),
        nisa.tensor_scalar(a, op0=np.subtract, operand0=c, op1=np.multiply, operand1=3.0),
        nisa.tensor_scalar(a, np.subtract, 1.0, reverse0=True)), x, y, col)
    np.testing.assert_allclose(tt, x * y, rtol=1e-6)
    np.testing.assert_allclose(ts, (x - col) * 3, rtol=1e-6)
    np.testing.assert_allclose(tsr, 1 - x, rtol=1e-6)


def test_scalar_tensor_tensor_and_tensor_scalar_reduce(rng):
    x = rng.standard_normal((32, 16)).astype(np.float32)
    y = rng.standard_normal((32, 16)).astype(np.float32)

    def body(a, b):
        red = nl.ndarray((32, 1), dtype=nl.float32)
        stt = nisa.scalar_tensor_tensor(data=a, op0=np.multiply, operand0=2.0, op1=np.add, operand1=b)
        tsr = nisa.tensor_scalar_reduce(data=a, op0=np.add, operand0=1.0, reduce_op=np.add, reduce_res=red)
        return stt, tsr, red

    stt, tsr, red = run_tiles(body, x, y)
    np.testing.assert_allclose(stt, 2 * x + y, rtol=1e-6)
    np.testing.assert_allclose(tsr, x + 1, rtol=1e-6)
    np.testing.assert_allclose(red, (x + 1).sum(1, keepdims=True), rtol=1e-5)


def test_reductions(rng):
    x = rng.standard_normal((64, 8, 4)).astype(np.float32)
    r, rk, pr = run_tiles(lambda t: (nisa.tensor_reduce(np.max, t, axis=(1, 2), negate=True),
                                     nisa.tensor_reduce(nl.add, t, axis=2, keepdims=True),
                                     nisa.tensor_partition_reduce(np.add, t)), x)
    np.testing.assert_allclose(r, -x.max(axis=(1, 2)))
    np.testing.assert_allclose(rk, x.sum(2, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pr, x.sum(0, keepdims=True), rtol=1e-5, atol=1e-5)


def test_tensor_tensor_scan(rng):
    a = rng.uniform(0.5, 1, (16, 32)).astype(np.float32)
    b = rng.standard_normal((16, 32)).astype(np.float32)
    out = run_tiles(lambda x, y: nisa.tensor_tensor_scan(x, y, 0.0, np.multiply, np.add), a, b)
    ref = np.zeros_like(a)
    prev = np.zeros(16, np.float32)
    for i in range(32):
        prev = a[:, i] * prev + b[:, i]
        ref[:, i] = prev
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_reciprocal_copy_memset_dropout(rng):
    x = rng.uniform(1, 2, (32, 16)).astype(np.float32)
    rc, cp, ms, d0, d1 = run_tiles(lambda t: (
        nisa.reciprocal(t), nisa.tensor_copy(t, dtype=nl.bfloat16, engine=nisa.scalar_engine),
        nisa.memset((32, 16), 7.0, nl.float32), nisa.dropout(t, 0.0), nisa.dropout(t, 1.0)), x)
    np.testing.assert_allclose(rc, 1 / x, rtol=1e-6)
    np.testing.assert_allclose(cp.astype(np.float32), x, rtol=1e-2)
    assert (ms == 7).all() and np.array_equal(d0, x) and (d1 == 0).all()


def test_tensor_copy_predicated_and_select_reduce(rng):
    x = rng.standard_normal((32, 16)).astype(np.float32)
    p = (rng.random((32, 16)) > 0.5).astype(np.float32)

    def body(t, pred):
        dst = nl.zeros((32, 16), nl.float32)
        nisa.tensor_copy_predicated(src=t, dst=dst, predicate=pred)
        sel = nl.ndarray((32, 16), nl.float32)
        red = nl.ndarray((32, 1), nl.float32)
        nisa.select_reduce(dst=sel, predicate=pred, on_true=t, on_false=-1.0, reduce_res=red,
                           reduce_cmd=nisa.reduce_cmd.reset_reduce)
        return dst, sel, red

    cp, sel, red = run_tiles(body, x, p)
    np.testing.assert_array_equal(cp, np.where(p != 0, x, 0))
    np.testing.assert_array_equal(sel, np.where(p != 0, x, -1))
    np.testing.assert_array_equal(red, np.where(p != 0, x, -1).max(1, keepdims=True))


def test_range_select(rng):
    x = rng.standard_normal((16, 32)).astype(np.float32)
    lo = np.full((16, 1), 4, np.float32)
    hi = np.full((16, 1), 20, np.float32)

    def body(t, b0, b1):
        red = nl.ndarray((16, 1), nl.float32)
        out = nisa.range_select(on_true_tile=t, comp_op0=np.greater_equal, comp_op1=np.less, bound0=b0, bound1=b1,
                                reduce_res=red, on_false_value=-100.0)
        return out, red

    out, red = run_tiles(body, x, lo, hi)
    idx = np.arange(32)
    ref = np.where((idx >= 4) & (idx < 20), x, -100)
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(red, ref.max(1, keepdims=True))


def test_iota_and_affine_select_causal_mask(rng):
    x = rng.standard_normal((64, 64)).astype(np.float32)
    ip, jf = nl.arange(64)[:, None], nl.arange(64)[None, :]
    io, sel = run_tiles(lambda t: (nisa.iota(ip * 64 + jf, dtype=nl.int32),
                                   nisa.affine_select(ip >= jf, t, -1e4)), x)
    np.testing.assert_array_equal(io, np.arange(64 * 64).reshape(64, 64))
    np.testing.assert_array_equal(sel, np.where(np.tril(np.ones((64, 64))) > 0, x, -1e4))


def test_bn_stats_aggr_and_masked_bn_stats(rng):
    x = rng.standard_normal((128, 300)).astype(np.float32)

    def body(t):
        i_f = nl.arange(300)[None, :]
        full = nisa.bn_aggr(nisa.bn_stats(t))
        part = nisa.bn_aggr(nisa.bn_stats(t, mask=(i_f < 100)))
        return full, part

    full, part = run_tiles(body, x)
    np.testing.assert_allclose(full, np.stack([x.mean(1), x.var(1)], 1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(part, np.stack([x[:, :100].mean(1), x[:, :100].var(1)], 1), rtol=1e-4, atol=1e-5)


def test_max8_find_index8_match_replace8(rng):
    x = rng.permutation(128 * 64).reshape(128, 64).astype(np.float32)

    def body(t):
        top = nisa.max8(src=t)
        return top, nisa.nc_find_index8(data=t, vals=top), nisa.nc_match_replace8(data=t, vals=top, imm=-1.0)

    top, idx, rep = run_tiles(body, x)
    ref_top = -np.sort(-x, axis=1)[:, :8]
    np.testing.assert_array_equal(top, ref_top)
    np.testing.assert_array_equal(np.take_along_axis(x, idx.astype(np.int64), 1), ref_top)
    assert ((rep == -1).sum(1) == 8).all() and np.array_equal(np.where(rep == -1, x, rep), x)


def test_sequence_bounds_and_stream_shuffle(rng):
    ids = np.array([[1, 1, 2, 2, 2, 0]] * 4, dtype=np.int32)
    x = rng.standard_normal((32, 8)).astype(np.float32)
    perm = list(range(31, -1, -1))

    def body(s, t):
        dst = nl.zeros((32, 8), nl.float32)
        nisa.nc_stream_shuffle(t, dst, perm)
        return nisa.sequence_bounds(segment_ids=s), dst

    sb, sh = run_tiles(body, ids, x)
    np.testing.assert_array_equal(sb[0], [[0, 0, 2, 2, 2, 6], [2, 2, 5, 5, 5, -1]])
    np.testing.assert_array_equal(sh, x[::-1])


def test_dma_copy_transpose_and_rmw(rng):
    x = rng.standard_normal((64, 32)).astype(np.float32)

    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        acc = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray(a.shape, dtype=a.dtype)
        nisa.dma_copy(dst=t, src=a)
        nisa.dma_copy(dst=out, src=t)
        nisa.dma_copy(dst=acc, src=t)
        nisa.dma_copy(dst=acc, src=t, dst_rmw_op=np.add)
        tr = nl.ndarray((32, 64), dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(tr, nisa.dma_transpose(t))
        return out, acc, tr

    out, acc, tr = k(x)
    np.testing.assert_array_equal(out, x)
    np.testing.assert_allclose(acc, 2 * x)
    np.testing.assert_array_equal(tr, x.T)


def test_enums_and_version():
    assert nisa.get_nc_version() is nisa.nc_version.gen3  # default target trn2
    assert {e.name for e in nisa.engine} >= {"tensor", "vector", "scalar", "gpsimd", "dma", "unknown"}
    assert nisa.reduce_cmd.reset_reduce and nisa.dge_mode.hwdge and nisa.oob_mode.skip


def test_local_gather_per_16_partition_group(rng):
    src = rng.random((128, 512, 4)).astype(np.float32)
    idx_core = rng.integers(0, 512, (16, 4)).astype(np.uint16)
    idx = np.tile(idx_core, (8, 1))
    out = run_tiles(lambda s, i: nisa.local_gather(s, i * 4, 4, 64), src, idx)
    ref = np.empty((128, 64, 4), np.float32)
    for g in range(0, 128, 16):
        ref[g:g + 16] = np.take(src[g:g + 16], idx[g:g + 16].flatten(order="F")[:64], axis=1)
    np.testing.assert_array_equal(out, ref)
