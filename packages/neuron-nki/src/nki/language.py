"""``nki.language`` (nl): tensors, buffers, data movement, loops/SPMD and tile-level math.

Tile-returning functions (``nl.load``, ``nl.add``, ``nl.matmul`` …) allocate their result (SBUF, or PSUM for
``matmul``/``transpose``) and run the corresponding engine instruction from ``nki.isa``, so their cost is the
instruction's. The same function objects double as ALU operators for ISA instructions
(``nisa.tensor_tensor(..., op=nl.add)``): each carries ``_nki_op`` resolved by ``nki._ops``.
"""

from __future__ import annotations

import builtins
import contextlib
import math
import sys

import ml_dtypes
import numpy as np

from . import _context, _limits, envvars
from . import _dtypes as dt
from . import isa as nisa
from ._cost import MIN_II
from ._dtypes import (
    bfloat16,
    bool_,
    float4_e2m1fn_x4,
    float8_e4m3,
    float8_e4m3fn,
    float8_e4m3fn_x4,
    float8_e5m2,
    float8_e5m2_x4,
    float8_e8m0fnu,
    float16,
    float32,
    int8,
    int16,
    int32,
    tfloat32,
    uint8,
    uint16,
    uint32,
)
from ._errors import NkiValidationError, fmt_shape, kernel_location, unimplemented
from ._ops import apply_binary, apply_unary, resolve
from ._tensor import DynSlice, NkiTensor, allocate, hbm, private_hbm, psum, sbuf, shared_hbm

_bmax = builtins.max

__all__ = [  # noqa: RUF022 - grouped by topic
    # dtypes
    "bool_", "int8", "int16", "int32", "uint8", "uint16", "uint32", "float16", "float32", "bfloat16", "tfloat32",
    "float8_e4m3", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "float8_e5m2_x4", "float8_e4m3fn_x4",
    "float4_e2m1fn_x4",
    # buffers / memory
    "sbuf", "psum", "hbm", "private_hbm", "shared_hbm", "ndarray", "zeros", "ones", "full", "rand", "empty_like",
    "zeros_like", "ones_like", "full_like", "shared_constant", "shared_identity_matrix", "tile_size",
    "is_sbuf", "is_psum", "is_hbm", "is_on_chip",
    # data movement / indexing
    "load", "store", "load_transpose2d", "atomic_rmw", "ds", "NkiTensor",
    # loops / SPMD
    "affine_range", "sequential_range", "static_range", "dynamic_range", "fori_loop", "while_loop",
    "program_id", "num_programs", "program_ndim",
    # math
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "fmod", "mod", "abs_max", "abs_min",
    "equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "logical_and", "logical_or",
    "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "invert",
    "logical_not", "exp", "log", "sqrt", "rsqrt", "reciprocal", "abs", "negative", "sign", "square", "sin", "cos",
    "tan", "arctan", "tanh", "ceil", "floor", "trunc", "sigmoid", "relu", "gelu", "gelu_dx", "gelu_apprx_tanh",
    "gelu_apprx_sigmoid", "gelu_apprx_sigmoid_dx", "silu", "silu_dx", "softplus", "mish", "erf", "erf_dx", "copy",
    "bypass", "sum", "max", "min", "mean", "prod", "all", "var",
    "matmul", "transpose", "softmax", "rms_norm", "where", "dropout", "random_seed", "expand_dims",
    "broadcast_to", "gather_flattened", "device_print", "static_cast", "finfo", "no_reorder", "gemm_grid",
    "fp32", "bf16", "fp16",
]


# -- memory --------------------------------------------------------------------------------------------------
def ndarray(shape, dtype, buffer=None, name: str = "", address=None) -> NkiTensor:
    """A new (uninitialised: NaN / 4) tensor in ``buffer`` (default ``nl.sbuf``)."""
    return allocate(shape, dtype, buffer if buffer is not None else sbuf, name, api="ndarray")


def _filled(shape, dtype, buffer, value, name, api):
    t = allocate(shape, dtype, buffer if buffer is not None else sbuf, name, fill=value, api=api)
    if t.buffer.on_chip:
        ctx = _context.current()
        n = t.free_size
        nisa._charge(ctx, "vector", _bmax(MIN_II, n // 2 if value == 0 and t.itemsize == 2 else n), (), (t,), "memset")
    return t


def zeros(shape, dtype, buffer=None, name: str = "") -> NkiTensor:
    """A new tensor filled with 0 (on-chip: a memset instruction)."""
    return _filled(shape, dtype, buffer, 0, name, "zeros")


def ones(shape, dtype, buffer=None, name: str = "") -> NkiTensor:
    """A new tensor filled with 1."""
    return _filled(shape, dtype, buffer, 1, name, "ones")


def full(shape, fill_value, dtype, buffer=None, name: str = "") -> NkiTensor:
    """A new tensor filled with ``fill_value``."""
    return _filled(shape, dtype, buffer, fill_value, name, "full")


def rand(shape, dtype=float32, buffer=None, name: str = "") -> NkiTensor:
    """A new tensor of uniform random values in [0, 1) (seeded by ``nl.random_seed``)."""
    ctx = _context.require("rand")
    t = allocate(shape, dtype, buffer if buffer is not None else sbuf, name, api="rand")
    t.write(nisa._rng(ctx).random(size=t.shape, dtype=np.float32))
    return t


def random_seed(seed) -> None:
    """Seed the simulator's random generator (``nl.rand``, ``nl.dropout``, ``nisa.rng``)."""
    ctx = _context.require("random_seed")
    if isinstance(seed, NkiTensor):
        seed = int(np.asarray(seed.read()).reshape(-1)[0])
    ctx.rng = np.random.default_rng(int(seed) & 0xFFFFFFFF)


def empty_like(x: NkiTensor, dtype=None, buffer=None, name: str = "") -> NkiTensor:
    return ndarray(x.shape, dtype or x.dtype, buffer if buffer is not None else x.buffer, name)


def zeros_like(x: NkiTensor, dtype=None, buffer=None, name: str = "") -> NkiTensor:
    return zeros(x.shape, dtype or x.dtype, buffer if buffer is not None else x.buffer, name)


def ones_like(x: NkiTensor, dtype=None, buffer=None, name: str = "") -> NkiTensor:
    return ones(x.shape, dtype or x.dtype, buffer if buffer is not None else x.buffer, name)


def full_like(x: NkiTensor, fill_value, dtype=None, buffer=None, name: str = "") -> NkiTensor:
    return full(x.shape, fill_value, dtype or x.dtype, buffer if buffer is not None else x.buffer, name)


def shared_constant(constant, dtype=None) -> NkiTensor:
    """An HBM tensor holding a host constant (array-like)."""
    arr = np.asarray(constant)
    return allocate(arr.shape, dtype or arr.dtype, private_hbm, "constant", fill=arr, api="shared_constant")


def shared_identity_matrix(n: int, dtype=uint8) -> NkiTensor:
    """An n×n identity matrix in HBM."""
    return allocate((n, n), dtype, private_hbm, "identity", fill=np.eye(n), api="shared_identity_matrix")


def _buf(x):
    return x.buffer if isinstance(x, NkiTensor) else x


def is_sbuf(x) -> bool:
    return _buf(x) is sbuf


def is_psum(x) -> bool:
    return _buf(x) is psum


def is_hbm(x) -> bool:
    return _buf(x) in (hbm, private_hbm, shared_hbm)


def is_on_chip(x) -> bool:
    return _buf(x) in (sbuf, psum)


class _TileSize:
    """``nl.tile_size``: hardware tile limits (per current target where they differ)."""

    pmax = 128
    psum_fmax = 512
    psum_bank_fmax = 512
    psum_bank_fmax_bytes = 2048
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    psum_min_align = 4
    sbuf_min_align = 1

    @property
    def psum_num_banks(self) -> int:
        return 7 if envvars.DMA_TRANSPOSE_AS_PE_TRANSPOSE.read() else 8

    def _target(self):
        ctx = _context.current()
        from ._targets import current_target

        return ctx.target if ctx else current_target()

    @property
    def sbuf_fmax_bytes(self) -> int:
        return self._target().sbuf_partition_bytes

    @property
    def sbuf_fmax(self) -> int:
        return self._target().sbuf_partition_bytes // 4

    @property
    def sbuf_size_bytes(self) -> int:
        return self._target().sbuf_bytes

    total_available_sbuf_size = sbuf_size_bytes


tile_size = _TileSize()


class _FInfo:
    def __init__(self, dtype):
        info = ml_dtypes.finfo(dtype)
        self.min, self.max, self.eps, self.tiny = float(info.min), float(info.max), float(info.eps), float(info.tiny)
        self.dtype = dt.as_dtype(dtype)
        self.bits = info.bits


def finfo(dtype) -> _FInfo:
    """Machine limits of a float type (works for bf16/fp8 too)."""
    return _FInfo(dt.as_dtype(dtype))


fp32 = _FInfo(float32)
bf16 = _FInfo(bfloat16)
fp16 = _FInfo(float16)


def static_cast(array, dtype) -> np.ndarray:
    """Host-side cast of a NumPy array (used by tests to build bf16/fp8 inputs)."""
    return np.asarray(array).astype(dt.as_dtype(dtype))


@contextlib.contextmanager
def no_reorder():
    """Keep instructions in program order (the simulator never reorders: a no-op scope)."""
    yield


gemm_grid = unimplemented("nki.language.gemm_grid", "not documented beyond its name in our references")

def device_print(prefix: str, x) -> None:
    """Print a tensor's values from inside a kernel (simulation only)."""
    _context.require("device_print")
    v = np.asarray(x.read()) if isinstance(x, NkiTensor) else x
    print(prefix, v)


# -- indexing / loops / SPMD ---------------------------------------------------------------------------------
def ds(start, size, step: int = 1) -> DynSlice:
    """Dynamic slice: ``size`` elements starting at ``start`` (``t[nl.ds(i * 128, 128), :]``)."""
    return DynSlice(start, size, step)


def _range(start, stop=None, step=1, api: str = "range"):
    if stop is None:
        start, stop = 0, start
    loop = range(int(start), int(stop), int(step))
    _limits.check_trip_count(api, len(loop))
    return loop


def affine_range(start, stop=None, step=1) -> range:
    """Parallel loop iterator (no loop-carried dependency except associative accumulation)."""
    return _range(start, stop, step, "affine_range")


def sequential_range(start, stop=None, step=1) -> range:
    """Loop iterator with loop-carried dependencies."""
    return _range(start, stop, step, "sequential_range")


def static_range(start, stop=None, step=1) -> range:
    """Fully unrolled loop iterator (executes like Python ``range`` in the simulator)."""
    return _range(start, stop, step, "static_range")


def dynamic_range(start, stop=None, step=1) -> range:
    """Runtime loop whose bounds may be registers (``nisa.register_alloc``)."""
    return _range(start, stop, step, "dynamic_range")


def fori_loop(lower, upper, body, step: int = 1, init_val=None):
    """Runtime loop: calls ``body(i)`` (or ``body(i, val)`` → new val when ``init_val`` is given)."""
    val = init_val
    for i in _range(lower, upper, step, "fori_loop"):
        val = body(i) if init_val is None else body(i, val)
    return val


def while_loop(cond, body, init_val=None):
    """Runtime while loop: ``while cond(val): val = body(val)``; ``cond`` may be a register-valued callable."""
    val = init_val
    while (cond(val) if callable(cond) else bool(cond)):
        val = body(val)
    return val


def program_id(axis: int = 0) -> int:
    """Index of this kernel instance along launch-grid ``axis``."""
    ctx = _context.require("program_id")
    if not ctx.grid:
        return 0
    if not 0 <= axis < len(ctx.grid):
        raise NkiValidationError(f"program_id axis {axis} out of range for a {len(ctx.grid)}-D launch grid",
                                 code="err_invalid_axis", location=kernel_location(2))
    return ctx.program_id[axis]


def num_programs(axes=0) -> int:
    """Number of instances along ``axes`` (an int, a tuple (product), or None for all)."""
    ctx = _context.require("num_programs")
    grid = ctx.grid or (1,)
    if axes is None:
        return math.prod(grid)
    if isinstance(axes, (tuple, list)):
        return math.prod(grid[a] for a in axes)
    if not 0 <= axes < len(grid):
        raise NkiValidationError(f"num_programs axis {axes} out of range for a {len(grid)}-D launch grid",
                                 code="err_invalid_axis", location=kernel_location(2))
    return grid[axes]


def program_ndim() -> int:
    """Number of launch-grid dimensions."""
    return len(_context.require("program_ndim").grid)


# -- data movement -------------------------------------------------------------------------------------------
def load(src: NkiTensor, dtype=None) -> NkiTensor:
    """Copy an HBM tensor (region) into a new SBUF tile (DMA)."""
    _context.require("load")
    _limits.check_tensor(src, "load", "src")
    if src.ndim and src.shape[0] > 128:
        raise NkiValidationError(f"number of partitions {src.shape[0]} exceed architecture limitation of 128.",
                                 code="err_num_partition_exceed_arch_limit", location=kernel_location(2))
    t = allocate(src.shape, dtype or src.dtype, sbuf, "load", api="load")
    nisa.dma_copy(t, src)
    return t


def store(dst: NkiTensor, value) -> None:
    """Copy a tile to an HBM tensor (region); PSUM tiles are first copied to SBUF."""
    _context.require("store")
    _limits.check_tensor(dst, "store", "dst")
    if isinstance(value, NkiTensor) and value.buffer is psum:
        tmp = allocate(value.shape, value.dtype, sbuf, "store_tmp", api="store")
        nisa.tensor_copy(tmp, value)
        value = tmp
    if not isinstance(value, NkiTensor):
        tmp = allocate(dst.shape, dst.dtype, sbuf, "store_tmp", api="store")
        nisa.memset(tmp, value)
        value = tmp
    nisa.dma_copy(dst, value)


def load_transpose2d(src: NkiTensor, dtype=None) -> NkiTensor:
    """Load a 2-D HBM region transposed into SBUF (DMA transpose)."""
    ctx = _context.require("load_transpose2d")
    _limits.check_ndim(src, "load_transpose2d", "src", 2)
    if src.shape[1] > 128:
        raise NkiValidationError(f"number of partitions {src.shape[1]} exceed architecture limitation of 128.",
                                 code="err_num_partition_exceed_arch_limit", location=kernel_location(2))
    t = allocate((src.shape[1], src.shape[0]), dtype or src.dtype, sbuf, "load_transpose2d", api="load_transpose2d")
    t.write(np.asarray(src.read()).T)
    ctx.core.timeline.dma(t.size * t.itemsize * 2, t.shape[0], nisa._allocs((src,)), nisa._allocs((t,)),
                          "load_transpose2d", src.size * src.itemsize)
    return t


def atomic_rmw(dst: NkiTensor, value, op) -> None:
    """``dst = op(dst, value)`` on an HBM region (DMA read-modify-write)."""
    ctx = _context.require("atomic_rmw")
    spec = resolve(op)
    v = value.read_f32() if isinstance(value, NkiTensor) else np.float32(value)
    dst.write(apply_binary(spec, dst.read_f32(), np.asarray(v).reshape(dst.shape) if np.ndim(v) else v))
    ctx.core.timeline.dma(dst.size * dst.itemsize * 2, dst.shape[0] if dst.ndim else 1,
                          nisa._allocs((dst, value)), nisa._allocs((dst,)), "atomic_rmw", dst.size * dst.itemsize * 2)


# -- tile math -----------------------------------------------------------------------------------------------
def _alu(name: str):
    def deco(fn):
        fn._nki_op = name
        return fn

    return deco


def _tile_dtype(*xs):
    ds_ = [x.dtype for x in xs if isinstance(x, NkiTensor)]
    if not ds_:
        return float32
    out = ds_[0]
    for d in ds_[1:]:
        if d != out:
            if dt.is_float(d) != dt.is_float(out):
                out = d if dt.is_float(d) else out
            elif d.itemsize > out.itemsize:
                out = d
    return out


def _operand(x, op, arg, as_int=False):
    if isinstance(x, NkiTensor):
        _limits.check_onchip(x, op, arg)
        _limits.check_partition(x, op, arg)
        v = x.read()
        if as_int:
            return np.asarray(v)
        return np.asarray(v, dtype=np.float32)
    if as_int:
        return np.asarray(x)
    return np.float32(x)


def _binary_tile(name: str, x, y, dtype, default_dtype=None, out: NkiTensor | None = None):
    """``name(x, y)`` as a new SBUF tile, or computed into ``out`` (``acc += x``: no temporary tile)."""
    ctx = _context.require(name)
    spec = resolve(name)
    if not isinstance(x, NkiTensor) and not isinstance(y, NkiTensor):
        raise NkiValidationError(f"'{name}' needs at least one tile operand", location=kernel_location(3))
    ints = builtins.all(dt.is_int(t.dtype) or t.dtype == bool_ for t in (x, y) if isinstance(t, NkiTensor)) and builtins.all(
        isinstance(t, (NkiTensor, int, np.integer, bool)) for t in (x, y))
    use_int = spec.kind == "bitvec" or (ints and spec.name not in ("divide", "power"))
    a = _operand(x, name, "x", use_int)
    b = _operand(y, name, "y", use_int)
    if isinstance(x, NkiTensor) and isinstance(y, NkiTensor):
        if x.ndim == y.ndim and x.shape != y.shape and x.size == y.size and x.shape[0] == y.shape[0]:
            b = b.reshape(a.shape)
    try:
        shape = np.broadcast_shapes(np.shape(a), np.shape(b))
    except ValueError:
        xs = fmt_shape(x.shape) if isinstance(x, NkiTensor) else "scalar"
        ys = fmt_shape(y.shape) if isinstance(y, NkiTensor) else "scalar"
        raise NkiValidationError(f"operands of '{name}' have incompatible shapes x{xs} and y{ys}",
                                 code="err_shape_mismatch", location=kernel_location(3)) from None
    if use_int:
        res = apply_binary(spec, a.astype(np.int64), b.astype(np.int64))
    else:
        res = apply_binary(spec, a, b)
    if out is None:
        out_dt = dt.as_dtype(dtype) if dtype is not None else (default_dtype or _tile_dtype(x, y))
        out = allocate(shape, out_dt, sbuf, name, api=name)
        out.write(np.broadcast_to(res, shape))
    elif math.prod(shape) == out.size:
        out.write(np.broadcast_to(res, shape).reshape(out.shape))
    else:
        raise NkiValidationError(f"cannot update tile {fmt_shape(out.shape)} in place with the {fmt_shape(shape)} "
                                 f"result of '{name}'", code="err_shape_mismatch", location=kernel_location(3))
    tiles = [t for t in (x, y) if isinstance(t, NkiTensor)]
    n = out.free_size
    # one streamed operand (the other a constant or a [P, 1] column broadcast along the free axis, which the
    # compiler lowers to tensor_scalar) costs N cycles; two streamed tiles are a tensor_tensor, 2N
    streamed = [t for t in tiles if t.free_size > 1 or n == 1]
    cycles = _bmax(MIN_II, n) if len(streamed) <= 1 or any(t.buffer is psum for t in tiles) else 2 * n
    nisa._charge(ctx, "gpsimd" if name == "power" else "vector", cycles, tiles, (out,), name)
    return out


def _make_binary(name: str, default_bool: bool = False):
    if default_bool:
        def f(x: NkiTensor | float, y: NkiTensor | float, dtype=bool_) -> NkiTensor:
            return _binary_tile(name, x, y, dtype)
    else:
        def f(x: NkiTensor | float, y: NkiTensor | float, dtype=None) -> NkiTensor:
            return _binary_tile(name, x, y, dtype)
    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"Element-wise ``{name}(x, y)`` as a new SBUF tile (x/y tiles or scalars, broadcastable)."
    f._nki_op = name
    return f


add = _make_binary("add")
subtract = _make_binary("subtract")
multiply = _make_binary("multiply")
divide = _make_binary("divide")
maximum = _make_binary("maximum")
minimum = _make_binary("minimum")
power = _make_binary("power")
fmod = _make_binary("fmod")
mod = _make_binary("mod")
abs_max = _make_binary("abs_max")
abs_min = _make_binary("abs_min")
equal = _make_binary("equal", True)
not_equal = _make_binary("not_equal", True)
less = _make_binary("less", True)
less_equal = _make_binary("less_equal", True)
greater = _make_binary("greater", True)
greater_equal = _make_binary("greater_equal", True)
logical_and = _make_binary("logical_and", True)
logical_or = _make_binary("logical_or", True)
logical_xor = _make_binary("logical_xor", True)
bitwise_and = _make_binary("bitwise_and")
bitwise_or = _make_binary("bitwise_or")
bitwise_xor = _make_binary("bitwise_xor")
left_shift = _make_binary("left_shift")
right_shift = _make_binary("right_shift")


def _unary_tile(name: str, x, dtype, engine: str = "scalar"):
    ctx = _context.require(name)
    spec = resolve(name)
    if not isinstance(x, NkiTensor):
        return apply_unary(spec, np.float32(x))
    if engine == "gpsimd" and x.buffer is psum:
        raise NkiValidationError(f"'{name}' runs on GpSimd, which cannot read PSUM: copy {x.name} to SBUF first",
                                 code="err_unsupported_memory", location=kernel_location(3))
    v = _operand(x, name, "x", as_int=spec.kind == "unary_bitvec")
    res = apply_unary(spec, v)
    out_dt = dt.as_dtype(dtype) if dtype is not None else (bool_ if name == "logical_not" else x.dtype)
    out = allocate(x.shape, out_dt, sbuf, name, api=name)
    out.write(res)
    nisa._charge(ctx, engine, _bmax(MIN_II, x.free_size), (x,), (out,), name)
    return out


def _make_unary(name: str, engine: str = "scalar"):
    def f(x: NkiTensor, dtype=None) -> NkiTensor:
        return _unary_tile(name, x, dtype, engine)

    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"Element-wise ``{name}(x)`` as a new SBUF tile (computed in float32)."
    f._nki_op = name
    return f


exp = _make_unary("exp")
log = _make_unary("log")
sqrt = _make_unary("sqrt")
rsqrt = _make_unary("rsqrt", "gpsimd")
reciprocal = _make_unary("reciprocal", "vector")
abs = _make_unary("abs")
negative = _make_unary("negative")
sign = _make_unary("sign")
square = _make_unary("square")
sin = _make_unary("sin")
cos = _make_unary("cos")
tan = _make_unary("tan")
arctan = _make_unary("arctan")
tanh = _make_unary("tanh")
ceil = _make_unary("ceil", "vector")
floor = _make_unary("floor", "vector")
trunc = _make_unary("trunc", "vector")
invert = _make_unary("invert", "vector")
logical_not = _make_unary("logical_not", "vector")
sigmoid = _make_unary("sigmoid")
relu = _make_unary("relu")
gelu = _make_unary("gelu")
gelu_dx = _make_unary("gelu_dx")
gelu_apprx_tanh = _make_unary("gelu_apprx_tanh")
gelu_apprx_sigmoid = _make_unary("gelu_apprx_sigmoid")
gelu_apprx_sigmoid_dx = _make_unary("gelu_apprx_sigmoid_dx")
silu = _make_unary("silu")
silu_dx = _make_unary("silu_dx")
softplus = _make_unary("softplus")
mish = _make_unary("mish")
erf = _make_unary("erf")
erf_dx = _make_unary("erf_dx")
copy = _make_unary("copy")
bypass = _make_unary("bypass")


def _reduce_tile(name: str, op: str, x: NkiTensor, axis, dtype, keepdims: bool, post=None):
    ctx = _context.require(name)
    _limits.check_onchip(x, name, "x")
    axes = nisa._check_reduce_axes(name, x, axis) if x.ndim > 1 else ()
    if not axes:
        raise NkiValidationError(f"'{name}' needs a free axis to reduce (axis 0 is the partition axis)",
                                 code="err_unsupported_axis", location=kernel_location(3))
    spec = resolve(op)
    v = x.read_f32()
    with np.errstate(all="ignore"):
        r = spec.reduce(v, axis=axes, keepdims=keepdims)
        if post is not None:
            r = post(r, v, axes, keepdims)
    out = allocate(np.shape(r), dt.as_dtype(dtype) if dtype is not None else x.dtype, sbuf, name, api=name)
    out.write(r)
    n = x.free_size
    nisa._charge(ctx, "vector", _bmax(MIN_II, n // 2 if x.itemsize == 2 and op in ("add", "maximum") else n),
                 (x,), (out,), name)
    return out


def sum(x: NkiTensor, axis, dtype=None, keepdims: bool = False) -> NkiTensor:
    """Sum over free axes."""
    return _reduce_tile("sum", "add", x, axis, dtype, keepdims)


def max(x: NkiTensor, axis, dtype=None, keepdims: bool = False) -> NkiTensor:
    """Maximum over free axes."""
    return _reduce_tile("max", "maximum", x, axis, dtype, keepdims)


def min(x: NkiTensor, axis, dtype=None, keepdims: bool = False) -> NkiTensor:
    """Minimum over free axes."""
    return _reduce_tile("min", "minimum", x, axis, dtype, keepdims)


def prod(x: NkiTensor, axis, dtype=None, keepdims: bool = False) -> NkiTensor:
    """Product over free axes."""
    return _reduce_tile("prod", "multiply", x, axis, dtype, keepdims)


def all(x: NkiTensor, axis, dtype=bool_, keepdims: bool = False) -> NkiTensor:
    """Logical AND over free axes."""
    return _reduce_tile("all", "logical_and", x, axis, dtype, keepdims)


def mean(x: NkiTensor, axis, dtype=None, keepdims: bool = False) -> NkiTensor:
    """Arithmetic mean over free axes."""
    def post(r, v, axes, kd):
        return r / np.float32(math.prod(v.shape[a] for a in axes))

    return _reduce_tile("mean", "add", x, axis, dtype, keepdims, post)


def var(x: NkiTensor, axis, dtype=None, keepdims: bool = False) -> NkiTensor:
    """Population variance over free axes."""
    def post(r, v, axes, kd):
        return np.var(v, axis=axes, keepdims=kd)

    return _reduce_tile("var", "add", x, axis, dtype, keepdims, post)


sum._nki_op = "add"
max._nki_op = "maximum"
min._nki_op = "minimum"
prod._nki_op = "multiply"


def matmul(x: NkiTensor, y: NkiTensor, transpose_x: bool = False) -> NkiTensor:
    """``x @ y`` into a new PSUM fp32 tile. ``transpose_x=True`` means ``x`` is already [K, M] (stationary);
    otherwise ``x`` is [M, K] and a Tensor Engine transpose is inserted first."""
    ctx = _context.require("matmul")
    if not transpose_x:
        _limits.check_ndim(x, "matmul", "x", 2)
        _limits.check_dim_size(x, "matmul", "x", 0, 128)
        _limits.check_dim_size(x, "matmul", "x", 1, 128)
        xt_ps = allocate((x.shape[1], x.shape[0]), x.dtype if x.itemsize < 4 else float32, psum, "matmul_xT",
                         api="matmul")
        if x.buffer is not sbuf:
            tmp = allocate(x.shape, x.dtype, sbuf, "matmul_x", api="matmul")
            nisa.tensor_copy(tmp, x)
            x = tmp
        nisa.nc_transpose(xt_ps, x, engine=nisa.engine.tensor)
        xt = allocate(xt_ps.shape, x.dtype, sbuf, "matmul_xT", api="matmul")
        nisa.tensor_copy(xt, xt_ps)
        x = xt
    del ctx
    out = allocate((x.free_size, y.free_size), float32, psum, "matmul", api="matmul")
    nisa.nc_matmul(out, x, y, accumulate=False)
    return out


def transpose(x: NkiTensor, dtype=None) -> NkiTensor:
    """2-D transpose of a tile (≤128×128): Vector Engine for ≤32×32, else Tensor Engine into PSUM."""
    _context.require("transpose")
    _limits.check_ndim(x, "transpose", "x", 2)
    _limits.check_dim_size(x, "transpose", "x", 0, 128)
    _limits.check_dim_size(x, "transpose", "x", 1, 128)
    small = x.shape[0] <= 32 and x.shape[1] <= 32
    out = allocate((x.shape[1], x.shape[0]), dtype or x.dtype, sbuf if small else psum, "transpose", api="transpose")
    if not small and x.buffer is not sbuf:
        tmp = allocate(x.shape, x.dtype, sbuf, "transpose_in", api="transpose")
        nisa.tensor_copy(tmp, x)
        x = tmp
    nisa.nc_transpose(out, x, engine=nisa.engine.vector if small else nisa.engine.tensor)
    return out


def softmax(x: NkiTensor, axis, dtype=None, compute_dtype=None) -> NkiTensor:
    """``exp(x - max) / sum(exp(x - max))`` along a free axis."""
    ctx = _context.require("softmax")
    _limits.check_onchip(x, "softmax", "x")
    axes = nisa._check_reduce_axes("softmax", x, axis)
    v = x.read_f32()
    with np.errstate(all="ignore"):
        e = np.exp(v - v.max(axis=axes, keepdims=True))
        r = e / e.sum(axis=axes, keepdims=True)
    out = allocate(x.shape, dt.as_dtype(dtype) if dtype is not None else x.dtype, sbuf, "softmax", api="softmax")
    out.write(r)
    n = x.free_size
    nisa._charge(ctx, "vector", _bmax(MIN_II, n), (x,), (), "tensor_reduce")
    nisa._charge(ctx, "scalar", _bmax(MIN_II, n) + MIN_II, (x,), (), "activation")
    nisa._charge(ctx, "vector", _bmax(MIN_II, n), (x,), (out,), "tensor_scalar")
    return out


def rms_norm(x: NkiTensor, w: NkiTensor, axis, n, epsilon: float = 1e-6, dtype=None,
             compute_dtype=None) -> NkiTensor:
    """``x * rsqrt(sum(x²)/n + epsilon) * w`` along free ``axis`` (``w`` broadcast along partitions)."""
    ctx = _context.require("rms_norm")
    _limits.check_onchip(x, "rms_norm", "x")
    axes = nisa._check_reduce_axes("rms_norm", x, axis)
    v = x.read_f32()
    wv = w.read_f32() if isinstance(w, NkiTensor) else np.float32(w)
    with np.errstate(all="ignore"):
        ms = (v * v).sum(axis=axes, keepdims=True) / np.float32(n)
        r = v / np.sqrt(ms + np.float32(epsilon)) * np.broadcast_to(wv, v.shape) if np.ndim(wv) else \
            v / np.sqrt(ms + np.float32(epsilon)) * wv
    out = allocate(x.shape, dt.as_dtype(dtype) if dtype is not None else x.dtype, sbuf, "rms_norm", api="rms_norm")
    out.write(r)
    nn = x.free_size
    nisa._charge(ctx, "scalar", _bmax(MIN_II, nn) + MIN_II, (x,), (), "activation_reduce")
    nisa._charge(ctx, "vector", 2 * nn, (x, w), (out,), "scalar_tensor_tensor")
    return out


def where(condition: NkiTensor, x, y, dtype=None) -> NkiTensor:
    """``x`` where ``condition`` else ``y`` (element-wise, broadcastable)."""
    ctx = _context.require("where")
    c = np.asarray(condition.read()) != 0
    a = _operand(x, "where", "x")
    b = _operand(y, "where", "y")
    res = np.where(c, a, b)
    out = allocate(res.shape, dt.as_dtype(dtype) if dtype is not None else _tile_dtype(x, y), sbuf, "where",
                   api="where")
    out.write(res)
    nisa._charge(ctx, "vector", _bmax(MIN_II, out.free_size), (condition, x, y), (out,), "select")
    return out


def dropout(x: NkiTensor, rate, dtype=None) -> NkiTensor:
    """Zero elements with probability ``rate`` (kept elements are not rescaled, as ``nisa.dropout``)."""
    _context.require("dropout")
    out = allocate(x.shape, dt.as_dtype(dtype) if dtype is not None else x.dtype, sbuf, "dropout", api="dropout")
    nisa.dropout(out, x, rate)
    return out


def expand_dims(data: NkiTensor, axis: int) -> NkiTensor:
    """View with a new size-1 axis."""
    return data.expand_dims(axis)


def broadcast_to(src: NkiTensor, shape) -> NkiTensor:
    """Broadcast a tile to ``shape`` as a new on-chip tile (partition broadcast from 1 is allowed).

    The Vector engine works lane by lane, so a partition broadcast of an fp32 row is what the chip does with the
    Tensor Engine ("alternative use", the fused Mamba tutorial's Step 3): a matmul of a ones row by the source row
    into PSUM, which the consumer reads at the PSUM rate. Other broadcasts (free axis, other dtypes, rows wider
    than one PSUM bank) are a Vector copy into SBUF.
    """
    ctx = _context.require("broadcast_to")
    shape = tuple(shape)
    if (src.buffer is sbuf and src.dtype == float32 and len(shape) == 2 and src.shape == (1, shape[1])
            and shape[0] > 1 and shape[1] * 4 <= _limits.PSUM_BANK_BYTES):
        ones = allocate((1, shape[0]), float32, sbuf, "broadcast_ones", api="broadcast_to")
        ones.write(np.ones(ones.shape, np.float32))  # a compile-time constant tile: no instruction
        out = allocate(shape, float32, psum, "broadcast_to", api="broadcast_to")
        nisa.nc_matmul(out, ones, src)
        return out
    out = allocate(shape, src.dtype, sbuf, "broadcast_to", api="broadcast_to")
    out.write(np.broadcast_to(src.read(), shape))
    nisa._charge(ctx, "vector", _bmax(MIN_II, out.free_size), (src,), (out,), "tensor_copy")
    return out


def gather_flattened(data: NkiTensor, indices: NkiTensor, axis: int = 0, dtype=None) -> NkiTensor:
    """Per partition, gather elements of the flattened free dims of ``data`` at ``indices``."""
    _context.require("gather_flattened")
    out = allocate(indices.shape, dt.as_dtype(dtype) if dtype is not None else data.dtype, sbuf, "gather",
                   api="gather_flattened")
    nisa.nc_n_gather(out, data, indices)
    return out


NkiTensor._language = sys.modules[__name__]  # the operators of every tensor (`t + u`) call this module's functions
