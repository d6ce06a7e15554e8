"""ALU operators and activation functions shared by ``nl.*`` and ``nisa.*`` (and the legacy API).

Why a table: the same operator appears as a tile function (``nl.add(x, y)``), as an ``op=`` argument of an ISA
instruction (``nisa.tensor_tensor(dst, a, b, op=nl.add)``), as a NumPy ufunc in legacy kernels
(``op=np.add``) or as a reduction (``nisa.tensor_reduce(op=nl.maximum)``). :func:`resolve` maps any of these to
one :class:`OpSpec` holding the NumPy implementation. Arithmetic runs in float32 (the engines' math precision);
bitvec operators run on integers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["OpSpec", "erf", "register", "resolve"]

_SQRT2 = np.float32(np.sqrt(2.0))
_SQRT_2_OVER_PI = np.float32(np.sqrt(2.0 / np.pi))


def erf(x: np.ndarray) -> np.ndarray:
    """Vectorised erf (Abramowitz & Stegun 7.1.26 refined; |err| < 1.5e-7, below fp32 resolution near 1)."""
    x = np.asarray(x, dtype=np.float64)
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * \
        np.exp(-a * a)
    return (s * y).astype(np.float32)


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x))).astype(np.float32)


def _softplus(x):
    return np.logaddexp(np.float32(0), x).astype(np.float32)


def _gelu(x):
    return (0.5 * x * (1.0 + erf(x / _SQRT2))).astype(np.float32)


def _gelu_dx(x):
    cdf = 0.5 * (1.0 + erf(x / _SQRT2))
    pdf = np.exp(-0.5 * x * x) / np.float32(np.sqrt(2 * np.pi))
    return (cdf + x * pdf).astype(np.float32)


def _gelu_tanh(x):
    return (0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + np.float32(0.044715) * x * x * x)))).astype(np.float32)


def _gelu_sig(x):
    return (x * _sigmoid(np.float32(1.702) * x)).astype(np.float32)


def _gelu_sig_dx(x):
    s = _sigmoid(np.float32(1.702) * x)
    return (s + np.float32(1.702) * x * s * (1 - s)).astype(np.float32)


def _silu_dx(x):
    s = _sigmoid(x)
    return (s * (1 + x * (1 - s))).astype(np.float32)


def _abs_max(a, b):
    return np.maximum(np.abs(a), np.abs(b))


def _abs_min(a, b):
    return np.minimum(np.abs(a), np.abs(b))


def _rsqrt(x):
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.float32(1) / np.sqrt(x)).astype(np.float32)


def _reciprocal(x):
    with np.errstate(divide="ignore"):
        return (np.float32(1) / x).astype(np.float32)


def _cmp(f):
    return lambda a, b: f(a, b).astype(np.float32)


@dataclass(frozen=True)
class OpSpec:
    """One operator: ``kind`` is arith / bitvec / compare / logical (binary) or act / unary (one input)."""

    name: str
    kind: str
    fn: Callable
    reduce: Callable | None = None  # ``np.ufunc.reduce``-like: (array, axis, keepdims) -> array
    identity: float | None = None

    @property
    def binary(self) -> bool:
        return self.kind in ("arith", "bitvec", "compare", "logical")


_OPS: dict[str, OpSpec] = {}


def register(spec: OpSpec, *aliases) -> OpSpec:
    _OPS[spec.name] = spec
    for a in aliases:
        _OPS[a] = spec
    return spec


def _red(uf):
    return lambda a, axis, keepdims=False: uf.reduce(a, axis=axis, keepdims=keepdims)


for _name, _fn, _red_fn, _ident in [
    ("add", np.add, _red(np.add), 0.0),
    ("subtract", np.subtract, _red(np.subtract), 0.0),
    ("multiply", np.multiply, _red(np.multiply), 1.0),
    ("divide", np.divide, None, None),
    ("maximum", np.maximum, _red(np.maximum), -np.inf),
    ("minimum", np.minimum, _red(np.minimum), np.inf),
    ("power", np.power, None, None),
    ("fmod", np.fmod, None, None),
    ("mod", np.mod, None, None),
    ("abs_max", _abs_max, lambda a, axis, keepdims=False: np.max(np.abs(a), axis=axis, keepdims=keepdims), 0.0),
    ("abs_min", _abs_min, lambda a, axis, keepdims=False: np.min(np.abs(a), axis=axis, keepdims=keepdims), np.inf),
]:
    register(OpSpec(_name, "arith", _fn, _red_fn, _ident))
_OPS["max"] = _OPS["maximum"]
_OPS["min"] = _OPS["minimum"]
_OPS["true_divide"] = _OPS["divide"]
_OPS["sum"] = _OPS["add"]
_OPS["prod"] = _OPS["multiply"]
_OPS["mult"] = _OPS["multiply"]

for _name, _fn in [("equal", np.equal), ("not_equal", np.not_equal), ("less", np.less),
                   ("less_equal", np.less_equal), ("greater", np.greater), ("greater_equal", np.greater_equal)]:
    register(OpSpec(_name, "compare", _cmp(_fn)))

for _name, _fn in [("logical_and", np.logical_and), ("logical_or", np.logical_or), ("logical_xor", np.logical_xor)]:
    register(OpSpec(_name, "logical", _cmp(_fn),
                    (lambda f: lambda a, axis, keepdims=False: f.reduce(a != 0, axis=axis, keepdims=keepdims)
                     .astype(np.float32))(_fn)))

for _name, _fn, _ident in [("bitwise_and", np.bitwise_and, -1), ("bitwise_or", np.bitwise_or, 0),
                           ("bitwise_xor", np.bitwise_xor, 0), ("left_shift", np.left_shift, None),
                           ("right_shift", np.right_shift, None)]:
    register(OpSpec(_name, "bitvec", _fn, _red(_fn) if _ident is not None else None, _ident))
register(OpSpec("arith_shift_right", "bitvec", np.right_shift))
register(OpSpec("invert", "unary_bitvec", np.invert))

_ACTS: list[tuple[str, Callable]] = [
    ("exp", np.exp), ("log", np.log), ("sqrt", np.sqrt), ("rsqrt", _rsqrt), ("reciprocal", _reciprocal),
    ("abs", np.abs), ("negative", np.negative), ("sign", np.sign), ("square", np.square), ("sin", np.sin),
    ("cos", np.cos), ("tan", np.tan), ("arctan", np.arctan), ("tanh", np.tanh), ("ceil", np.ceil),
    ("floor", np.floor), ("trunc", np.trunc), ("sigmoid", _sigmoid), ("relu", lambda x: np.maximum(x, 0)),
    ("gelu", _gelu), ("gelu_dx", _gelu_dx), ("gelu_apprx_tanh", _gelu_tanh), ("gelu_apprx_sigmoid", _gelu_sig),
    ("gelu_apprx_sigmoid_dx", _gelu_sig_dx), ("silu", lambda x: x * _sigmoid(x)), ("silu_dx", _silu_dx),
    ("softplus", _softplus), ("mish", lambda x: x * np.tanh(_softplus(x))), ("erf", erf),
    ("erf_dx", lambda x: (np.float32(2 / np.sqrt(np.pi)) * np.exp(-x * x)).astype(np.float32)),
    ("copy", lambda x: x), ("identity", lambda x: x), ("bypass", lambda x: x),
    ("logical_not", lambda x: (x == 0).astype(np.float32)),
]
for _name, _fn in _ACTS:
    register(OpSpec(_name, "act", _fn))
_OPS["absolute"] = _OPS["abs"]

_UFUNC_NAMES = {np.true_divide: "divide", np.absolute: "abs", np.max: "maximum", np.min: "minimum",
                np.amax: "maximum", np.amin: "minimum", np.sum: "add", np.prod: "multiply"}


def resolve(op) -> OpSpec:
    """Map ``nl.add`` / ``np.add`` / ``"add"`` / an OpSpec to its :class:`OpSpec`."""
    if isinstance(op, OpSpec):
        return op
    name = getattr(op, "_nki_op", None)
    if name is None:
        if isinstance(op, str):
            name = op
        elif op in _UFUNC_NAMES:
            name = _UFUNC_NAMES[op]
        else:
            name = getattr(op, "__name__", None)
    spec = _OPS.get(name) if name else None
    if spec is None:
        raise ValueError(f"unsupported NKI operator {op!r}")
    return spec


def apply_binary(spec: OpSpec, a, b):
    """Apply a binary operator with the engines' numerics (float32 math, bitvec on integers). Floating-point
    exceptions are silent as on the engines: kernels run under ``np.errstate(all="ignore")`` (``_launch``)."""
    if spec.kind == "bitvec":
        return spec.fn(np.asarray(a).astype(np.int64), np.asarray(b).astype(np.int64))
    return spec.fn(a, b)


def apply_unary(spec: OpSpec, x):
    if spec.kind == "unary_bitvec":
        return spec.fn(np.asarray(x))
    if spec.binary:
        raise ValueError(f"operator '{spec.name}' needs two operands")
    return spec.fn(x)
