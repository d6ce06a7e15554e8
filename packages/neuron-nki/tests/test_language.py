"""nki.language tile functions against NumPy references (fp32 and bf16)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from nki_testutil import bf16, sim

import nki
import nki.language as nl
from nki._ops import erf as np_erf

BINARY = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
    "maximum": np.maximum, "minimum": np.minimum, "fmod": np.fmod, "mod": np.mod,
    "abs_max": lambda a, b: np.maximum(np.abs(a), np.abs(b)), "abs_min": lambda a, b: np.minimum(np.abs(a), np.abs(b)),
}
COMPARE = {"equal": np.equal, "not_equal": np.not_equal, "less": np.less, "less_equal": np.less_equal,
           "greater": np.greater, "greater_equal": np.greater_equal}
LOGICAL = {"logical_and": np.logical_and, "logical_or": np.logical_or, "logical_xor": np.logical_xor}
BITWISE = {"bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor,
           "left_shift": np.left_shift, "right_shift": np.right_shift}


def _sig(x):
    return 1 / (1 + np.exp(-x))


UNARY = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "reciprocal": lambda x: 1 / x,
    "abs": np.abs, "negative": np.negative, "sign": np.sign, "square": np.square, "sin": np.sin, "cos": np.cos,
    "tan": np.tan, "arctan": np.arctan, "tanh": np.tanh, "ceil": np.ceil, "floor": np.floor, "trunc": np.trunc,
    "sigmoid": _sig, "relu": lambda x: np.maximum(x, 0),
    "gelu": lambda x: 0.5 * x * (1 + np_erf(x / np.sqrt(2))),
    "gelu_dx": lambda x: 0.5 * (1 + np_erf(x / np.sqrt(2))) + x * np.exp(-x * x / 2) / np.sqrt(2 * np.pi),
    "gelu_apprx_tanh": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))),
    "gelu_apprx_sigmoid": lambda x: x * _sig(1.702 * x),
    "gelu_apprx_sigmoid_dx": lambda x: _sig(1.702 * x) * (1 + 1.702 * x * (1 - _sig(1.702 * x))),
    "silu": lambda x: x * _sig(x), "silu_dx": lambda x: _sig(x) * (1 + x * (1 - _sig(x))),
    "softplus": lambda x: np.log1p(np.exp(x)), "mish": lambda x: x * np.tanh(np.log1p(np.exp(x))),
    "erf": np.vectorize(math.erf), "erf_dx": lambda x: 2 / np.sqrt(np.pi) * np.exp(-x * x), "copy": lambda x: x,
}
POSITIVE = {"log", "sqrt", "rsqrt"}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary(name, rng):
    a = rng.standard_normal((128, 64)).astype(np.float32)
    b = rng.standard_normal((128, 64)).astype(np.float32) + (3.0 if name in ("divide", "fmod", "mod") else 0)
    out = sim(lambda x, y: getattr(nl, name)(x, y), a, b)
    np.testing.assert_allclose(out, BINARY[name](a, b), rtol=1e-5, atol=1e-5)


def test_power_and_scalar_operands(rng):
    a = rng.uniform(0.5, 2, (16, 32)).astype(np.float32)
    np.testing.assert_allclose(sim(lambda x: nl.power(x, 2.5), a), a ** 2.5, rtol=1e-5)
    np.testing.assert_allclose(sim(lambda x: nl.subtract(1.0, x), a), 1 - a, rtol=1e-6)
    np.testing.assert_allclose(sim(lambda x: x * 3 + 1, a), a * 3 + 1, rtol=1e-6)


def test_broadcast_partition_vector(rng):
    a = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal((64, 1)).astype(np.float32)
    np.testing.assert_allclose(sim(lambda x, y: nl.multiply(x, y), a, b), a * b, rtol=1e-6)


@pytest.mark.parametrize("name", sorted(COMPARE) + sorted(LOGICAL))
def test_compare_and_logical(name, rng):
    a = rng.integers(0, 3, (32, 16)).astype(np.float32)
    b = rng.integers(0, 3, (32, 16)).astype(np.float32)
    ref = {**COMPARE, **LOGICAL}[name](a, b)
    out = sim(lambda x, y: getattr(nl, name)(x, y), a, b)
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("name", sorted(BITWISE))
def test_bitwise(name, rng):
    a = rng.integers(0, 1 << 12, (16, 16)).astype(np.int32)
    b = rng.integers(0, 8, (16, 16)).astype(np.int32)
    out = sim(lambda x, y: getattr(nl, name)(x, y), a, b)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, BITWISE[name](a, b))


def test_invert_and_logical_not(rng):
    a = rng.integers(0, 100, (8, 8)).astype(np.int32)
    np.testing.assert_array_equal(sim(lambda x: nl.invert(x), a), np.invert(a))
    f = (rng.integers(0, 2, (8, 8))).astype(np.float32)
    np.testing.assert_array_equal(sim(lambda x: nl.logical_not(x), f), f == 0)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_fp32(name, rng):
    a = rng.uniform(0.1, 3, (32, 64)) if name in POSITIVE else rng.uniform(-3, 3, (32, 64))
    a = a.astype(np.float32)
    out = sim(lambda x: getattr(nl, name)(x), a)
    np.testing.assert_allclose(out, UNARY[name](a.astype(np.float64)), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name", ["exp", "tanh", "gelu", "silu", "sigmoid", "rsqrt"])
def test_unary_bf16(name, rng):
    a = bf16(rng.uniform(0.1, 3, (32, 64)))
    out = sim(lambda x: getattr(nl, name)(x), a)
    assert out.dtype == nl.bfloat16
    ref = bf16(UNARY[name](a.astype(np.float64)))  # fp32 math, one rounding to bf16
    np.testing.assert_allclose(out.astype(np.float32), ref.astype(np.float32), rtol=1e-2)


def test_binary_bf16_rounds_once(rng):
    a, b = bf16(rng.standard_normal((128, 128))), bf16(rng.standard_normal((128, 128)))
    out = sim(lambda x, y: nl.add(x, y), a, b)
    assert out.dtype == nl.bfloat16
    np.testing.assert_array_equal(out, bf16(a.astype(np.float32) + b.astype(np.float32)))


def test_dtype_argument_and_promotion(rng):
    a = bf16(rng.standard_normal((8, 8)))
    b = rng.standard_normal((8, 8)).astype(np.float32)
    assert sim(lambda x, y: nl.add(x, y), a, b).dtype == np.float32
    assert sim(lambda x, y: nl.add(x, y, dtype=nl.bfloat16), a, b).dtype == nl.bfloat16


@pytest.mark.parametrize("name,ref", [("sum", np.sum), ("max", np.max), ("min", np.min), ("mean", np.mean),
                                      ("prod", np.prod), ("var", np.var)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(name, ref, keepdims, rng):
    a = rng.uniform(0.5, 1.5, (64, 4, 16)).astype(np.float32)
    out = sim(lambda x: getattr(nl, name)(x, axis=(1, 2), keepdims=keepdims), a)
    np.testing.assert_allclose(out, ref(a, axis=(1, 2), keepdims=keepdims), rtol=1e-4)


def test_all_reduction(rng):
    a = (rng.random((16, 8)) > 0.1).astype(np.float32)
    np.testing.assert_array_equal(sim(lambda x: nl.all(x, axis=1), a), a.all(axis=1))


def test_matmul_transpose_x_and_plain(rng):
    xT = rng.standard_normal((128, 64)).astype(np.float32)
    y = rng.standard_normal((128, 256)).astype(np.float32)
    np.testing.assert_allclose(sim(lambda a, b: nl.matmul(a, b, transpose_x=True), xT, y), xT.T @ y, rtol=1e-4,
                               atol=1e-4)
    x = np.ascontiguousarray(xT.T)
    np.testing.assert_allclose(sim(lambda a, b: nl.matmul(a, b), x, y), x @ y, rtol=1e-4, atol=1e-4)


def test_matmul_bf16(rng):
    xT, y = bf16(rng.standard_normal((128, 128))), bf16(rng.standard_normal((128, 512)))
    out = sim(lambda a, b: nl.matmul(a, b, transpose_x=True), xT, y)
    np.testing.assert_allclose(out, xT.astype(np.float32).T @ y.astype(np.float32), rtol=1e-4, atol=1e-3)


def test_psum_accumulate_with_iadd(rng):
    xT = rng.standard_normal((256, 32)).astype(np.float32)
    y = rng.standard_normal((256, 64)).astype(np.float32)

    @nki.jit
    def k(a, b):
        acc = nl.zeros((32, 64), nl.float32, buffer=nl.psum)
        for i in nl.affine_range(2):
            acc += nl.matmul(nl.load(a[nl.ds(i * 128, 128), :]), nl.load(b[nl.ds(i * 128, 128), :]), transpose_x=True)
        out = nl.ndarray((32, 64), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, acc)
        return out

    np.testing.assert_allclose(nki.simulate(k)(xT, y), xT.T @ y, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(128, 128), (16, 24)])
def test_transpose(shape, rng):
    a = rng.standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(sim(lambda x: nl.transpose(x), a), a.T)


def test_softmax_and_rms_norm(rng):
    a = rng.standard_normal((64, 128)).astype(np.float32)
    e = np.exp(a - a.max(axis=1, keepdims=True))
    np.testing.assert_allclose(sim(lambda x: nl.softmax(x, axis=1), a), e / e.sum(1, keepdims=True), rtol=1e-5)
    w = rng.standard_normal((1, 128)).astype(np.float32)
    ref = a / np.sqrt((a * a).mean(axis=1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(sim(lambda x, ww: nl.rms_norm(x, ww, axis=1, n=128), a, w), ref, rtol=1e-4, atol=1e-5)


def test_where_broadcast_to_expand_dims(rng):
    c = rng.random((16, 8)) > 0.5
    a = rng.standard_normal((16, 8)).astype(np.float32)
    np.testing.assert_array_equal(sim(lambda cc, x: nl.where(cc, x, -1.0), c.astype(np.uint8), a),
                                  np.where(c, a, -1.0))
    row = rng.standard_normal((1, 8)).astype(np.float32)
    np.testing.assert_array_equal(sim(lambda r: nl.broadcast_to(r, (16, 8)), row), np.broadcast_to(row, (16, 8)))
    np.testing.assert_array_equal(sim(lambda x: nl.copy(nl.expand_dims(x, 2)), a), a[:, :, None])


def test_gather_flattened(rng):
    a = rng.standard_normal((8, 4, 8)).astype(np.float32)
    idx = rng.integers(0, 32, (8, 5)).astype(np.uint32)
    out = sim(lambda x, i: nl.gather_flattened(x, i), a, idx)
    np.testing.assert_array_equal(out, np.take_along_axis(a.reshape(8, 32), idx.astype(np.int64), axis=1))


def test_rand_dropout_and_seed_are_deterministic():
    def body(x):
        nl.random_seed(7)
        r = nl.rand((8, 16), nl.float32)
        return nl.add(nl.dropout(x, 0.5), r)

    x = np.ones((8, 16), np.float32)
    o1, o2 = sim(body, x), sim(body, x)
    np.testing.assert_array_equal(o1, o2)
    assert ((o1 >= 0) & (o1 < 2)).all()


def test_load_transpose2d_and_atomic_rmw(rng):
    a = rng.standard_normal((64, 32)).astype(np.float32)
    acc = np.ones((32, 64), np.float32)

    @nki.jit
    def k(x, out):
        t = nl.load_transpose2d(x)
        nl.atomic_rmw(out, t, op=nl.add)

    k(a, acc)
    np.testing.assert_allclose(acc, 1 + a.T, rtol=1e-6)


def test_shared_constant_and_identity():
    @nki.jit
    def k():
        c = nl.shared_constant(np.arange(12, dtype=np.float32).reshape(3, 4))
        i = nl.shared_identity_matrix(4, dtype=nl.float32)
        o1 = nl.ndarray((3, 4), nl.float32, buffer=nl.shared_hbm)
        o2 = nl.ndarray((4, 4), nl.float32, buffer=nl.shared_hbm)
        nl.store(o1, nl.load(c))
        nl.store(o2, nl.load(i))
        return o1, o2

    o1, o2 = nki.simulate(k)()
    np.testing.assert_array_equal(o1, np.arange(12).reshape(3, 4))
    np.testing.assert_array_equal(o2, np.eye(4))


def test_tile_size_constants():
    assert nl.tile_size.pmax == 128 and nl.tile_size.psum_fmax == 512
    assert nl.tile_size.gemm_stationary_fmax == 128 and nl.tile_size.gemm_moving_fmax == 512
    assert nl.tile_size.bn_stats_fmax == 512 and nl.tile_size.psum_num_banks == 8
    assert nl.tile_size.sbuf_fmax_bytes == 224 * 1024  # trn2


def test_loops_and_static_cast(rng):
    assert list(nl.affine_range(3)) == [0, 1, 2] and list(nl.sequential_range(1, 7, 2)) == [1, 3, 5]
    assert list(nl.static_range(2)) == [0, 1]
    seen = []
    nl.fori_loop(0, 4, seen.append)
    assert seen == [0, 1, 2, 3]
    assert nl.fori_loop(0, 4, lambda i, v: v + i, init_val=10) == 16
    assert nl.while_loop(lambda v: v < 5, lambda v: v + 2, init_val=0) == 6
    assert nl.static_cast(np.array([1.5]), nl.bfloat16).dtype == nl.bfloat16


def test_device_print(capsys):
    sim(lambda x: (nl.device_print("val:", x), x)[1], np.ones((2, 2), np.float32))
    assert "val:" in capsys.readouterr().out


def test_alu_functions_double_as_operators():
    from nki._ops import resolve

    assert resolve(nl.add).name == "add" and resolve(np.maximum).name == "maximum"
    assert resolve(nl.max).name == "maximum" and resolve(nl.exp).kind == "act"
