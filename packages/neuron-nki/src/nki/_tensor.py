"""Tensors and buffers: HBM / SBUF / PSUM allocations, views, indexing and access patterns.

Structure:

* :class:`Buffer` — the memory a tensor lives in (``nl.sbuf``, ``nl.psum``, ``nl.hbm``, ``nl.private_hbm``,
  ``nl.shared_hbm``).
* :class:`Allocation` — one allocated region: a NumPy array in *storage* dtype (see ``_dtypes``), its logical
  dtype, buffer, name, scheduler bookkeeping (``ready``/``read_done`` times) and, for PSUM, a per-element
  "written" mask used by ``nc_matmul(accumulate=None)``.
* :class:`NkiTensor` — what kernels hold: an allocation plus a NumPy *view* of it (basic indexing keeps views,
  so writes land in the allocation; kernel inputs wrap the caller's arrays, so HBM writes are visible to the
  caller). An optional advanced-index ``key`` supports gathers/legacy index expressions: reads are
  ``base[key]`` and writes ``base[key] = v``.

The first dimension of an SBUF/PSUM tensor is the partition dimension.
"""

from __future__ import annotations

import functools
import math
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from . import _alloc_checks, _context
from ._dtypes import as_dtype, bfloat16, cast_for_store, nki_name, storage_dtype, uninit_value
from ._errors import NkiValidationError, fmt_shape, kernel_location, kernel_site
from ._liveness import tick, touch

if TYPE_CHECKING:  # pragma: no cover
    from ._liveness import LiveRange

__all__ = [
    "Allocation", "Buffer", "DynSlice", "NkiTensor", "allocate", "hbm", "private_hbm", "psum", "sbuf", "shared_hbm",
    "wrap_array",
]


class Buffer:
    """A memory kind; ``on_chip`` buffers (SBUF, PSUM) have a partition dimension."""

    __slots__ = ("name", "on_chip")

    def __init__(self, name: str, on_chip: bool):
        self.name = name
        self.on_chip = on_chip

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    @property
    def is_hbm(self) -> bool:
        return not self.on_chip


sbuf = Buffer("sbuf", True)
psum = Buffer("psum", True)
hbm = Buffer("hbm", False)
private_hbm = Buffer("private_hbm", False)
shared_hbm = Buffer("shared_hbm", False)
BUFFERS = {b.name: b for b in (sbuf, psum, hbm, private_hbm, shared_hbm)}


class Allocation:
    """Backing store of a tensor; see module docstring."""

    __slots__ = ("__weakref__", "buffer", "data", "dtype", "name", "pending_fill", "precise", "read_done", "ready",
                 "span", "written")

    def __init__(self, data: np.ndarray, dtype: np.dtype, buffer: Buffer, name: str, precise: bool,
                 span: LiveRange | None = None):
        self.data = data
        self.span = span  # on-chip live range (``_liveness``), shared by bitcast views
        # A fresh on-chip tensor reads as its "uninitialised" value (NaN / 4) but is filled only when first
        # accessed other than by a write of all of it (most are: the instruction that allocated them writes them).
        self.pending_fill = None
        self.dtype = dtype
        self.buffer = buffer
        self.name = name
        self.precise = precise
        self.ready = 0.0
        self.read_done = 0.0
        self.written = np.zeros(data.shape, dtype=bool) if buffer is psum else None

    def materialize(self) -> None:
        """Fill a fresh tensor with its uninitialised value before a read or a partial write."""
        if self.pending_fill is not None:
            self.data.fill(self.pending_fill)
            self.pending_fill = None


class DynSlice:
    """``nl.ds(start, size)``: ``size`` elements from ``start`` (``step`` optional)."""

    __slots__ = ("size", "start", "step")

    def __init__(self, start, size, step: int = 1):
        self.start = start
        self.size = size
        self.step = step

    def __repr__(self) -> str:
        return f"nl.ds({self.start}, {self.size})"


def _as_int(v) -> int:
    if isinstance(v, (int, np.integer)):
        return int(v)
    if hasattr(v, "__index__"):
        return v.__index__()
    raise TypeError(f"expected an integer index, got {type(v).__name__}")


def _oob(name: str, dim: int, lo: int, hi: int, size: int):
    raise NkiValidationError(
        f"Out-of-bound access for tensor `{name}` on dimension {dim}: index range [{lo}, {hi}] exceed dimension "
        f"size of {size}", code="err_tensor_access_out_of_bound", location=kernel_location(3))


def normalize_index(idx, shape: tuple[int, ...], name: str):
    """Turn a kernel index into a NumPy index, checking bounds (NumPy would silently clip slices).

    Returns ``(index_tuple, advanced)``; ``advanced`` is True when an integer-array index is present.
    Elements: int, slice, :class:`DynSlice`, ``...``, ``None``, integer arrays, or objects with
    ``__nki_index__()`` returning an integer array (hook for the legacy API's index expressions).
    """
    if not isinstance(idx, tuple):
        idx = (idx,)
    n_real = sum(1 for k in idx if k is not Ellipsis and k is not None)
    if any(k is Ellipsis for k in idx):
        pos = next(i for i, k in enumerate(idx) if k is Ellipsis)
        idx = idx[:pos] + (slice(None),) * (len(shape) - n_real) + idx[pos + 1:]
    elif n_real < len(shape):
        idx = idx + (slice(None),) * (len(shape) - n_real)
    if sum(1 for k in idx if k is not None) > len(shape):
        raise NkiValidationError(f"too many indices for tensor `{name}` of shape {fmt_shape(shape)}",
                                 code="err_tensor_access_out_of_bound", location=kernel_location(2))
    out = []
    advanced = False
    dim = 0
    for k in idx:
        if k is None:
            out.append(None)
            continue
        n = shape[dim]
        if isinstance(k, slice):
            step = 1 if k.step is None else _as_int(k.step)
            if step > 0:
                start = 0 if k.start is None else _as_int(k.start)
                stop = n if k.stop is None else _as_int(k.stop)
                if start < 0:
                    start += n
                if stop < 0:
                    stop += n
                if stop > start and (start < 0 or stop > n):
                    _oob(name, dim, start, stop - 1, n)
                out.append(slice(start, max(stop, start), step))
            else:
                out.append(k)
        elif isinstance(k, DynSlice):
            start, size, step = _as_int(k.start), _as_int(k.size), _as_int(k.step)
            last = start + (size - 1) * step
            if size > 0 and (start < 0 or last >= n or last < 0):
                _oob(name, dim, start, last, n)
            out.append(slice(start, start + size * step, step) if size > 0 else slice(start, start))
        elif isinstance(k, (int, np.integer)) or (hasattr(k, "__index__") and not isinstance(k, np.ndarray)):
            i = _as_int(k)
            if i < 0:
                i += n
            if not 0 <= i < n:
                _oob(name, dim, i, i, n)
            out.append(i)
        else:
            arr = k.__nki_index__() if hasattr(k, "__nki_index__") else np.asarray(k)
            if arr.dtype == bool:
                raise NkiValidationError("boolean mask indexing is not supported; use nisa.select_reduce / where",
                                         location=kernel_location(2))
            arr = arr.astype(np.int64, copy=False)
            if arr.size:
                lo, hi = int(arr.min()), int(arr.max())
                if lo < 0 or hi >= n:
                    _oob(name, dim, lo, hi, n)
            out.append(arr)
            advanced = True
        dim += 1
    return tuple(out), advanced


def _binary_operators(op: str) -> tuple:
    """The ``__op__`` and ``__rop__`` methods of a binary operator: the language function ``op`` with the tensor
    as its left or right operand (built in pairs as NumPy's ``NDArrayOperatorsMixin`` builds its methods)."""
    def forward(self, other):
        return self._bin(other, op)

    def reflected(self, other):
        return self._bin(other, op, True)

    return forward, reflected


class NkiTensor:
    """A tensor (or tile) in HBM, SBUF or PSUM; see module docstring."""

    __slots__ = ("_shape", "alloc", "base", "key", "name")
    __array_priority__ = 1000  # so ``ndarray op tensor`` defers to us

    def __init__(self, alloc: Allocation, base: np.ndarray, key=None, name: str | None = None):
        self.alloc = alloc
        self.base = base
        self.key = key
        self.name = name or alloc.name
        self._shape = base.shape if key is None else base[key].shape

    # -- metadata -------------------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        return self.alloc.dtype

    @property
    def buffer(self) -> Buffer:
        return self.alloc.buffer

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        return math.prod(self._shape)

    @property
    def itemsize(self) -> int:
        return self.alloc.dtype.itemsize

    @property
    def partitions(self) -> int:
        return self._shape[0] if self._shape else 1

    @property
    def free_size(self) -> int:
        """Elements per partition."""
        return math.prod(self._shape[1:]) if self._shape else 1

    def __len__(self) -> int:
        return self._shape[0]

    def __repr__(self) -> str:
        return f"NkiTensor({self.name}: {fmt_shape(self._shape)} {nki_name(self.dtype)} in {self.buffer!r})"

    def __bool__(self):
        raise TypeError("the truth value of an NKI tensor is undefined inside a kernel; use a register or numpy")

    # -- data access (simulator internal) -------------------------------------------------------------------
    def read(self) -> np.ndarray:
        """Stored values (storage dtype; a view when possible)."""
        a = self.alloc
        if a.span is not None:  # ``_liveness.touch``, inlined: the hottest path
            a.span.last = tick()
        if a.pending_fill is not None:
            a.materialize()
        return self.base if self.key is None else self.base[self.key]

    def read_f32(self) -> np.ndarray:
        """Values as float32, the engines' compute precision."""
        v = self.read()
        if v.dtype == bfloat16:  # exact widening: bf16 is float32's upper half (twice as fast as ml_dtypes' cast)
            return np.left_shift(v.view(np.uint16), 16, dtype=np.uint32).view(np.float32)
        return np.asarray(v, dtype=np.float32)

    def write(self, values) -> None:
        """Store ``values`` (any dtype, broadcastable to ``shape``), rounding to the tensor's dtype."""
        a = self.alloc
        if a.span is not None:  # ``_liveness.touch``, inlined
            a.span.last = tick()
        if a.pending_fill is not None:
            if self.key is None and self.base is a.data:
                a.pending_fill = None  # this write covers the whole tensor: the fill would be overwritten
            else:
                a.materialize()
        v = cast_for_store(values, a.dtype, a.data.dtype, a.precise)
        if self.key is None:
            self.base[...] = v
        else:
            self.base[self.key] = v
        if a.written is not None:
            self.written_view(set_true=True)

    def write_masked(self, values, mask) -> None:
        """Store ``values`` only where ``mask`` (bool, broadcastable to ``shape``) is true — legacy ``mask=``."""
        m = np.broadcast_to(np.asarray(mask, dtype=bool), self._shape)
        a = self.alloc
        touch(a)
        a.materialize()
        new = cast_for_store(np.broadcast_to(np.asarray(values), self._shape), a.dtype, a.data.dtype, a.precise)
        if self.key is None:
            np.copyto(self.base, new, where=m)
            if a.written is not None:
                np.copyto(self.written_view(), True, where=m)
            return
        if not all(isinstance(k, (np.ndarray, int, np.integer)) for k in self.key):
            raise NkiValidationError("masked writes through a mix of slices and index arrays are not supported; "
                                     "use index arrays for every dimension", location=kernel_location(2))
        # only the selected elements are written, so clamped (masked-out) duplicate indices never clobber data
        sel = tuple(np.broadcast_to(np.asarray(k), self._shape)[m] for k in self.key)
        self.base[sel] = np.broadcast_to(new, self._shape)[m]
        if a.written is not None:
            self._map_base(a.written)[sel] = True

    def written_view(self, set_true: bool = False):
        """PSUM "has been written" mask for this view (``nc_matmul(accumulate=None)``)."""
        a = self.alloc
        w = a.written
        if w is None:
            return None
        if self.base is a.data:  # the whole allocation (the common case): no view to map
            if set_true:
                w[...] = True
            return w
        # Map our view back onto the allocation: views of a.data share its memory layout.
        if self.key is None:
            off = (self.base.__array_interface__["data"][0] - a.data.__array_interface__["data"][0])
            item = a.data.itemsize
            strides = tuple(s // item * w.itemsize for s in self.base.strides)
            wv = np.lib.stride_tricks.as_strided(w.reshape(-1)[off // item:], shape=self.base.shape, strides=strides)
            if set_true:
                wv[...] = True
            return wv
        if set_true:
            w_base = self._map_base(w)
            w_base[self.key] = True
            return None
        return self._map_base(w)[self.key]

    def _map_base(self, other: np.ndarray) -> np.ndarray:
        a = self.alloc
        off = (self.base.__array_interface__["data"][0] - a.data.__array_interface__["data"][0]) // a.data.itemsize
        strides = tuple(s // a.data.itemsize * other.itemsize for s in self.base.strides)
        return np.lib.stride_tricks.as_strided(other.reshape(-1)[off:], shape=self.base.shape, strides=strides)

    # -- indexing -------------------------------------------------------------------------------------------
    def __getitem__(self, idx) -> NkiTensor:
        if self.key is not None:
            raise NkiValidationError("indexing a gathered (advanced-indexed) tensor again is not supported",
                                     location=kernel_location(2))
        np_idx, advanced = normalize_index(idx, self._shape, self.name)
        if advanced:
            return NkiTensor(self.alloc, self.base, np_idx, self.name)
        return NkiTensor(self.alloc, self.base[np_idx], None, self.name)

    def __setitem__(self, idx, value) -> None:
        """``t[...] = value``: a copy on the Vector Engine (value: tile or scalar)."""
        dst = self[idx]
        if isinstance(value, NkiTensor):
            if value.shape != dst.shape and value.size == dst.size:
                value = value.reshape(dst.shape)
            self._isa._copy_like(dst, value, "tensor_copy")
        else:
            self._isa.memset(dst, value)

    def __iter__(self):
        raise TypeError("NKI tensors are not iterable; index them with slices / nl.ds")

    # -- views ----------------------------------------------------------------------------------------------
    def _plain(self, what: str) -> np.ndarray:
        if self.key is not None:
            raise NkiValidationError(f"{what} of a gathered (advanced-indexed) tensor is not supported",
                                     location=kernel_location(3))
        return self.base

    def reshape(self, *dims, shape=None) -> NkiTensor:
        """Same elements, new shape (must be expressible as a view of the same memory); ``t.reshape(shape)``,
        ``t.reshape(*shape)`` or ``t.reshape(shape=...)``."""
        shape = dims if shape is None else (tuple(shape),)
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        base = self._plain("reshape")
        shape = tuple(int(s) for s in shape)
        if math.prod(shape) != base.size:
            raise NkiValidationError(f"cannot reshape tensor `{self.name}` of shape {fmt_shape(base.shape)} "
                                     f"into {fmt_shape(shape)}", location=kernel_location(2))
        try:
            view = base.reshape(shape, copy=False)
        except (ValueError, TypeError) as e:
            raise NkiValidationError(f"reshape of non-contiguous view of `{self.name}` is not supported: {e}",
                                     location=kernel_location(2)) from None
        return NkiTensor(self.alloc, view, None, self.name)

    def permute(self, *dims) -> NkiTensor:
        """Reorder dimensions (a strided view)."""
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        return NkiTensor(self.alloc, self._plain("permute").transpose(dims), None, self.name)

    def broadcast_to(self, shape) -> NkiTensor:
        """Read-only broadcast view (size-1 dims repeated)."""
        return NkiTensor(self.alloc, np.broadcast_to(self._plain("broadcast_to"), tuple(shape)), None, self.name)

    broadcast = broadcast_to

    def expand_dims(self, axis: int) -> NkiTensor:
        return NkiTensor(self.alloc, np.expand_dims(self._plain("expand_dims"), axis), None, self.name)

    def view(self, dtype) -> NkiTensor:
        """Reinterpret the bytes as another dtype (bitcast) — needs exact-dtype storage."""
        dtype = as_dtype(dtype)
        base = self._plain("view")
        if base.dtype != self.alloc.dtype:
            raise NkiValidationError("bitcast view needs NKI_PRECISE_FP=1 storage", location=kernel_location(2))
        self.alloc.materialize()  # the bitcast view is another Allocation over the same data
        alloc = Allocation.__new__(Allocation)
        alloc.data, alloc.dtype, alloc.buffer, alloc.name = self.alloc.data, dtype, self.alloc.buffer, self.name
        alloc.pending_fill = None
        alloc.precise, alloc.ready, alloc.read_done, alloc.written = True, 0.0, 0.0, None
        alloc.span = self.alloc.span
        return NkiTensor(alloc, base.view(storage_dtype(dtype, True)), None, self.name)

    def rearrange(self, pattern: str, **sizes) -> NkiTensor:
        """einops-style view, e.g. ``t.rearrange("p (a b) -> p b a", a=4)`` (split, merge, permute)."""
        lhs, rhs = (side.strip() for side in pattern.split("->"))

        def groups(side):
            out, cur, depth = [], None, 0
            for tok in side.replace("(", " ( ").replace(")", " ) ").split():
                if tok == "(":
                    cur, depth = [], 1
                elif tok == ")":
                    out.append(cur)
                    cur, depth = None, 0
                elif depth:
                    cur.append(tok)
                else:
                    out.append([tok])
            return out

        lg, rg = groups(lhs), groups(rhs)
        if len(lg) != self.ndim:
            raise NkiValidationError(f"rearrange pattern '{lhs}' has {len(lg)} dims, tensor has {self.ndim}",
                                     location=kernel_location(2))
        dims: dict[str, int] = dict(sizes)
        for g, n in zip(lg, self.shape):
            unknown = [a for a in g if a not in dims]
            known = math.prod(dims[a] for a in g if a in dims)
            if len(unknown) > 1:
                raise NkiValidationError(f"rearrange cannot infer sizes of {unknown}", location=kernel_location(2))
            if unknown:
                dims[unknown[0]] = n // known
        split = self.reshape(tuple(dims[a] for g in lg for a in g))
        order = [a for g in lg for a in g]
        perm = split.permute(tuple(order.index(a) for g in rg for a in g))
        return perm.reshape(tuple(math.prod(dims[a] for a in g) for g in rg)) if any(len(g) > 1 for g in rg) \
            else perm

    def indirect(self, *args, **kwargs):
        """Not simulated: AWS's tensor-indirection deep dive names it, but its signature and the layout of the
        uint16 index tensor per 16-partition group are not in the pages we could read, so no meaning is guessed;
        ``.ap(..., vector_offset=...)`` covers gather/scatter."""
        raise NotImplementedError("NkiTensor.indirect (NeuronCore-v4 tensor indirection) is not implemented in the "
                                  "NKI simulator: its signature and index-tensor layout are not documented in the "
                                  "references it follows; use .ap(pattern, vector_offset=..., indirect_dim=...)")

    indirect._nki_unimplemented = True

    def slice(self, dim: int, start: int, end: int, step: int = 1) -> NkiTensor:
        idx = [slice(None)] * self.ndim
        idx[dim] = slice(start, end, step)
        return self[tuple(idx)]

    def select(self, dim: int, index: int) -> NkiTensor:
        idx = [slice(None)] * self.ndim
        idx[dim] = index
        return self[tuple(idx)]

    def ap(self, pattern, offset: int = 0, scalar_offset=None, vector_offset=None, indirect_dim: int = 0,
           dtype=None) -> NkiTensor:
        """Access pattern over this tensor's row-major elements: ``pattern = [[stride, count], ...]``.

        ``vector_offset`` (an SBUF tensor of one index per partition) adds ``index * stride`` on
        ``indirect_dim`` (gather/scatter); ``scalar_offset`` (int, register or [1,1] tensor) adds one index.
        """
        base = self._plain("ap")
        if not base.flags.c_contiguous:
            raise NkiValidationError("access patterns need a contiguous tensor", location=kernel_location(2))
        flat = base.reshape(-1)
        strides = [int(s) for s, _ in pattern]
        counts = [int(c) for _, c in pattern]
        offset = int(offset)
        if scalar_offset is not None:
            so = scalar_offset
            if isinstance(so, NkiTensor):
                so = int(np.asarray(so.read()).reshape(-1)[0])
            offset += int(so) * strides[indirect_dim]
        grids = np.zeros(counts, dtype=np.int64) + offset
        for d, (s, c) in enumerate(zip(strides, counts)):
            shp = [1] * len(counts)
            shp[d] = c
            grids = grids + (np.arange(c, dtype=np.int64) * s).reshape(shp)
        if vector_offset is not None:
            vo = np.asarray(vector_offset.read()).reshape(-1).astype(np.int64)
            shp = [1] * len(counts)
            shp[0] = counts[0]
            if vo.size != counts[0]:
                raise NkiValidationError(f"vector_offset has {vo.size} entries, pattern has {counts[0]} partitions",
                                         location=kernel_location(2))
            # one dynamic index per partition selects the row on indirect_dim
            grids = grids + (vo.reshape(shp) * strides[indirect_dim]
                             - (np.arange(counts[0]) * strides[0]).reshape(shp) * (indirect_dim == 0))
        if grids.size:
            lo, hi = int(grids.min()), int(grids.max())
            if lo < 0 or hi >= flat.size:
                _oob(self.name, 0, lo, hi, flat.size)
        if vector_offset is None and scalar_offset is None:
            view = np.lib.stride_tricks.as_strided(flat[offset:] if flat.size else flat, shape=tuple(counts),
                                                   strides=tuple(s * flat.itemsize for s in strides))
            return NkiTensor(self.alloc, view, None, self.name)
        return NkiTensor(self.alloc, flat, (grids,), self.name)

    # -- arithmetic sugar (legacy-style tile expressions) -----------------------------------------------------
    # The API module whose functions the operators call, and the instruction module of ``t[...] = v``: ``nki.language``
    # and ``nki.isa`` install themselves here when imported (they import this module, the package imports both); the
    # legacy tile installs its own language (``neuronxcc.nki.language``).
    _language: ModuleType
    _isa: ModuleType

    def _bin(self, other, op, reverse=False):
        f = getattr(self._language, op)
        return f(other, self) if reverse else f(self, other)

    __add__, __radd__ = _binary_operators("add")
    __sub__, __rsub__ = _binary_operators("subtract")
    __mul__, __rmul__ = _binary_operators("multiply")
    __truediv__, __rtruediv__ = _binary_operators("divide")

    def __neg__(self):
        return self._language.negative(self)

    def __iadd__(self, o):
        """``psum_tile += nl.matmul(...)`` / ``t += x``: accumulate in place (no temporary tile)."""
        NkiTensor._language._binary_tile("add", self, o, self.dtype, out=self)
        return self


@functools.cache
def _storage(dtype: np.dtype, precise: bool) -> tuple[np.dtype, object]:
    """(storage dtype, fill value of a fresh tensor) per logical dtype: every instruction allocates."""
    return storage_dtype(dtype, precise), uninit_value(dtype)


def allocate(shape, dtype, buffer: Buffer, name: str = "", fill=None, api: str = "ndarray") -> NkiTensor:
    """Allocate a tensor in the running launch; checks partition size and one tensor's size against the
    target's SBUF/PSUM partition (all live tensors together are checked by live range, ``_liveness``)."""
    ctx = _context.require(api)
    dtype = as_dtype(dtype)
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    _alloc_checks.check_shape(tuple(shape), api)
    shape = tuple(int(s) for s in shape)
    if isinstance(buffer, str):
        raise NkiValidationError(f"buffer must be an nl buffer object (e.g. nl.{buffer}), strings are not accepted",
                                 code="err_unsupported_memory", location=kernel_location(2))
    if buffer is None:
        buffer = sbuf
    if buffer is shared_hbm and ctx.shared_outputs is not None:
        k = ctx.shared_counter
        ctx.shared_counter += 1
        if k < len(ctx.shared_outputs):
            t = ctx.shared_outputs[k]
            if t.shape == shape and t.dtype == dtype:
                return t
    sdt, uninit = _storage(dtype, ctx.precise)
    span = None
    if buffer.on_chip:
        _alloc_checks.check_alloc_onchip(ctx, shape, dtype, buffer, name)
        pbytes = (math.prod(shape[1:]) if shape else 1) * dtype.itemsize
        span = ctx.core.ledger.open(buffer.name, pbytes, (shape, dtype, name), kernel_site(2))
    data = np.empty(shape, dtype=sdt)
    if fill is not None:
        data[...] = cast_for_store(np.asarray(fill), dtype, sdt, ctx.precise)
    elif not buffer.on_chip:
        data.fill(uninit)  # HBM outputs: the caller sees what the kernel did not write
    alloc = Allocation(data, dtype, buffer, name or "tensor", ctx.precise, span)
    if fill is None and buffer.on_chip:
        alloc.pending_fill = uninit
    if fill is not None and alloc.written is not None:
        alloc.written[...] = True
    t = NkiTensor(alloc, data, None, alloc.name)
    if buffer is shared_hbm:
        ctx.shared_outputs.append(t)
    return t


def wrap_array(arr: np.ndarray, name: str, precise: bool, buffer: Buffer = hbm) -> NkiTensor:
    """A kernel argument: the caller's array itself (no copy), so kernel writes are visible to the caller."""
    alloc = Allocation(arr, arr.dtype, buffer, name, precise)
    return NkiTensor(alloc, arr, None, name)
