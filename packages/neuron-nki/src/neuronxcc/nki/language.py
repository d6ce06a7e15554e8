"""``neuronxcc.nki.language`` (legacy ``nl``, NKI 0.1): tile-returning functions on the shared simulator core.

Every function here delegates to the current API (``nki.language`` / ``nki.isa``) for validation, numerics and
cost, and adds only the legacy surface:

* keyword-only ``mask=`` (a predicate over the result tile; unselected elements stay unwritten, or for
  ``load``/``store`` untouched) and ``dtype=``;
* NKI 0.1 type promotion (``(float16, bfloat16) -> float32``, weak Python scalars count as int32/float32);
* partition-aligned broadcasting (a ``[P]`` tile from ``nl.sum(x, axis=1)`` combines with a ``[P, F]`` tile);
* reductions over any list of free axes (``nl.sum(t, axis=[2, 4])`` in the average-pool tutorial);
* ``nl.arange``/``nl.mgrid`` index expressions, ``nl.par_dim`` (with deprecated block dimensions),
  ``nl.spmd_dim``/``nl.nc``;
* results are :class:`~neuronxcc.nki._tile.LegacyTile` so they can be indexed with index expressions.
"""

from __future__ import annotations

import ast
import builtins
import functools
import inspect
import math
import re
import sys
import textwrap
import warnings

import numpy as np

import nki.language as _cnl
from nki import extension as _ext
from nki.extension import (
    BUFFERS,
    MIN_II,
    Allocation,
    Buffer,
    NkiTensor,
    NkiValidationError,
    allocate,
    bfloat16,
    bool_,
    float8_e4m3,
    float8_e5m2,
    float16,
    float32,
    hbm,
    int8,
    int16,
    int32,
    kernel_location,
    private_hbm,
    psum,
    resolve,
    sbuf,
    shared_hbm,
    tfloat32,
    uint8,
    uint16,
    uint32,
    unimplemented,
)
from nki.language import (
    affine_range,
    bf16,
    ds,
    finfo,
    fp16,
    fp32,
    program_id,
    program_ndim,
    sequential_range,
    static_cast,
    static_range,
    tile_size,
)

from . import _api_tables
from . import isa as _lisa
from ._index import Predicate, arange, mgrid, nc, par_dim, spmd_dim
from ._promotion import promote
from ._tile import (
    LegacyTile,
    check_access,
    check_matmul_operands,
    instruction_result,
    mask_array,
    masked_write,
    wrap,
)
from ._tile import align as _align
from ._tile import check_operands as _checked

__all__ = [  # grouped by topic
    "bool_", "int8", "int16", "int32", "uint8", "uint16", "uint32", "float16", "float32", "bfloat16", "tfloat32",
    "float8_e4m3", "float8_e5m2", "fp32", "bf16", "fp16", "finfo", "tile_size",
    "sbuf", "psum", "hbm", "private_hbm", "shared_hbm", "par_dim",
    "ndarray", "zeros", "ones", "full", "rand", "empty_like", "zeros_like", "ones_like", "shared_constant",
    "shared_identity_matrix", "random_seed",
    "load", "store", "load_transpose2d", "atomic_rmw",
    "arange", "mgrid", "ds", "spmd_dim", "nc", "Predicate",
    "affine_range", "sequential_range", "static_range", "program_id", "num_programs", "program_ndim",
    *_api_tables.BINARY, *_api_tables.UNARY,
    "sum", "max", "min", "mean", "prod", "all", "var", "loop_reduce", "all_reduce",
    "matmul", "transpose", "softmax", "rms_norm", "where", "dropout", "expand_dims", "broadcast_to",
    "gather_flattened", "device_print", "static_cast", "gemm_grid",
]

_bmax = builtins.max


# -- shared plumbing -----------------------------------------------------------------------------------------
def _masked(result: NkiTensor, mask, *operands) -> LegacyTile:
    """Wrap a fresh result tile, leaving it unwritten where ``mask`` is false. The result inherits the index
    variables of a same-shaped operand (so masks on chained operations align like on the access)."""
    like = next((o for o in operands if getattr(o, "ivars", None) and o.shape == result.shape), None)
    r = instruction_result(result, mask_array(mask, result.shape, "result", like=like))
    r.ivars = getattr(like, "ivars", None)
    return r


def _charge(engine: str, cycles: float, reads, writes, name: str) -> None:
    _ext.charge(_ext.require_context(name), engine, cycles, reads, writes, name)


# -- memory ----------------------------------------------------------------------------------------------------
def _resolve_buffer(buffer) -> Buffer:
    if buffer is None:
        return sbuf
    if isinstance(buffer, Buffer):
        return buffer
    if isinstance(buffer, str) and buffer in BUFFERS:
        return BUFFERS[buffer]
    inner = getattr(buffer, "buffer", None)  # nki.compiler allocators (sbuf.mod_alloc(...), psum.auto_alloc())
    if isinstance(inner, Buffer):
        return inner
    raise NkiValidationError(f"unsupported buffer {buffer!r}", code="err_unsupported_memory",
                             location=kernel_location(3))


_ASSIGN = re.compile(r"\s*([A-Za-z_]\w*)\s*(?::[^=]+)?=(?!=)")


def _assigned_name() -> str:
    """Name of the variable the kernel line assigns to (``out = nl.ndarray(...)`` → ``out``), for messages."""
    m = _ASSIGN.match(kernel_location(3)[3])
    return m.group(1) if m else ""


def _direct_alloc(shape, dtype, buffer: Buffer, name: str, fill=None, api: str = "ndarray") -> NkiTensor:
    """A directly allocated (``ncc.*.alloc``/``mod_alloc``) on-chip tensor: own storage, placed by the kernel, so
    not in the live-range accounting of other tensors (see ``nki.compiler``); but like every allocation, its
    partition dimension and its bytes per partition must fit the target's SBUF/PSUM partition (a direct tensor
    larger than the partition was accepted)."""
    ctx = _ext.require_context(api)
    dtype = _ext.as_dtype(dtype)
    _ext.check_alloc_onchip(ctx, tuple(shape), dtype, buffer, name)
    sdt = _ext.storage_dtype(dtype, ctx.precise)
    data = np.full(shape, _ext.uninit_value(dtype), dtype=sdt)
    if fill is not None:
        data[...] = _ext.cast_for_store(np.asarray(fill), dtype, sdt, ctx.precise)
    alloc = Allocation(data, dtype, buffer, name or api, ctx.precise)
    if fill is not None and alloc.written is not None:
        alloc.written[...] = True
    return NkiTensor(alloc, data, None, alloc.name)


def _alloc(shape, dtype, buffer, name: str, api: str, fill=None) -> LegacyTile:
    """Allocate, honouring ``nl.par_dim``: dimensions before it are (deprecated) block dimensions, stored
    partition-first so SBUF/PSUM accounting counts ``blocks × free`` bytes per partition."""
    buf = _resolve_buffer(buffer)
    direct = getattr(buffer, "kind", None) in ("alloc", "mod_alloc")  # nki.compiler direct allocation
    make = _direct_alloc if direct else allocate
    name = name or _assigned_name()
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    pd = next((i for i, s in enumerate(shape) if isinstance(s, par_dim)), 0)
    if pd and buf.on_chip:
        warnings.warn(f"tensor '{name or api}' has block dimensions {shape[:pd]} before the partition dimension; "
                      "block dimensions are deprecated (NKI 2.24) - use a list of tiles instead",
                      DeprecationWarning, stacklevel=3)
        stored = (shape[pd], *shape[:pd], *shape[pd + 1:])
        t = make(stored, dtype, buf, name, fill=fill, api=api)
        order = (*tuple(range(1, pd + 1)), 0, *tuple(range(pd + 1, len(shape))))
        t = wrap(t.permute(order))
        t.nblock = pd
    else:
        t = make(tuple(int(s) for s in shape), dtype, buf, name, fill=fill, api=api)
    if fill is not None and buf.on_chip:  # a memset on the Vector Engine, as the core's nl.zeros
        n = t.size // (t.shape[pd] if t.shape else 1)
        _charge("vector", _bmax(MIN_II, n // 2 if fill == 0 and t.itemsize == 2 else n), (), (t,), "memset")
    return wrap(t)


def ndarray(shape, dtype, *, buffer=None, name: str = "", **kwargs) -> LegacyTile:
    """A new uninitialised (NaN / 4-filled) tensor; ``buffer`` defaults to SBUF."""
    return _alloc(shape, dtype, buffer, name, "ndarray")


def zeros(shape, dtype, *, buffer=None, name: str = "", **kwargs) -> LegacyTile:
    """A new tensor of zeros (on-chip: one memset)."""
    return _alloc(shape, dtype, buffer, name, "zeros", fill=0)


def ones(shape, dtype, *, buffer=None, name: str = "", **kwargs) -> LegacyTile:
    """A new tensor of ones."""
    return _alloc(shape, dtype, buffer, name, "ones", fill=1)


def full(shape, fill_value, dtype, *, buffer=None, name: str = "", **kwargs) -> LegacyTile:
    """A new tensor filled with ``fill_value``."""
    return _alloc(shape, dtype, buffer, name, "full", fill=fill_value)


def rand(shape, dtype=float32, *, buffer=None, name: str = "", **kwargs) -> LegacyTile:
    """Uniform [0, 1) random values (seeded by ``nl.random_seed``)."""
    return wrap(_cnl.rand(shape, dtype, _resolve_buffer(buffer), name))


def empty_like(a: NkiTensor, dtype=None, *, buffer=None, name: str = "", **kwargs) -> LegacyTile:
    return ndarray(a.shape, dtype or a.dtype, buffer=buffer or a.buffer, name=name)


def zeros_like(a: NkiTensor, dtype=None, *, buffer=None, name: str = "", **kwargs) -> LegacyTile:
    return zeros(a.shape, dtype or a.dtype, buffer=buffer or a.buffer, name=name)


def ones_like(a: NkiTensor, dtype=None, *, buffer=None, name: str = "", **kwargs) -> LegacyTile:
    return ones(a.shape, dtype or a.dtype, buffer=buffer or a.buffer, name=name)


def shared_constant(constant, dtype=None, **kwargs) -> LegacyTile:
    """An HBM tensor holding a host constant."""
    return wrap(_cnl.shared_constant(constant, dtype))


def shared_identity_matrix(n: int, dtype=uint8, **kwargs) -> LegacyTile:
    """An ``n × n`` identity matrix in HBM."""
    return wrap(_cnl.shared_identity_matrix(n, dtype))


def random_seed(seed, *, mask=None, **kwargs) -> None:
    """Seed the simulator's random generator."""
    _cnl.random_seed(seed)


def num_programs(axes=None) -> int:
    """Instances along ``axes`` (legacy default: all instances of the launch grid)."""
    return _cnl.num_programs(axes)


def device_print(prefix: str, x, *, mask=None, **kwargs) -> None:
    """Print a tile from inside a kernel (works in simulation, as with the legacy simulator)."""
    _cnl.device_print(prefix, x)


# -- data movement -----------------------------------------------------------------------------------------------
def _dma_charge(nbytes: int, rows: int, src, dst, api: str) -> None:
    ctx = _ext.require_context(api)
    hbm_bytes = nbytes if (not src.buffer.on_chip or not dst.buffer.on_chip) else 0
    ctx.core.timeline.dma(nbytes, rows, _ext.allocs((src,)), _ext.allocs((dst,)), api, hbm_bytes)


def load(src: NkiTensor, *, mask=None, dtype=None, **kwargs) -> LegacyTile:
    """HBM → new SBUF tile (DMA). With ``mask`` only the selected elements are read (ragged last tiles)."""
    _ext.require_context("load")
    check_access(src, mask, kernel_location(2))
    m = mask_array(mask, src.shape, "load source", like=src)
    if m is None:
        t = instruction_result(_cnl.load(src, dtype=dtype))
    else:
        t = _alloc(src.shape, dtype or src.dtype, sbuf, "load", "load")
        masked_write(t, np.asarray(src.read(), dtype=np.float32) if _ext.is_float(t.dtype) else src.read(), m)
        _dma_charge(int(m.sum()) * t.itemsize, t.shape[0] if t.ndim else 1, src, t, "load")
        t = instruction_result(t)
    t.ivars = getattr(src, "ivars", None)  # masks on the loaded tile align with the access's variables
    return t


def store(dst: NkiTensor, value, *, mask=None, **kwargs) -> None:
    """Tile (or scalar) → HBM (DMA; PSUM tiles are copied to SBUF first). With ``mask`` only selected elements
    are written."""
    _ext.require_context("store")
    check_access(dst, mask, kernel_location(2))
    if isinstance(value, NkiTensor):
        check_access(value, mask, kernel_location(2))
    m = mask_array(mask, dst.shape, "store destination", like=dst)
    if m is None:
        _cnl.store(dst, value)
        return
    if isinstance(value, NkiTensor) and value.buffer is psum:
        value = _ELEMENTWISE["copy"](value)
    vals = value.read() if isinstance(value, NkiTensor) else value
    if isinstance(value, NkiTensor) and value.shape != dst.shape and value.size == dst.size:
        vals = np.reshape(vals, dst.shape)
    masked_write(dst, np.asarray(vals, dtype=np.float32) if _ext.is_float(dst.dtype) else vals, m)
    src = value if isinstance(value, NkiTensor) else dst
    _dma_charge(int(m.sum()) * dst.itemsize, dst.shape[0] if dst.ndim else 1, src, dst, "store")


def load_transpose2d(src: NkiTensor, *, mask=None, dtype=None, **kwargs) -> LegacyTile:
    """Load a 2-D HBM region transposed into SBUF."""
    _checked(mask, src)
    return _masked(_cnl.load_transpose2d(src, dtype=dtype), mask)


def atomic_rmw(dst: NkiTensor, value, op, *, mask=None, **kwargs) -> None:
    """``dst = op(dst, value)`` on an HBM region."""
    _checked(mask, dst, value)
    if mask is not None:
        raise NkiValidationError("atomic_rmw with mask= is not supported by the simulator",
                                 code="err_unsupported_mask", location=kernel_location(2))
    _cnl.atomic_rmw(dst, value, op)


# -- element-wise ---------------------------------------------------------------------------------------------------
def _make_binary(name: str):
    core_fn = getattr(_cnl, name)
    default_dtype = inspect.signature(core_fn).parameters["dtype"].default  # bool_ for comparisons, as the core's

    def f(x, y, *, dtype=default_dtype, mask=None, **kwargs):
        _checked(mask, x, y)
        a, b = _align(x, y)
        if dtype is None:
            dtype = promote(x, y)
            if name == "divide" and not _ext.is_float(dtype):  # true division, as NumPy's '/': floor(i / n) is exact
                dtype = float32
        return _masked(core_fn(a, b, dtype=dtype), mask, x, y)

    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"Element-wise ``{name}(x, y)`` as a new tile (legacy promotion and broadcasting; ``mask=``)."
    f._nki_op = name
    return f


def _make_unary(name: str):
    core_fn = getattr(_cnl, name)

    def f(x, *, dtype=None, mask=None, **kwargs):
        _checked(mask, x)
        r = core_fn(x, dtype=dtype)
        return _masked(r, mask, x) if isinstance(r, NkiTensor) else r

    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"Element-wise ``{name}(x)`` as a new tile (float32 math; ``mask=``)."
    f._nki_op = name
    return f


# One function per element-wise name of the legacy API tables (the lists are kept once, there); `torch` makes
# its `torch.*` functions the same way, from a table. `store` and `all_reduce` call `copy` through the dict.
_ELEMENTWISE = {**{name: _make_binary(name) for name in _api_tables.BINARY},
                **{name: _make_unary(name) for name in _api_tables.UNARY}}
globals().update(_ELEMENTWISE)


# -- reductions -----------------------------------------------------------------------------------------------------
def _axes(x: NkiTensor, axis, api: str) -> tuple[int, ...]:
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    axes = tuple(sorted({int(a) % x.ndim for a in axes}))
    if 0 in axes:
        raise NkiValidationError(f"'{api}' cannot reduce the partition axis (axis 0)", code="err_unsupported_axis",
                                 location=kernel_location(3))
    return axes


def _reduce(api: str, op: str, x: NkiTensor, axis, dtype, mask, keepdims: bool, post=None) -> LegacyTile:
    """Reduce any free axes on the Vector Engine (one instruction, cost as ``nisa.tensor_reduce``)."""
    _ext.require_context(api)
    _checked(mask, x)
    axes = _axes(x, axis, api)
    spec = resolve(op)
    v = x.read_f32()
    m = mask_array(mask, x.shape, "input", like=x) if mask is not None else None
    with np.errstate(all="ignore"):
        if m is not None:
            v = np.where(m, v, np.float32(spec.identity if spec.identity is not None else 0))
        r = spec.reduce(v, axis=axes, keepdims=keepdims)
        if post is not None:
            cnt = np.sum(m, axis=axes, keepdims=keepdims) if m is not None else \
                math.prod(x.shape[a] for a in axes)
            r = post(r, v, axes, keepdims, cnt, m)
    out = _alloc(np.shape(r), dtype if dtype is not None else x.dtype, sbuf, api, api)
    out.write(r)
    n = x.free_size
    fast = x.itemsize == 2 and op in ("add", "maximum")
    _charge("vector", _bmax(MIN_II, n // 2 if fast else n), (x,), (out,), api)
    return instruction_result(out)


def sum(x, axis, *, dtype=None, mask=None, keepdims: bool = False, **kwargs) -> LegacyTile:
    """Sum over the free ``axis`` (int or list of ints)."""
    return _reduce("sum", "add", x, axis, dtype, mask, keepdims)


def max(x, axis, *, dtype=None, mask=None, keepdims: bool = False, **kwargs) -> LegacyTile:
    """Maximum over free axes."""
    return _reduce("max", "maximum", x, axis, dtype, mask, keepdims)


def min(x, axis, *, dtype=None, mask=None, keepdims: bool = False, **kwargs) -> LegacyTile:
    """Minimum over free axes."""
    return _reduce("min", "minimum", x, axis, dtype, mask, keepdims)


def prod(x, axis, *, dtype=None, mask=None, keepdims: bool = False, **kwargs) -> LegacyTile:
    """Product over free axes."""
    return _reduce("prod", "multiply", x, axis, dtype, mask, keepdims)


def all(x, axis, *, dtype=bool_, mask=None, keepdims: bool = False, **kwargs) -> LegacyTile:
    """Logical AND over free axes."""
    return _reduce("all", "logical_and", x, axis, dtype, mask, keepdims)


def mean(x, axis, *, dtype=None, mask=None, keepdims: bool = False, **kwargs) -> LegacyTile:
    """Arithmetic mean over free axes (masked-out elements are not counted)."""
    return _reduce("mean", "add", x, axis, dtype, mask, keepdims,
                   lambda r, v, axes, kd, cnt, m: r / np.float32(cnt) if m is None else r / np.maximum(cnt, 1))


def var(x, axis, *, dtype=None, mask=None, **kwargs) -> LegacyTile:
    """Population variance over free axes."""
    def post(r, v, axes, kd, cnt, m):
        if m is None:
            return np.var(v, axis=axes, keepdims=kd)
        mu = np.sum(v, axis=axes, keepdims=True) / np.maximum(np.sum(m, axis=axes, keepdims=True), 1)
        return np.sum(np.where(m, (v - mu) ** 2, 0), axis=axes, keepdims=kd) / np.maximum(cnt, 1)

    return _reduce("var", "add", x, axis, dtype, mask, False, post)


for _f, _op in ((sum, "add"), (max, "maximum"), (min, "minimum"), (prod, "multiply")):
    _f._nki_op = _op

def loop_reduce(x, op, loop_indices, *, dtype=None, mask=None, **kwargs) -> LegacyTile:
    """``b = nl.loop_reduce(a, op, loop_indices=[k])``: the destination tile ``b`` is also the operand, i.e.
    ``b = op(b, a)`` updated in place each iteration (one ``tensor_tensor``). The destination is the assignment
    target of the kernel statement (a name or a subscript such as ``acc[:, 1, :]``), found in its syntax tree and
    evaluated in the kernel's frame, so it must already hold a tile."""
    frame = sys._getframe(1)
    while frame is not None and _ext.is_internal_file(frame.f_code.co_filename):
        frame = frame.f_back
    target = _assignment_target(frame.f_code, frame.f_lineno) if frame else None
    dst = None
    if target is not None:
        try:
            dst = eval(target, frame.f_globals, frame.f_locals)  # the kernel statement's own target expression
        except (NameError, LookupError, AttributeError):
            dst = None
    if not isinstance(dst, NkiTensor):
        raise NkiValidationError("loop_reduce must be assigned to an existing tile, as in "
                                 "'b = nl.loop_reduce(a, op=np.add, loop_indices=[k])' with b allocated before "
                                 "the loop", code="err_unsupported_loop_reduce", location=kernel_location(2))
    dst[...] = _lisa.tensor_tensor(dst, x, op, dtype=dtype or dst.dtype, mask=mask)
    return dst


@functools.cache
def _statements(code) -> list[ast.stmt]:
    """The simple statements of a kernel function's source, with absolute line numbers."""
    try:
        lines, start = inspect.getsourcelines(code)
    except (OSError, TypeError):
        return []
    tree = ast.parse(textwrap.dedent("".join(lines)))
    ast.increment_lineno(tree, start - 1)
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))]


@functools.cache
def _assignment_target(code, lineno: int):
    """Compiled target expression of the assignment statement spanning ``lineno`` whose value calls
    ``loop_reduce`` (``acc[:, 1, :] = nl.loop_reduce(...)`` → ``acc[:, 1, :]``), or None."""
    for node in _statements(code):
        if not node.lineno <= lineno <= node.end_lineno:
            continue
        call = node.value
        if not (isinstance(call, ast.Call) and getattr(call.func, "attr", getattr(call.func, "id", None))
                == "loop_reduce"):
            continue
        tgt = node.targets[0] if isinstance(node, ast.Assign) else node.target
        if isinstance(tgt, (ast.Name, ast.Subscript, ast.Attribute)):
            return compile(ast.unparse(tgt), code.co_filename, "eval")
    return None


def all_reduce(x: NkiTensor, op, program_axes, *, dtype=None, mask=None, parallel_reduce: bool = True,
               asynchronous: bool = False, **kwargs) -> NkiTensor:
    """``op``-reduce ``x`` over the SPMD programs along ``program_axes`` (AWS's legacy ``nl.all_reduce`` page).

    Only the one-program case has a meaning here: the simulator runs a launch grid's instances one after another,
    so no instance can see another's tile. Over a single program the reduction is ``x`` itself (cast to
    ``dtype``), charged as the Vector copy it is; more programs raise ``NotImplementedError`` saying why."""
    if not callable(op):
        raise TypeError(f"all_reduce: op must be a NumPy ALU operator (e.g. np.add), got {op!r}")
    axes = tuple(program_axes) if isinstance(program_axes, (tuple, list)) else (program_axes,)
    programs = num_programs(axes)
    if programs != 1:
        raise NotImplementedError(
            f"neuronxcc.nki.language.all_reduce over {programs} programs (program_axes={program_axes}) is not "
            "implemented in the NKI simulator: it runs the launch grid's instances one after another, so a "
            "reduction across concurrent programs cannot be simulated; only a single program is")
    return _ELEMENTWISE["copy"](x, dtype=dtype, mask=mask)


gemm_grid = unimplemented("neuronxcc.nki.language.gemm_grid", "not documented beyond its name in our references")


# -- tile-level compound ops ------------------------------------------------------------------------------------
def matmul(x: NkiTensor, y: NkiTensor, *, transpose_x: bool = False, mask=None, **kwargs) -> LegacyTile:
    """``x @ y`` into a new fp32 PSUM tile (``transpose_x=True``: ``x`` is already ``[K, M]``)."""
    _checked(mask, x, y)
    if transpose_x:
        check_matmul_operands("matmul", x, y, "x", "y")
    return _masked(_cnl.matmul(x, y, transpose_x=transpose_x), mask)


def transpose(x: NkiTensor, *, dtype=None, mask=None, **kwargs) -> LegacyTile:
    """2-D transpose (≤128×128; Tensor Engine into PSUM, Vector Engine for ≤32×32)."""
    _checked(mask, x)
    return _masked(_cnl.transpose(x, dtype=dtype), mask)


def softmax(x: NkiTensor, axis, *, dtype=None, compute_dtype=None, mask=None, **kwargs) -> LegacyTile:
    """Softmax along a free axis."""
    _checked(mask, x)
    return _masked(_cnl.softmax(x, axis, dtype=dtype, compute_dtype=compute_dtype), mask, x)


def rms_norm(x: NkiTensor, w, axis, n, epsilon: float = 1e-6, *, dtype=None, compute_dtype=None, mask=None,
             **kwargs) -> LegacyTile:
    """``x * rsqrt(sum(x²)/n + epsilon) * w``."""
    _checked(mask, x, w)
    return _masked(_cnl.rms_norm(x, w, axis, n, epsilon, dtype=dtype, compute_dtype=compute_dtype), mask, x)


def where(condition: NkiTensor, x, y, *, dtype=None, mask=None, **kwargs) -> LegacyTile:
    """``x`` where ``condition`` else ``y``."""
    _checked(mask, condition, x, y)
    return _masked(_cnl.where(condition, x, y, dtype=dtype if dtype is not None else promote(x, y)), mask,
                   condition, x, y)


def dropout(x: NkiTensor, rate, *, dtype=None, mask=None, **kwargs) -> LegacyTile:
    """Zero elements with probability ``rate``."""
    _checked(mask, x)
    return _masked(_cnl.dropout(x, rate, dtype=dtype), mask, x)


def expand_dims(data: NkiTensor, axis: int) -> LegacyTile:
    """View with a new size-1 axis."""
    return wrap(_cnl.expand_dims(data, axis))


def broadcast_to(src: NkiTensor, *, shape) -> LegacyTile:
    """Broadcast a tile to ``shape`` as a new SBUF tile."""
    return wrap(_cnl.broadcast_to(src, shape))


def gather_flattened(data: NkiTensor, indices: NkiTensor, *, axis: int = 0, dtype=None, mask=None,
                     **kwargs) -> LegacyTile:
    """Per partition, gather from the flattened free dims of ``data``."""
    _checked(mask, data, indices)
    return _masked(_cnl.gather_flattened(data, indices, axis, dtype=dtype), mask)


LegacyTile._language = sys.modules[__name__]  # the operators of legacy tiles call this module's functions
