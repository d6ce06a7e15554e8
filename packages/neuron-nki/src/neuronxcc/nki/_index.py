"""Legacy index expressions: ``nl.arange``, ``nl.mgrid``, masks (predicates), ``nl.par_dim`` and SPMD grid dims.

Why: NKI 0.1 kernels address tiles with affine expressions of ``nl.arange`` (``i * 128 + nl.arange(128)[:, None]``)
and guard ragged tiles with ``mask=`` predicates built from the same expressions (``i * 128 + i_p < n``).

Model: every ``nl.arange`` and every ``nl.mgrid`` dimension is an index *variable* (:class:`Var`, by identity).
An expression is a table of values over the grid of the variables it uses (``table`` has one axis per entry of
``vars``), plus each variable's NumPy placement (``[:, None]`` puts it on axis 0 of a rank-2 space) and, while it
is affine, ``offset + Σ coef·var``. ``values`` is the expression broadcast NumPy-style; a tensor access takes its
tile shape from that broadcast (the partition axis is the one placed first), and remembers which variable sits on
each axis so that a ``mask=`` predicate over the same variables is aligned by variable, not by NumPy position
(``mask=(j * 512 + i_f < n)`` with ``i_f`` from a 2-D ``mgrid`` masks the free axis of a 3-D access).
"""

from __future__ import annotations

import math
import operator
import warnings

import numpy as np

__all__ = ["IndexExpr", "MGrid", "Predicate", "Var", "arange", "as_mask", "mgrid", "nc", "par_dim", "spmd_dim"]


class Var:
    """One index variable (an ``nl.arange`` or an ``nl.mgrid`` dimension) of extent ``n``."""

    __slots__ = ("n",)

    def __init__(self, n: int):
        self.n = int(n)

    def __repr__(self) -> str:
        return f"Var({self.n})@{id(self):x}"


def expand_table(table: np.ndarray, vars_: tuple[Var, ...], target: tuple[Var, ...]) -> np.ndarray:
    """``table`` (one axis per ``vars_``) laid out over the grid of ``target`` (a superset), broadcastable."""
    table = np.asarray(table)
    if not vars_:
        return table.reshape((1,) * len(target))
    order = sorted(range(len(vars_)), key=lambda i: target.index(vars_[i]))
    t = np.transpose(table, order)
    shape = [1] * len(target)
    for i in order:
        shape[target.index(vars_[i])] = vars_[i].n
    return t.reshape(shape)


class _VarTable:
    """Values over a variable grid plus NumPy placement; shared by :class:`IndexExpr` and :class:`Predicate`."""

    __slots__ = ("_values", "place", "rank", "table", "vars")

    def __init__(self, table, vars_: tuple[Var, ...], place: dict, rank: int):
        self.table = np.asarray(table)
        self.vars = tuple(vars_)
        self.place = dict(place)
        self.rank = int(rank)
        self._values = None

    @property
    def values(self) -> np.ndarray:
        """NumPy-placed values (each variable on its placement axis, size 1 elsewhere)."""
        if self._values is None:
            order = sorted(range(len(self.vars)), key=lambda i: self.place[self.vars[i]])
            t = np.transpose(self.table, order) if self.vars else self.table
            shape = [1] * self.rank
            for i in order:
                shape[self.place[self.vars[i]]] = self.vars[i].n
            self._values = t.reshape(shape)
        return self._values

    @property
    def ndim(self) -> int:
        return self.rank

    @property
    def shape(self) -> tuple[int, ...]:
        return self.values.shape

    @classmethod
    def from_array(cls, arr: np.ndarray, **extra):
        """Fresh variables, one per axis of ``arr`` longer than 1 (a computed index / tile index)."""
        arr = np.asarray(arr)
        vars_, place = [], {}
        for ax, n in enumerate(arr.shape):
            if n > 1:
                v = Var(n)
                vars_.append(v)
                place[v] = ax
        return cls(arr.reshape(tuple(v.n for v in vars_)), tuple(vars_), place, arr.ndim, **extra)

    def _align(self, other):
        """(self table, other table, union vars, place, rank) on a common grid, or None on placement conflict."""
        rank = max(self.rank, other.rank)
        ps = {v: a + rank - self.rank for v, a in self.place.items()}
        po = {v: a + rank - other.rank for v, a in other.place.items()}
        if any(ps[v] != po[v] for v in ps.keys() & po.keys()):
            return None
        union = self.vars + tuple(v for v in other.vars if v not in self.vars)
        return (expand_table(self.table, self.vars, union), expand_table(other.table, other.vars, union), union,
                {**ps, **po}, rank)

    def _binary(self, other, fn, out_cls, **extra):
        o = other if isinstance(other, _VarTable) else None
        if o is None:
            return out_cls(fn(self.table, np.asarray(other)), self.vars, self.place, self.rank, **extra)
        al = self._align(o)
        if al is None:  # one variable placed on two axes: fall back to plain NumPy broadcasting
            a, b = self.values, o.values
            return out_cls.from_array(fn(a, b), **extra)
        ta, tb, union, place, rank = al
        return out_cls(fn(ta, tb), union, place, rank, **extra)


class Predicate(_VarTable):
    """A compile-time boolean predicate over index variables (legacy ``mask=``); ``&``, ``|``, ``^``, ``~``."""

    __slots__ = ()

    def __init__(self, table, vars_=(), place=None, rank=None):
        table = np.asarray(table, dtype=bool)
        super().__init__(table, vars_, place or {}, table.ndim if rank is None else rank)

    def __and__(self, other):
        return self._binary(other, np.logical_and, Predicate)

    __rand__ = __and__

    def __or__(self, other):
        return self._binary(other, np.logical_or, Predicate)

    __ror__ = __or__

    def __xor__(self, other):
        return self._binary(other, np.logical_xor, Predicate)

    def __invert__(self):
        return Predicate(~self.table, self.vars, self.place, self.rank)

    def __bool__(self):
        """Truthy, as a traced predicate object is in NKI 0.1: ``p and q`` is ``q`` (Python never combines them);
        warns because ``p & q`` is almost certainly what was meant."""
        warnings.warn("'and'/'or' on mask predicates keeps only one of them (as in NKI 0.1: 'p and q' is q); use "
                      "'&' / '|' to combine predicates", SyntaxWarning, stacklevel=2)
        return True

    def __repr__(self) -> str:
        return f"Predicate(shape={self.shape}, true={int(self.table.sum())})"


class IndexExpr(_VarTable):
    """An integer expression over index variables (see module docstring); ``coefs`` is None once non-affine."""

    __slots__ = ("coefs", "offset")
    __array_priority__ = 2000  # ``np_int + expr`` defers to us

    def __init__(self, table, vars_=(), place=None, rank=None, coefs=None, offset: int = 0):
        table = np.asarray(table, dtype=np.int64)
        super().__init__(table, vars_, place or {}, table.ndim if rank is None else rank)
        self.coefs = coefs
        self.offset = int(offset)

    def __nki_index__(self) -> np.ndarray:
        """Hook read by the core's ``normalize_index``: the NumPy-placed integer index array."""
        return self.values

    def __repr__(self) -> str:
        return f"IndexExpr(shape={self.shape}, vars={len(self.vars)})"

    # -- arithmetic ----------------------------------------------------------------------------------------
    @staticmethod
    def _scalar(o) -> int | None:
        if isinstance(o, (bool, np.bool_)):
            return None
        if isinstance(o, (int, np.integer)):
            return int(o)
        if hasattr(o, "__index__") and not isinstance(o, (_VarTable, np.ndarray)):
            return int(o.__index__())
        return None

    def _add(self, o, sign: int) -> IndexExpr:
        s = self._scalar(o)
        if s is not None:
            return IndexExpr(self.table + sign * s, self.vars, self.place, self.rank, self.coefs,
                             self.offset + sign * s)
        if not isinstance(o, IndexExpr):
            raise TypeError(f"cannot combine an nl.arange expression with {type(o).__name__}")
        out = self._binary(o, (lambda a, b: a + sign * b), IndexExpr)
        if self.coefs is not None and o.coefs is not None and set(self.coefs) | set(o.coefs) <= set(out.vars):
            coefs = dict(self.coefs)
            for v, c in o.coefs.items():
                coefs[v] = coefs.get(v, 0) + sign * c
            out.coefs = {v: c for v, c in coefs.items() if c}
            out.offset = self.offset + sign * o.offset
        return out

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
            if not isinstance(o, IndexExpr):
                raise TypeError(f"cannot combine an nl.arange expression with {type(o).__name__}")
            return self._binary(o, np.multiply, IndexExpr)
        coefs = None if self.coefs is None else {v: c * s for v, c in self.coefs.items() if c * s}
        return IndexExpr(self.table * s, self.vars, self.place, self.rank, coefs, self.offset * s)

    __rmul__ = __mul__

    def _nonaffine(self, o, fn, reverse=False):
        f = (lambda a, b: fn(b, a)) if reverse else fn
        if isinstance(o, IndexExpr):
            return self._binary(o, f, IndexExpr)
        return IndexExpr(f(self.table, np.int64(o)), self.vars, self.place, self.rank)

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
        return self._binary(o, fn, Predicate)

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

    # -- placement: ``nl.arange(n)[:, None]`` --------------------------------------------------------------
    def __getitem__(self, key) -> IndexExpr:
        if not isinstance(key, tuple):
            key = (key,)
        if any(not (k is None or k == slice(None)) for k in key):
            return IndexExpr.from_array(self.values[key])
        mapping: dict[int, int] = {}
        old = new = 0
        for k in key:
            if k is None:
                new += 1
            else:
                mapping[old] = new
                old += 1
                new += 1
        for ax in range(old, self.rank):  # unindexed trailing axes keep their order
            mapping[ax] = new + ax - old
        rank = new + max(0, self.rank - old)
        return IndexExpr(self.table, self.vars, {v: mapping[a] for v, a in self.place.items()}, rank, self.coefs,
                         self.offset)


def arange(start, stop=None, step: int = 1) -> IndexExpr:
    """``nl.arange(n)`` / ``nl.arange(start, stop)``: a new index variable (place it with ``[:, None]``)."""
    if stop is None:
        start, stop = 0, start
    start, stop, step = int(start), int(stop), int(step)
    vals = np.arange(start, stop, step, dtype=np.int64)
    v = Var(vals.size)
    return IndexExpr(vals, (v,), {v: 0}, 1, {v: step}, start)


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
    """``nl.mgrid[0:128, 0:512]``: one index variable per dimension, each placed on its own axis."""

    def __getitem__(self, key) -> MGrid:
        if not isinstance(key, tuple):
            key = (key,)
        exprs = []
        for ax, s in enumerate(key):
            if not isinstance(s, slice):
                raise TypeError("nl.mgrid takes slices, e.g. nl.mgrid[0:128, 0:512]")
            start = 0 if s.start is None else int(s.start)
            step = 1 if s.step is None else int(s.step)
            vals = np.arange(start, int(s.stop), step, dtype=np.int64)
            v = Var(vals.size)
            exprs.append(IndexExpr(vals, (v,), {v: ax}, len(key), {v: step}, start))
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


def as_mask(mask, shape: tuple[int, ...], vars_: tuple[Var, ...] | None = None) -> np.ndarray | None:
    """Broadcast a legacy ``mask=`` (Predicate, bool array or bool) to ``shape``; None means "all true".

    With ``vars_`` (the variables of an index-expression access) a predicate over those variables is aligned by
    variable; otherwise its NumPy placement is broadcast (partition-aligned when ranks differ).
    """
    if mask is None:
        return None
    if isinstance(mask, Predicate) and vars_ and mask.vars and set(mask.vars) <= set(vars_):
        m = expand_table(mask.table, mask.vars, tuple(vars_))
        m = np.broadcast_to(m, tuple(v.n for v in vars_))
        if math.prod(m.shape) == math.prod(shape):
            return m.reshape(shape)
    m = mask.values if isinstance(mask, Predicate) else np.asarray(mask, dtype=bool)
    try:
        return np.broadcast_to(m, shape)
    except ValueError:
        pass
    # Partition-aligned broadcast: a [P, 1] predicate applies to a 1-D [P] tile and vice versa.
    if m.ndim > len(shape) and math.prod(m.shape[len(shape):]) == 1:
        squeezed = m.reshape(m.shape[:len(shape)])
    else:
        squeezed = m.reshape(m.shape + (1,) * (len(shape) - m.ndim))
    return np.broadcast_to(squeezed, shape)
