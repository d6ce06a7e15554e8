"""Legacy index expressions: ``nl.arange``, ``nl.mgrid``, masks (predicates), ``nl.par_dim`` and SPMD grid dims.

Why: NKI 0.1 kernels address tiles with affine expressions of ``nl.arange`` (``i * 128 + nl.arange(128)[:, None]``)
and guard ragged tiles with ``mask=`` predicates built from the same expressions (``i * 128 + i_p < n``). Here an
expression is its NumPy integer array (broadcastable, one axis per index-space dimension) plus, when it is still
affine, ``offset + Σ coef·axis`` so that tensor accesses can become plain strided views instead of gathers.
Comparisons produce a :class:`Predicate` (a boolean array) used as ``mask=``.
"""

from __future__ import annotations

import math
import operator

import numpy as np

__all__ = ["IndexExpr", "MGrid", "Predicate", "arange", "as_mask", "mgrid", "nc", "par_dim", "spmd_dim"]


class Predicate:
    """A compile-time boolean predicate over an index space (legacy ``mask=``)."""

    __slots__ = ("values",)

    def __init__(self, values):
        self.values = np.asarray(values, dtype=bool)

    def _combine(self, other, fn):
        o = other.values if isinstance(other, Predicate) else np.asarray(other, dtype=bool)
        return Predicate(fn(self.values, o))

    def __and__(self, other):
        return self._combine(other, np.logical_and)

    __rand__ = __and__

    def __or__(self, other):
        return self._combine(other, np.logical_or)

    __ror__ = __or__

    def __xor__(self, other):
        return self._combine(other, np.logical_xor)

    def __invert__(self):
        return Predicate(~self.values)

    def __bool__(self):
        raise TypeError("a legacy mask predicate has no single truth value; pass it as mask=")

    def __repr__(self) -> str:
        return f"Predicate(shape={self.values.shape}, true={int(self.values.sum())})"


class IndexExpr:
    """An (affine) integer expression over ``nl.arange`` axes; see module docstring.

    ``terms`` maps an index-space axis to its coefficient (None once the expression is no longer affine,
    e.g. after ``%``); ``offset`` is the constant part.
    """

    __slots__ = ("offset", "terms", "values")
    __array_priority__ = 2000  # ``np_int + expr`` defers to us

    def __init__(self, values: np.ndarray, terms: dict[int, int] | None, offset: int = 0):
        self.values = np.asarray(values, dtype=np.int64)
        self.terms = terms
        self.offset = int(offset)

    # -- metadata ------------------------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return self.values.ndim

    @property
    def shape(self) -> tuple[int, ...]:
        return self.values.shape

    def __nki_index__(self) -> np.ndarray:
        """Hook read by the core's ``normalize_index``: the integer index array."""
        return self.values

    def __repr__(self) -> str:
        return f"IndexExpr(shape={self.shape}, min={self.values.min() if self.values.size else 0})"

    # -- arithmetic ----------------------------------------------------------------------------------------
    @staticmethod
    def _scalar(o) -> int | None:
        if isinstance(o, (bool, np.bool_)):
            return None
        if isinstance(o, (int, np.integer)):
            return int(o)
        if hasattr(o, "__index__") and not isinstance(o, (IndexExpr, np.ndarray)):
            return int(o.__index__())
        return None

    def _lift(self, o) -> IndexExpr:
        if isinstance(o, IndexExpr):
            return o
        s = self._scalar(o)
        if s is None:
            raise TypeError(f"cannot combine an nl.arange expression with {type(o).__name__}")
        return IndexExpr(np.int64(s), {}, s)

    def _add(self, o, sign: int) -> IndexExpr:
        o = self._lift(o)
        vals = self.values + sign * o.values
        if self.terms is None or o.terms is None or (self.ndim != o.ndim and o.terms and self.terms):
            return IndexExpr(vals, None)
        terms = dict(self.terms)
        for ax, c in o.terms.items():
            terms[ax] = terms.get(ax, 0) + sign * c
        terms = {a: c for a, c in terms.items() if c}
        return IndexExpr(vals, terms, self.offset + sign * o.offset)

    def __add__(self, o):
        return self._add(o, 1)

    __radd__ = __add__

    def __sub__(self, o):
        return self._add(o, -1)

    def __rsub__(self, o):
        return (-self)._add(o, 1)

    def __neg__(self):
        return self * -1

    def __mul__(self, o):
        s = self._scalar(o)
        if s is None:
            o = self._lift(o)
            return IndexExpr(self.values * o.values, None)
        terms = None if self.terms is None else {a: c * s for a, c in self.terms.items() if c * s}
        return IndexExpr(self.values * s, terms, self.offset * s)

    __rmul__ = __mul__

    def _nonaffine(self, o, fn, reverse=False):
        ov = o.values if isinstance(o, IndexExpr) else np.int64(self._lift(o).offset)
        return IndexExpr(fn(ov, self.values) if reverse else fn(self.values, ov), None)

    def __floordiv__(self, o):
        return self._nonaffine(o, np.floor_divide)

    def __rfloordiv__(self, o):
        return self._nonaffine(o, np.floor_divide, True)

    def __mod__(self, o):
        return self._nonaffine(o, np.mod)

    def __rmod__(self, o):
        return self._nonaffine(o, np.mod, True)

    # -- predicates ----------------------------------------------------------------------------------------
    def _cmp(self, o, fn) -> Predicate:
        ov = o.values if isinstance(o, IndexExpr) else np.asarray(o)
        return Predicate(fn(self.values, ov))

    def __lt__(self, o):
        return self._cmp(o, operator.lt)

    def __le__(self, o):
        return self._cmp(o, operator.le)

    def __gt__(self, o):
        return self._cmp(o, operator.gt)

    def __ge__(self, o):
        return self._cmp(o, operator.ge)

    def __eq__(self, o):  # type: ignore[override]
        return self._cmp(o, operator.eq)

    def __ne__(self, o):  # type: ignore[override]
        return self._cmp(o, operator.ne)

    __hash__ = object.__hash__

    # -- axis placement: ``nl.arange(n)[:, None]`` ---------------------------------------------------------
    def __getitem__(self, key) -> IndexExpr:
        if not isinstance(key, tuple):
            key = (key,)
        vals = self.values[key]
        if self.terms is None or any(not (k is None or k == slice(None)) for k in key):
            return IndexExpr(vals, None)
        mapping: dict[int, int] = {}
        old = new = 0
        for k in key:
            if k is None:
                new += 1
            else:
                mapping[old] = new
                old += 1
                new += 1
        for ax in range(old, self.ndim):  # unindexed trailing axes keep their order
            mapping[ax] = new + ax - old
        return IndexExpr(vals, {mapping[a]: c for a, c in self.terms.items()}, self.offset)


def arange(start, stop=None, step: int = 1) -> IndexExpr:
    """``nl.arange(n)`` / ``nl.arange(start, stop)``: a 1-D index expression (place it with ``[:, None]``)."""
    if stop is None:
        start, stop = 0, start
    start, stop, step = int(start), int(stop), int(step)
    return IndexExpr(np.arange(start, stop, step, dtype=np.int64), {0: step}, start)


class MGrid(tuple):
    """Result of ``nl.mgrid[...]``: unpack it, or use ``.p`` (partition) and ``.x``/``.y``/``.z`` (free axes)."""

    def _field(self, i: int) -> IndexExpr:
        if i >= len(self):
            raise AttributeError(f"this mgrid has {len(self)} dimensions")
        return self[i]

    p = property(lambda self: self._field(0))
    x = property(lambda self: self._field(1))
    y = property(lambda self: self._field(2))
    z = property(lambda self: self._field(3))


class _MGridMaker:
    """``nl.mgrid[0:128, 0:512]``: one index expression per dimension, each varying along its own axis."""

    def __getitem__(self, key) -> MGrid:
        if not isinstance(key, tuple):
            key = (key,)
        n = len(key)
        exprs = []
        for ax, s in enumerate(key):
            if not isinstance(s, slice):
                raise TypeError("nl.mgrid takes slices, e.g. nl.mgrid[0:128, 0:512]")
            start = 0 if s.start is None else int(s.start)
            step = 1 if s.step is None else int(s.step)
            vals = np.arange(start, int(s.stop), step, dtype=np.int64)
            shape = [1] * n
            shape[ax] = vals.size
            exprs.append(IndexExpr(vals.reshape(shape), {ax: step}, start))
        return MGrid(exprs)


mgrid = _MGridMaker()


class par_dim(int):
    """``nl.par_dim(n)``: marks the partition dimension in a tensor shape (dimensions before it are blocks)."""

    def __repr__(self) -> str:
        return f"par_dim({int(self)})"


# -- SPMD launch-grid dimensions -------------------------------------------------------------------------------
class nc:
    """``nl.nc(n)``: a launch-grid dimension whose instances go to ``n`` physical NeuronCores."""

    def __init__(self, n: int):
        self.n = int(n)

    def __nki_grid_size__(self) -> int:
        return self.n

    def __mul__(self, k) -> spmd_dim:
        return spmd_dim(self, k)

    def __rmul__(self, k) -> spmd_dim:
        return spmd_dim(k, self)

    def __repr__(self) -> str:
        return f"nl.nc({self.n})"


class spmd_dim:
    """``nl.spmd_dim(a, b, ...)``: a launch-grid dimension of size ``a*b*...`` split row-major into sub-dimensions;
    an ``nl.nc`` sub-dimension decides the NeuronCore (``spmd_dim(2, nc(2))`` interleaves, ``spmd_dim(nc(2), 2)``
    blocks)."""

    def __init__(self, *dims):
        self.dims = tuple(dims)

    def sizes(self) -> tuple[int, ...]:
        return tuple(d.n if isinstance(d, nc) else int(d) for d in self.dims)

    def __nki_grid_size__(self) -> int:
        return math.prod(self.sizes())

    def core_of(self, index: int) -> tuple[int, int]:
        """(core index, number of cores) this grid position maps to (0, 1 without an ``nc`` sub-dimension)."""
        core, ncores = 0, 1
        rem = index
        sizes = self.sizes()
        for pos in range(len(sizes) - 1, -1, -1):
            sub = rem % sizes[pos]
            rem //= sizes[pos]
            if isinstance(self.dims[pos], nc):
                core, ncores = core * sizes[pos] + sub, ncores * sizes[pos]
        return core, ncores

    def __repr__(self) -> str:
        return f"nl.spmd_dim{self.dims}"


def as_mask(mask, shape: tuple[int, ...]) -> np.ndarray | None:
    """Broadcast a legacy ``mask=`` (Predicate, bool array or bool) to ``shape``; None means "all true"."""
    if mask is None:
        return None
    m = mask.values if isinstance(mask, Predicate) else np.asarray(mask, dtype=bool)
    try:
        return np.broadcast_to(m, shape)
    except ValueError:
        pass
    # Partition-aligned broadcast: a [P, 1] predicate applies to a 1-D [P] tile and vice versa.
    squeezed = m.reshape(m.shape[:len(shape)]) if m.ndim > len(shape) and math.prod(m.shape[len(shape):]) == 1 \
        else m.reshape(m.shape + (1,) * (len(shape) - m.ndim))
    return np.broadcast_to(squeezed, shape)
