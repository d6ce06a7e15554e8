"""Legacy tiles: the core's ``NkiTensor`` plus NKI 0.1 indexing (``nl.arange`` expressions) and masked access.

Why a subclass and not a second tensor type: every instruction of the shared core accepts these tiles unchanged,
so the legacy API only adds what NKI 0.1 kernels need on top:

* ``t[i_p, i_f]`` with index expressions: the tile shape is the NumPy broadcast of the placed expressions (tiles
  used as indices give indirect DMA). Affine single-variable expressions in dimension order become plain strided
  views (fast, writable, reshapable); anything else becomes a gather (the core's advanced-index ``key``).
* Ints on an on-chip tile's partition/free dimensions keep the dimension (``buf[:, i]`` is ``[P, 1]``); on block
  dimensions and HBM tensors they drop it, as in NumPy.
* Ragged tiles: an access that runs past the tensor (``a[i * 128 + i_p, i_f]`` on the last tile) does not fail at
  indexing time. It remembers which elements are out of bounds (``oob``); using it without a ``mask=`` that
  excludes them raises ``err_tensor_access_out_of_bound`` with the documented message.
* Arithmetic sugar (``a + b``, ``psum += nl.matmul(...)``) routed to the legacy ``nl`` functions.
* ``dst[...] = op(...)``: a fresh instruction result of the same buffer writes ``dst`` directly (no extra copy
  cost), and a masked result only updates the masked elements.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from nki import extension as _ext
from nki import isa as core_isa
from nki.extension import (
    MIN_II,
    DynSlice,
    NkiTensor,
    NkiValidationError,
    fmt_shape,
    kernel_location,
    psum,
    uninit_value,
)

from ._index import IndexExpr, Var, as_mask

__all__ = [
    "LegacyTile",
    "align",
    "append_ones",
    "check_access",
    "check_matmul_operands",
    "check_operands",
    "instruction_result",
    "legacy_index",
    "mask_array",
    "masked_write",
    "reshape_any",
    "unwritten_outside",
    "wrap",
]


class LegacyTile(NkiTensor):
    """A legacy tile or tensor view.

    ``oob``: ``(bool array, message)`` for a partly out-of-bounds access; ``valid``: the elements a masked
    instruction wrote (None: all), so ``dst[...] = op(..., mask=m)`` only updates ``dst`` where ``m`` holds;
    ``fresh``: an instruction's new result (assigning it elsewhere needs no copy); ``ivars``: the index variable
    of each dimension of an ``nl.arange`` access; ``nblock``: leading (deprecated) block dimensions.
    """

    __slots__ = ("fresh", "ivars", "nblock", "oob", "valid")

    def __init__(self, alloc, base, key=None, name=None, oob=None):
        super().__init__(alloc, base, key, name)
        self.oob = oob
        self.valid = None
        self.fresh = False
        self.ivars = None
        self.nblock = 0

    def __bool__(self):
        """Truthy, as a traced tile object is to NKI 0.1's compiler (``if tile:`` always takes its branch, on
        hardware too); warns because the branch does not depend on the tile's values."""
        warnings.warn(f"'if' / 'bool()' on tile `{self.name}` is always true when NKI 0.1 traces the kernel; the "
                      "branch does not depend on the tile's values (compare in a kernel argument, or use "
                      "nl.where / a mask)", SyntaxWarning, stacklevel=2)
        return True

    # -- indexing --------------------------------------------------------------------------------------------
    def __getitem__(self, idx) -> LegacyTile:
        return legacy_index(self, idx)

    def __setitem__(self, idx, value) -> None:
        """``t[...] = value``: a copy (tile) or memset (scalar) into the addressed elements."""
        dst = self[idx]
        check_access(dst, None, kernel_location(2))
        if isinstance(value, NkiTensor):
            if _same_view(dst, value):  # ``t[idx] += x`` already updated these elements in place
                return
            check_access(value, None, kernel_location(2))
            valid = getattr(value, "valid", None)
            retarget = getattr(value, "fresh", False) and value.buffer is dst.buffer
            same_layout = value.size == dst.size and value.partitions == dst.partitions  # else the core reports it
            if (valid is not None or retarget) and same_layout:
                # masked result: only the written elements land in dst; a fresh result of the same buffer is the
                # instruction writing dst directly (no copy instruction, dst ready when the instruction is)
                masked_write(dst, np.reshape(value.read(), dst.shape),
                             None if valid is None else np.reshape(valid, dst.shape))
                if retarget:
                    dst.alloc.ready = max(dst.alloc.ready, value.alloc.ready)
                else:
                    _ext.charge(_ext.require_context("tensor_copy"), "vector", max(MIN_II, dst.free_size),
                                     (value,), (dst,), "tensor_copy")
                return
            if value.shape != dst.shape and same_layout and value.key is None:
                value = value.reshape(dst.shape)
            core_isa.tensor_copy(dst, value)
        else:
            core_isa.memset(dst, value)

    # -- views ----------------------------------------------------------------------------------------------
    def reshape(self, *dims, shape=None) -> LegacyTile:
        return wrap(super().reshape(*dims, shape=shape))

    def permute(self, *dims) -> LegacyTile:
        return wrap(super().permute(*dims))

    def broadcast_to(self, shape) -> LegacyTile:
        """Broadcast view; partition-aligned like legacy NKI (a ``[P]`` tile broadcasts to ``[P, F]``)."""
        shape = tuple(int(s) for s in shape)
        t = append_ones(self, len(shape) - self.ndim) if self.ndim < len(shape) else self
        try:
            np.broadcast_shapes(t.shape, shape)
        except ValueError:
            # same elements per partition in another free layout ([1, N, 1] → [128, N]): reshape first
            if shape and self.free_size == math.prod(shape[1:]) and self.shape[0] in (1, shape[0]):
                t = reshape_any(self, (self.shape[0], *shape[1:]))
        if t.key is not None:  # a gather broadcasts its index arrays
            return LegacyTile(t.alloc, t.base, tuple(np.broadcast_to(k, shape) for k in t.key), t.name)
        return wrap(NkiTensor.broadcast_to(t, shape))

    def expand_dims(self, axis: int) -> LegacyTile:
        return wrap(super().expand_dims(axis))

    def view(self, dtype) -> LegacyTile:
        return wrap(super().view(dtype))

    # -- arithmetic sugar: NkiTensor's operators, calling the legacy functions (mask-aware, legacy promotion) ---
    # (`neuronxcc.nki.language` installs itself as `_language` when imported)

    __pow__, __rpow__ = _ext.binary_operators("power")

    def __iadd__(self, o):
        """``acc += x``. Into PSUM from PSUM (``psum += nl.matmul(...)``) this is Tensor Engine accumulation: no
        extra instruction, and elements never written before are overwritten (a fresh ``nl.ndarray`` works)."""

        if self.buffer is psum and isinstance(o, NkiTensor) and o.buffer is psum:
            check_access(o, None, kernel_location(2))
            v = o.read_f32()
            v = v.reshape(self.shape) if v.shape != self.shape else v
            written = self.written_view() if self.key is None else self._map_base(self.alloc.written)[self.key]
            self.write(np.where(written, self.read_f32() + v, v))
            if o.alloc.ready > self.alloc.ready:  # readers of the accumulator wait for the matmul
                self.alloc.ready = o.alloc.ready
            return self
        return self._update("add", o)

    def __isub__(self, o):
        return self._update("subtract", o)

    def __imul__(self, o):
        return self._update("multiply", o)

    def _update(self, op: str, o):
        """``self op= o`` computed into this tile, as the compiler does: no temporary tile."""
        check_operands(None, self, o)
        a, b = align(self, o)
        _ext.binary_tile(op, a, b, self.dtype, out=self)
        return self


def check_operands(mask, *xs) -> None:
    """Operands that are partly out-of-bounds accesses are only legal when ``mask`` excludes those elements."""
    for x in xs:
        if isinstance(x, NkiTensor):
            check_access(x, mask, kernel_location(3))


def align(x, y):
    """Partition-aligned broadcasting: tiles of different rank but equal partitions and elements are the same
    layout (``t[:, j, :]`` is [P, 1, F]); otherwise the lower-rank tile gets trailing size-1 free dims."""
    if isinstance(x, NkiTensor) and isinstance(y, NkiTensor) and x.ndim != y.ndim:
        if x.size == y.size and x.shape[:1] == y.shape[:1]:
            return (reshape_any(x, y.shape), y) if x.ndim < y.ndim else (x, reshape_any(y, x.shape))
        if x.ndim < y.ndim:
            x = append_ones(x, y.ndim - x.ndim)
        else:
            y = append_ones(y, x.ndim - y.ndim)
    return x, y


def _same_view(a: NkiTensor, b: NkiTensor) -> bool:
    if a.alloc is not b.alloc or (a.key is None) != (b.key is None):
        return False
    if a.key is not None:
        return len(a.key) == len(b.key) and all(x is y or np.array_equal(x, y) for x, y in zip(a.key, b.key))
    ia, ib = a.base.__array_interface__, b.base.__array_interface__
    return ia["data"] == ib["data"] and a.base.shape == b.base.shape and a.base.strides == b.base.strides


def append_ones(t: NkiTensor, n: int) -> NkiTensor:
    """``t`` with ``n`` trailing size-1 dims (partition-aligned broadcasting), for views and gathers alike."""
    if n <= 0:
        return t
    if t.key is not None:
        oob = getattr(t, "oob", None)
        oob = None if oob is None else (oob[0].reshape(oob[0].shape + (1,) * n), oob[1])
        return LegacyTile(t.alloc, t.base, tuple(np.reshape(k, k.shape + (1,) * n) for k in t.key), t.name, oob)
    return NkiTensor.reshape(t, t.shape + (1,) * n)


def reshape_any(t: NkiTensor, shape: tuple[int, ...]) -> NkiTensor:
    """Same elements in ``shape``, for plain views and gathers alike (gathers reshape their index arrays)."""
    if t.key is not None:
        oob = getattr(t, "oob", None)
        oob = None if oob is None else (oob[0].reshape(shape), oob[1])
        return LegacyTile(t.alloc, t.base, tuple(np.reshape(np.broadcast_to(k, t.shape), shape) for k in t.key),
                          t.name, oob)
    return NkiTensor.reshape(t, shape)


def wrap(x):
    """Core tensors (possibly nested in tuples/lists) as :class:`LegacyTile`."""
    if isinstance(x, LegacyTile) or not isinstance(x, (NkiTensor, tuple, list)):
        return x
    if isinstance(x, NkiTensor):
        return LegacyTile(x.alloc, x.base, x.key, x.name)
    return type(x)(wrap(v) for v in x)


# -- legacy indexing -----------------------------------------------------------------------------------------
def _fail(msg: str, code: str, loc=None):
    raise NkiValidationError(msg, code=code, location=loc or kernel_location(3))


def _expand(idx: tuple, ndim: int, name: str) -> tuple:
    real = [k for k in idx if k is not Ellipsis]
    if any(k is None for k in real):
        _fail("None (new axis) cannot be mixed with nl.arange index expressions", "err_unsupported_index")
    if len(real) > ndim:
        _fail(f"too many indices for tensor `{name}` with {ndim} dimensions", "err_tensor_access_out_of_bound")
    fill = (slice(None),) * (ndim - len(real))
    if any(k is Ellipsis for k in idx):
        pos = next(i for i, k in enumerate(idx) if k is Ellipsis)
        return tuple(idx[:pos]) + fill + tuple(k for k in idx[pos + 1:])
    return tuple(idx) + fill


def _range_of(k, n: int) -> tuple[int, int, int]:
    """(start, count, step) of a slice or ``nl.ds`` on a dimension of size ``n``; a slice with explicit
    non-negative bounds past the end keeps its full length (the access is then partly out of bounds)."""
    if isinstance(k, DynSlice):
        return int(k.start), int(k.size), int(k.step)
    if _past_end(k, n):
        return int(k.start or 0), int(k.stop) - int(k.start or 0), 1
    start, stop, step = k.indices(n)
    return start, max(0, (stop - start + (step - (1 if step > 0 else -1))) // step), step


def _past_end(k, n: int) -> bool:
    """A unit-step slice ``a:b`` with ``0 <= a < b`` and ``b > n``."""
    return (isinstance(k, slice) and k.step in (None, 1) and isinstance(k.stop, (int, np.integer))
            and isinstance(k.start, (int, np.integer, type(None))) and 0 <= int(k.start or 0) < int(k.stop)
            and int(k.stop) > n)


def _partly_outside(t: NkiTensor, idx: tuple) -> bool:
    """Whether a slice / ``nl.ds`` reaches past its dimension: such an access is legal where a ``mask=`` excludes
    the outside elements, so it takes the index-expression path, whose bounds check is deferred to the mask."""
    if any(k is None for k in idx) or sum(1 for k in idx if k is not Ellipsis) > t.ndim:
        return False
    for k, n in zip(_expand(idx, t.ndim, t.name), t.shape):
        if _past_end(k, n) or (isinstance(k, DynSlice) and int(k.size) > 0
                               and not 0 <= int(k.start) + (int(k.size) - 1) * int(k.step) < n):
            return True
    return False


def _as_int(k) -> int | None:
    return int(k) if isinstance(k, (int, np.integer)) and not isinstance(k, bool) else None


def _basic_index(t: NkiTensor, idx: tuple) -> LegacyTile:
    """Ints/slices/``nl.ds``. On-chip tiles keep partition and free dimensions indexed by an int (as size 1: a
    tile is always [P, F...], so ``l_buf[:, i]`` is a [P, 1] tile); ints on block dimensions and on HBM tensors
    drop the dimension, as in NumPy."""
    nblock = getattr(t, "nblock", 0)
    if t.buffer.on_chip and t.key is None and not any(k is None for k in idx):
        idx = _expand(idx, t.ndim, t.name)
        keep = []
        for d, k in enumerate(idx):
            i = _as_int(k)
            if i is not None and d >= nblock:
                i += t.shape[d] if i < 0 else 0
                k = slice(i, i + 1) if 0 <= i < t.shape[d] else k  # out of range: the core reports it
            keep.append(k)
        out = wrap(NkiTensor.__getitem__(t, tuple(keep)))
        out.nblock = sum(1 for k in idx[:nblock] if _as_int(k) is None)
        return out
    if len(idx) == t.ndim and idx and all(_as_int(k) is not None for k in idx):
        # one HBM element: keep a 0-d *view* (plain NumPy integer indexing would return a copy)
        last = int(idx[-1]) + (t.shape[-1] if int(idx[-1]) < 0 else 0)
        one = NkiTensor.__getitem__(t, (*idx[:-1], slice(last, last + 1)))
        return wrap(NkiTensor.reshape(one, ()))
    return wrap(NkiTensor.__getitem__(t, idx))


def legacy_index(t: NkiTensor, idx) -> LegacyTile:
    """Index ``t`` the NKI 0.1 way; see module docstring."""
    if not isinstance(idx, tuple):
        idx = (idx,)
    if not any(isinstance(k, (IndexExpr, NkiTensor)) for k in idx) and not _partly_outside(t, idx):
        return _basic_index(t, idx)
    if t.key is not None:
        _fail("indexing a gathered (index-expression) view again is not supported; index the tensor once",
              "err_unsupported_index")
    shape = t.shape
    idx = _expand(idx, len(shape), t.name)
    if any(isinstance(k, IndexExpr) and k.ndim == 1 for k in idx) and len(shape) > 1:
        _fail("1D arange is not supported as a tensor index; place it on an axis, e.g. nl.arange(128)[:, None] "
              "for the partition dimension and nl.arange(512)[None, :] for a free dimension",
              "err_1d_arange_not_supported")
    # A tile used as an index (indirect DMA: ``data[idx_tile, i_f]``) contributes its values, one per element.
    idx = tuple(IndexExpr.from_array(np.asarray(k.read()).astype(np.int64)) if isinstance(k, NkiTensor) else k
                for k in idx)
    exprs = [k for k in idx if isinstance(k, IndexExpr)]
    free_pos = [d for d, k in enumerate(idx) if _as_int(k) is None]
    rank = max([e.rank for e in exprs] + [len(free_pos)])
    # Per position: an int, or (expr) with slices turned into fresh variables placed on their position's axis.
    terms: list = []
    for d, k in enumerate(idx):
        i = _as_int(k)
        if i is not None:
            terms.append(i + (shape[d] if i < 0 else 0))
        elif isinstance(k, (slice, DynSlice)):
            start, count, step = _range_of(k, shape[d])
            v = Var(count)
            axis = free_pos.index(d) + (rank - len(free_pos))
            terms.append(IndexExpr(start + step * np.arange(count, dtype=np.int64), (v,), {v: axis}, rank, {v: step},
                                   start))
        elif isinstance(k, IndexExpr):
            terms.append(k)
        else:
            _fail(f"unsupported index {k!r} mixed with nl.arange expressions", "err_unsupported_index")
    # Tile dimensions follow NumPy broadcasting of the placed expressions (``[:, None]`` is the partition axis);
    # each axis remembers the index variable placed on it, so masks can be aligned by variable.
    placed = [k.values.reshape((1,) * (rank - k.rank) + k.shape) if isinstance(k, IndexExpr)
              else np.asarray(k, dtype=np.int64) for k in terms]
    try:
        out_shape = np.broadcast_shapes(*(a.shape for a in placed))
    except ValueError:
        _fail(f"index expressions for tensor `{t.name}` have incompatible shapes {[a.shape for a in placed]}",
              "err_shape_mismatch")
    axis_vars: list[Var | None] = [None] * len(out_shape)
    for k in terms:
        if isinstance(k, IndexExpr):
            for v, ax in k.place.items():
                axis_vars[ax + rank - k.rank] = v
    oob = None
    msg = None
    for d, a in enumerate(placed if 0 not in out_shape else ()):
        # the range of the placed (unbroadcast) values: broadcasting repeats them, so it is the tile's range too
        lo, hi = int(a.min()), int(a.max())
        if lo < 0 or hi >= shape[d]:
            full = np.broadcast_to(a, out_shape)
            bad = (full < 0) | (full >= shape[d])
            oob = bad if oob is None else (oob | bad)
            if msg is None:
                msg = (f"Out-of-bound access for tensor `{t.name}` on dimension {d}: index range [{lo}, {hi}] "
                       f"exceed dimension size of {shape[d]}")
            placed[d] = np.clip(a, 0, shape[d] - 1)
    basic = _as_slices(terms) if oob is None else None
    if basic is not None:
        out = wrap(NkiTensor.__getitem__(t, basic))
        if out.shape != out_shape:  # basic indexing drops ints; the broadcast shape keeps size-1 axes
            out = wrap(NkiTensor.reshape(out, out_shape))
    else:
        arrays = tuple(np.broadcast_to(a, out_shape) for a in placed)
        out = LegacyTile(t.alloc, t.base, arrays, t.name, None if oob is None else (oob, msg))
    out.ivars = tuple(v if v is not None else Var(n) for v, n in zip(axis_vars, out_shape))
    return out


def _as_slices(terms: list) -> tuple | None:
    """The equivalent basic index (ints and slices) when each expression is ``offset + coef·v`` (coef > 0) of its
    own variable and the variables are placed on increasing axes in index order (so basic indexing yields them in
    the same order); None when a gather is needed."""
    basic = []
    last = -1
    for k in terms:
        if not isinstance(k, IndexExpr):
            basic.append(k)
            continue
        if k.coefs is None or len(k.vars) != 1 or set(k.coefs) != set(k.vars):
            return None
        v = k.vars[0]
        c = k.coefs[v]
        if c <= 0:
            return None
        basic.append((slice(k.offset, k.offset + c * (v.n - 1) + 1, c), k))
    # placement axes, aligned to a common rank (NumPy left-pads lower-rank expressions)
    rank = max((k.rank for _, k in (b for b in basic if isinstance(b, tuple))), default=0)
    out = []
    for b in basic:
        if isinstance(b, tuple):
            s, k = b
            axis = k.place[k.vars[0]] + rank - k.rank
            if axis <= last:
                return None
            last = axis
            out.append(s)
        else:
            out.append(b)
    return tuple(out)


# -- masks -----------------------------------------------------------------------------------------------------
def mask_array(mask, shape: tuple[int, ...], what: str = "tile", like=None) -> np.ndarray | None:
    """``mask=`` as a bool array of ``shape`` (None: unmasked); aligned by index variable with ``like`` (an
    ``nl.arange`` access, or a tile loaded from one) when it has them."""
    try:
        return as_mask(mask, tuple(shape), getattr(like, "ivars", None))
    except ValueError:
        m = getattr(mask, "values", mask)
        _fail(f"mask of shape {fmt_shape(np.shape(m))} does not match {what} shape {fmt_shape(shape)}",
              "err_shape_mismatch")


def check_access(t, mask, loc=None) -> None:
    """Raise ``err_tensor_access_out_of_bound`` if ``t`` touches elements outside its tensor that ``mask`` keeps."""
    oob = getattr(t, "oob", None)
    if oob is None:
        return
    bad, msg = oob
    m = mask_array(mask, t.shape, like=t) if mask is not None else None
    if (bad if m is None else (bad & m)).any():
        raise NkiValidationError(msg, code="err_tensor_access_out_of_bound", location=loc or kernel_location(3))


def masked_write(dst: NkiTensor, values, m: np.ndarray | None) -> None:
    """Write ``values`` (broadcastable to ``dst``) only where ``m`` is true (all when None), rounding to
    ``dst``'s dtype."""
    if m is None:
        dst.write(values)
    else:
        dst.write_masked(values, m)


def unwritten_outside(t: NkiTensor, m: np.ndarray | None) -> None:
    """A masked instruction leaves its fresh result tile unwritten (NaN / 4) where the mask is false."""
    if m is None or m.all():
        return
    t.base[~m] = uninit_value(t.dtype)
    if isinstance(t, LegacyTile):
        t.valid = np.array(m)


def instruction_result(t: NkiTensor, m: np.ndarray | None = None) -> LegacyTile:
    """The new tile an instruction returned: masked (see :func:`unwritten_outside`) and marked ``fresh``, so that
    ``dst[...] = <it>`` costs no extra copy when ``dst`` is in the same buffer (the legacy compiler makes ``dst``
    the instruction's output)."""
    r = wrap(t)
    unwritten_outside(r, m)
    r.fresh = True
    return r


def check_matmul_operands(op: str, stationary: NkiTensor, moving: NkiTensor, stationary_arg: str = "stationary",
                          moving_arg: str = "moving") -> None:
    """Matmul free-size limits (stationary ≤ 128, moving ≤ 512), checked before the PSUM result is allocated so
    the error names the operand, with the legacy ``err_size_of_dimension_exceed_arch_limit`` message."""
    for t, arg, limit in ((stationary, stationary_arg, 128), (moving, moving_arg, 512)):
        if t.ndim >= 2:
            _ext.check_dim_size(t, op, arg, 1, limit, size=t.free_size)
