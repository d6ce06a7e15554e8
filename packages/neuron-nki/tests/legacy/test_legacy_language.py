"""One test per legacy ``nl`` function (or family) against a NumPy reference."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from legacy_harness import f32, run_tiles

import neuronxcc.nki as nki
import neuronxcc.nki.language as nl
from nki._ops import erf as ref_erf

BF16 = ml_dtypes.bfloat16


@pytest.fixture
def rng():
    return np.random.default_rng(3)


def _sig(x):
    return 1 / (1 + np.exp(-x))


def _gelu(x):
    return 0.5 * x * (1 + ref_erf(x / np.sqrt(2)))


UNARY = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
    "reciprocal": lambda x: 1 / x, "abs": np.abs, "negative": np.negative, "sign": np.sign, "square": np.square,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "arctan": np.arctan, "tanh": np.tanh, "ceil": np.ceil,
    "floor": np.floor, "trunc": np.trunc, "sigmoid": _sig, "relu": lambda x: np.maximum(x, 0), "gelu": _gelu,
    "gelu_dx": lambda x: 0.5 * (1 + ref_erf(x / np.sqrt(2))) + x * np.exp(-x * x / 2) / np.sqrt(2 * np.pi),
    "gelu_apprx_tanh": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))),
    "gelu_apprx_sigmoid": lambda x: x * _sig(1.702 * x), "silu": lambda x: x * _sig(x),
    "silu_dx": lambda x: _sig(x) * (1 + x * (1 - _sig(x))), "softplus": lambda x: np.log1p(np.exp(x)),
    "mish": lambda x: x * np.tanh(np.log1p(np.exp(x))), "erf": ref_erf,
    "erf_dx": lambda x: 2 / np.sqrt(np.pi) * np.exp(-x * x), "copy": lambda x: x,
    "logical_not": lambda x: (x == 0).astype(np.float32),
}
POSITIVE = {"log", "sqrt", "rsqrt"}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(rng, name):
    x = rng.uniform(0.1, 2.0, (128, 64)) if name in POSITIVE else rng.uniform(-2.0, 2.0, (128, 64))
    x = x.astype(np.float32)
    if name == "logical_not":
        x[::3] = 0
    out = run_tiles(getattr(nl, name), x)
    np.testing.assert_allclose(f32(out), UNARY[name](x.astype(np.float64)), rtol=1e-5, atol=1e-5)


def test_invert_on_integers(rng):
    x = rng.integers(0, 1000, (16, 8)).astype(np.int32)
    np.testing.assert_array_equal(run_tiles(nl.invert, x), np.invert(x))


BINARY = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide, "maximum": np.maximum,
    "minimum": np.minimum, "power": np.power, "fmod": np.fmod, "mod": np.mod,
}
COMPARE = {
    "equal": np.equal, "not_equal": np.not_equal, "less": np.less, "less_equal": np.less_equal,
    "greater": np.greater, "greater_equal": np.greater_equal, "logical_and": np.logical_and,
    "logical_or": np.logical_or, "logical_xor": np.logical_xor,
}
BITWISE = {"bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor,
           "left_shift": np.left_shift, "right_shift": np.right_shift}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_arithmetic(rng, name):
    x = rng.uniform(0.5, 2.0, (128, 32)).astype(np.float32)
    y = rng.uniform(0.5, 2.0, (128, 32)).astype(np.float32)
    np.testing.assert_allclose(run_tiles(getattr(nl, name), x, y), BINARY[name](x, y), rtol=1e-6)


@pytest.mark.parametrize("name", sorted(COMPARE))
def test_comparisons_default_to_bool(rng, name):
    x = rng.integers(0, 3, (64, 16)).astype(np.float32)
    y = rng.integers(0, 3, (64, 16)).astype(np.float32)
    out = run_tiles(getattr(nl, name), x, y)
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, COMPARE[name](x, y))


@pytest.mark.parametrize("name", sorted(BITWISE))
def test_bitwise(rng, name):
    x = rng.integers(0, 1 << 12, (32, 16)).astype(np.int32)
    y = rng.integers(0, 8, (32, 16)).astype(np.int32)
    np.testing.assert_array_equal(run_tiles(getattr(nl, name), x, y), BITWISE[name](x, y))


@pytest.mark.parametrize(("a", "b", "expected"), [
    (np.float16, BF16, np.float32), (np.float32, BF16, np.float32), (np.int32, np.float16, np.float16),
    (np.int8, np.uint8, np.int16), (np.int8, np.uint16, np.int32), (np.uint16, np.int32, np.int32),
    (ml_dtypes.float8_e4m3, ml_dtypes.float8_e5m2, BF16), (ml_dtypes.float8_e4m3, BF16, BF16),
])
def test_legacy_type_promotion(a, b, expected):
    x, y = np.ones((4, 4), a), np.ones((4, 4), b)
    assert run_tiles(nl.add, x, y).dtype == np.dtype(expected)


def test_weak_scalars_widen_and_explicit_dtype_wins():
    x = np.full((4, 4), 2, np.float16)
    assert run_tiles(lambda t: nl.multiply(t, 1.5), x).dtype == np.float32
    assert run_tiles(lambda t: nl.multiply(t, np.float16(1.5)), x).dtype == np.float16
    out = run_tiles(lambda t: nl.add(t, 2, dtype=nl.bfloat16), x)
    assert out.dtype == BF16 or out.dtype == np.float32  # fp32 storage reports the values (legacy precision)
    np.testing.assert_array_equal(f32(out), 4.0)


def test_partition_aligned_broadcast_and_operators(rng):
    x = rng.standard_normal((128, 32)).astype(np.float32)

    def body(t):
        s = nl.sum(t, axis=1)  # shape [128]
        return (t - s) * 2.0 + 1.0, -t / 4, t ** 2

    a, b, c = run_tiles(body, x)
    np.testing.assert_allclose(a, (x - x.sum(1, keepdims=True)) * 2 + 1, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b, -x / 4, rtol=1e-6)
    np.testing.assert_allclose(c, x ** 2, rtol=1e-6)


REDUCE = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean, "prod": np.prod}


@pytest.mark.parametrize("name", sorted(REDUCE))
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(rng, name, keepdims):
    x = rng.uniform(0.9, 1.1, (64, 4, 8)).astype(np.float32)
    out = run_tiles(lambda t: getattr(nl, name)(t, axis=[1, 2], keepdims=keepdims), x)
    np.testing.assert_allclose(out, REDUCE[name](x, axis=(1, 2), keepdims=keepdims), rtol=1e-5)


def test_all_and_var_and_non_trailing_axes(rng):
    x = rng.standard_normal((32, 6, 10)).astype(np.float32)
    b = (rng.random((32, 12)) > 0.2).astype(np.float32)
    np.testing.assert_allclose(run_tiles(lambda t: nl.var(t, axis=2), x), x.var(axis=2), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(run_tiles(lambda t: nl.sum(t, axis=1), x), x.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(run_tiles(lambda t: nl.all(t, axis=1), b), b.all(axis=1))


def test_masked_reduction_ignores_masked_elements(rng):
    x = rng.standard_normal((128, 64)).astype(np.float32)

    def body(t):
        i_f = nl.arange(64)[None, :]
        return nl.sum(t, axis=1, mask=(i_f < 40)), nl.mean(t, axis=1, mask=(i_f < 40))

    s, m = run_tiles(body, x)
    np.testing.assert_allclose(s, x[:, :40].sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m, x[:, :40].mean(1), rtol=1e-5, atol=1e-6)


def test_matmul_transpose_softmax_rms_norm(rng):
    a = rng.standard_normal((64, 128)).astype(np.float32)
    b = rng.standard_normal((64, 96)).astype(np.float32)
    w = rng.standard_normal((1, 128)).astype(np.float32)
    mm, mmT, tr, sm, rn = run_tiles(lambda x, y, g: (
        nl.copy(nl.matmul(nl.transpose(x), y)), nl.copy(nl.matmul(x, y, transpose_x=True)), nl.copy(nl.transpose(x)),
        nl.softmax(x, axis=1), nl.rms_norm(x, g.broadcast_to((64, 128)), axis=1, n=128)), a, b, w)
    np.testing.assert_allclose(mm, a.T @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(mmT, a.T @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(tr, a.T)
    e = np.exp(a - a.max(1, keepdims=True))
    np.testing.assert_allclose(sm, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rn, a / np.sqrt((a * a).mean(1, keepdims=True) + 1e-6) * w, rtol=1e-4, atol=1e-5)


def test_where_dropout_expand_dims_gather(rng):
    x = rng.standard_normal((32, 16)).astype(np.float32)
    c = (rng.random((32, 16)) > 0.5).astype(np.uint8)
    idx = rng.integers(0, 16, (32, 4)).astype(np.uint32)
    wh, dr_all, dr_none, ex, ga = run_tiles(lambda t, m, i: (
        nl.where(m, t, 0.0), nl.dropout(t, 1.0), nl.dropout(t, 0.0), nl.copy(nl.expand_dims(t, 1)),
        nl.gather_flattened(t, i)), x, c, idx)
    np.testing.assert_array_equal(wh, np.where(c != 0, x, 0))
    assert (dr_all == 0).all() and np.array_equal(dr_none, x)
    assert ex.shape == (32, 1, 16) and np.array_equal(ex[:, 0], x)
    np.testing.assert_array_equal(ga, np.take_along_axis(x, idx.astype(np.int64), axis=1))


def test_creation_functions_and_buffers():
    @nki.jit
    def k():
        outs = []
        for t in (nl.zeros((8, 4), nl.float32), nl.ones((8, 4), nl.int32), nl.full((8, 4), 2.5, nl.float32),
                  nl.zeros_like(nl.ones((8, 4), nl.float32)), nl.load(nl.shared_identity_matrix(8, dtype=nl.float32)),
                  nl.load(nl.shared_constant(np.arange(32).reshape(8, 4), dtype=nl.int32))):
            o = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
            nl.store(o, t)
            outs.append(o)
        assert nl.empty_like(outs[0]).buffer is nl.shared_hbm
        nl.random_seed(5)
        r = nl.rand((8, 4), nl.float32)
        o = nl.ndarray((8, 4), nl.float32, buffer=nl.shared_hbm)
        nl.store(o, r)
        return (*outs, o)

    z, o, f, zl, eye, const, r = nki.simulate_kernel(k)
    assert (z == 0).all() and (o == 1).all() and (f == 2.5).all() and (zl == 0).all()
    np.testing.assert_array_equal(eye, np.eye(8))
    np.testing.assert_array_equal(const, np.arange(32).reshape(8, 4))
    assert ((r >= 0) & (r < 1)).all() and len(np.unique(r)) > 16


def test_load_transpose2d_atomic_rmw_and_ds(rng):
    x = rng.standard_normal((64, 32)).astype(np.float32)
    acc = np.ones((32, 64), np.float32)

    @nki.jit
    def k(a, acc):
        t = nl.load_transpose2d(a)
        nl.atomic_rmw(acc, value=t, op=np.add)
        out = nl.ndarray((16, 32), dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a[nl.ds(8, 16), :]))
        return acc, out

    acc_out, part = k(x, acc)
    np.testing.assert_allclose(acc_out, 1 + x.T, rtol=1e-6)
    np.testing.assert_array_equal(part, x[8:24])


def test_loops_and_program_queries():
    @nki.jit
    def k(a):
        out = nl.ndarray((1, 6), nl.int32, buffer=nl.shared_hbm)
        t = nl.zeros((1, 6), nl.int32)
        vals = [nl.program_id(0), nl.program_id(1), nl.num_programs(), nl.num_programs(1), nl.program_ndim(),
                sum(1 for _ in nl.affine_range(2)) + sum(1 for _ in nl.sequential_range(1, 3))
                + sum(1 for _ in nl.static_range(2))]
        for i, v in enumerate(vals):
            t[0, i] = v
        if nl.program_id(0) == 1 and nl.program_id(1) == 2:
            nl.store(out, t)
        return out

    np.testing.assert_array_equal(k[2, 3](np.zeros(1, np.float32)), [[1, 2, 6, 3, 2, 6]])


def test_dtypes_constants_and_tile_size():
    assert nl.bfloat16 == np.dtype(BF16) and nl.float8_e4m3 == np.dtype(ml_dtypes.float8_e4m3)
    assert nl.float8_e5m2 == np.dtype(ml_dtypes.float8_e5m2) and nl.tfloat32.itemsize == 4
    assert nl.fp32.min == float(np.finfo(np.float32).min) and nl.finfo(nl.bfloat16).bits == 16
    assert (nl.tile_size.pmax, nl.tile_size.psum_fmax, nl.tile_size.gemm_stationary_fmax,
            nl.tile_size.gemm_moving_fmax, nl.tile_size.bn_stats_fmax) == (128, 512, 128, 512, 512)
    assert nl.static_cast(np.array([1.5]), nl.bfloat16).dtype == BF16
    assert {nl.int8, nl.int16, nl.int32, nl.uint8, nl.uint16, nl.uint32, nl.float16, nl.float32, nl.bool_} == {
        np.dtype(t) for t in (np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32, np.float16, np.float32,
                              np.bool_)}
    assert {nl.sbuf.name, nl.psum.name, nl.hbm.name, nl.private_hbm.name, nl.shared_hbm.name} == {
        "sbuf", "psum", "hbm", "private_hbm", "shared_hbm"}


def test_loop_reduce_accumulates_into_its_destination(rng):
    x = rng.standard_normal((4, 32, 16)).astype(np.float32)

    @nki.jit
    def k(a):
        out = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        b = nl.full((32, 16), -np.inf, dtype=nl.float32)
        for k_i in nl.affine_range(4):
            b = nl.loop_reduce(nl.load(a[k_i]), op=np.maximum, loop_indices=[k_i], dtype=nl.float32)
        nl.store(out, b)
        return out

    np.testing.assert_array_equal(k(x), x.max(axis=0))


def test_not_implemented_entries_name_themselves():
    with pytest.raises(NotImplementedError, match="gemm_grid"):
        nl.gemm_grid()


def test_all_reduce_over_one_program_is_the_tile_and_refuses_more(rng):
    """AWS's legacy nl.all_reduce reduces over the SPMD programs along program_axes: over one program that is
    the tile itself (cast to dtype); across programs the serial simulator cannot run it and says so."""
    x = rng.standard_normal((64, 32)).astype(np.float32)

    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
        nl.store(out, nl.all_reduce(nl.load(a), np.add, program_axes=0, dtype=nl.bfloat16))
        return out

    np.testing.assert_array_equal(k(x).astype(np.float32), x.astype(ml_dtypes.bfloat16).astype(np.float32))
    with pytest.raises(NotImplementedError, match=r"all_reduce over 2 programs .*one after another"):
        k[2](x)
