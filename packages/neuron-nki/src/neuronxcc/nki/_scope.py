"""Legacy tensor scope rules: ``err_local_variable_used_out_of_scope`` and the "shadowing local tensor" warning.

NKI 0.1 gives every ``for``/``while`` block, and every ``if``/``else`` whose condition depends on a loop index,
its own scope for tensors: a tensor newly bound to a name inside a block cannot be used after the block, and re-binding (inside a block) a name that holds a tensor from an
enclosing scope warns ``shadowing local tensor ... use 'data[...] ='`` (SDK-2.26 ``nki.errors.rst``). Python has
function scope only, so kernels are instrumented: the kernel's AST gets, around each block statement,

    __nki_s3 = __nki_scope__.enter(locals(), ('tmp', 'data'))
    <the block statement>
    (tmp, data) = __nki_scope__.leave(locals(), ('tmp', 'data'), __nki_s3, <line>)

``leave`` replaces tensors (re)bound inside the block by an :class:`OutOfScope` placeholder that raises when
used, and warns when a tensor from the enclosing scope was shadowed. Line numbers are preserved, so errors point at
the kernel's own source. If the source is unavailable or anything about the rewrite fails, the kernel runs
unmodified (the checks are a diagnostic, never a reason to refuse a kernel).
"""

from __future__ import annotations
import __future__

import ast
import contextlib
import functools
import inspect
import textwrap
import threading
import warnings
import weakref
from collections.abc import Callable

from nki.extension import NkiError, NkiTensor, fmt_shape, kernel_location, nki_name

__all__ = ["OutOfScope", "instrument"]

_UNSET = object()


class OutOfScope:
    """Stands for a tensor whose block scope has ended; any use raises ``err_local_variable_used_out_of_scope``."""

    __slots__ = ("_line", "_name")

    def __init__(self, name: str, line: int):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_line", line)

    def _raise(self, *args, **kwargs):
        name, line = object.__getattribute__(self, "_name"), object.__getattribute__(self, "_line")
        raise NkiError(f"Local variable '{name}' is referenced outside of its parent scope (the block starting at "
                       f"line {line}); allocate it before the block and update it with '{name}[...] ='",
                       code="err_local_variable_used_out_of_scope", location=kernel_location(2))

    def __getattr__(self, item):
        self._raise()

    def __repr__(self) -> str:
        return f"<out-of-scope tensor '{object.__getattribute__(self, '_name')}'>"

    __getitem__ = __setitem__ = __array__ = __float__ = __int__ = __index__ = __bool__ = __iter__ = __len__ = _raise
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = __neg__ = _raise
    __pow__ = __iadd__ = __isub__ = __imul__ = _raise


class _Runtime:
    """The ``__nki_scope__`` object the instrumented kernel calls."""

    @staticmethod
    def enter(loc: dict, names: tuple[str, ...]) -> dict:
        return {n: loc.get(n, _UNSET) for n in names}

    @staticmethod
    def leave(loc: dict, names: tuple[str, ...], before: dict, line: int) -> tuple:
        out = []
        for n in names:
            v = loc.get(n, _UNSET)
            old = before.get(n, _UNSET)
            if isinstance(old, OutOfScope):  # left over from an earlier pass through this block: unbound
                old = _UNSET
            if v is _UNSET:
                out.append(old if old is not _UNSET else OutOfScope(n, line))
            elif isinstance(v, NkiTensor) and v is not old and (old is _UNSET or isinstance(old, NkiTensor)):
                # new in the block, or shadowing an outer tensor; an outer non-tensor (``x = None``) is updated
                if isinstance(old, NkiTensor):
                    warnings.warn(f"shadowing local tensor '{nki_name(old.dtype)} {n}{fmt_shape(old.shape)}' with a "
                                  f"new object, use '{n}[...] =' if you want to update the existing object",
                                  SyntaxWarning, stacklevel=2)
                out.append(OutOfScope(n, line))
            else:
                out.append(v)
        return tuple(out)


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp,
           ast.DictComp, ast.GeneratorExp)


def _bound_names(stmts) -> list[str]:
    """Names bound by assignments / loop targets / ``with ... as`` in ``stmts`` (not in nested scopes)."""
    names: list[str] = []

    def visit(node):
        if isinstance(node, _SCOPES):
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id not in names:
            names.append(node.id)
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, ast.AugAssign):  # ``t += x`` updates a tile in place
                visit(child)

    for s in stmts:
        if not isinstance(s, ast.AugAssign):
            visit(s)
    return names


def _loaded_names(expr) -> set[str]:
    return {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}


class _Rewriter:
    """Wraps scope blocks: every loop, and every ``if`` whose condition depends on a loop (a name bound by or
    inside an enclosing loop). Other ``if``s test compile-time constants (kernel arguments, flags): the legacy
    tracer resolved them in Python, so they open no scope (public kernels rely on this, e.g.
    ``if config.training: lse = nl.ndarray(...)`` followed by a use of ``lse``)."""

    def __init__(self, skip: set[str], line_offset: int):
        self.count = 0
        self.skip = skip
        self.line_offset = line_offset

    def body(self, stmts: list[ast.stmt], loop_names: frozenset[str] = frozenset()) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for s in stmts:
            if isinstance(s, _SCOPES):
                out.append(s)
                continue
            is_loop = isinstance(s, ast.For | ast.AsyncFor | ast.While)
            inner = loop_names
            if is_loop:
                inner = loop_names | set(_bound_names(s.body)) | (
                    set(_bound_names([s.target])) if isinstance(s, ast.For | ast.AsyncFor) else set())
            if hasattr(s, "body") and isinstance(s.body, list):  # nested blocks first: they get their own scope
                s.body = self.body(s.body, inner)
            for field in ("orelse", "finalbody"):
                if isinstance(getattr(s, field, None), list):
                    setattr(s, field, self.body(getattr(s, field), loop_names))
            for handler in getattr(s, "handlers", ()):
                handler.body = self.body(handler.body, loop_names)
            is_scope = is_loop or (isinstance(s, ast.If) and bool(_loaded_names(s.test) & loop_names))
            if not is_scope:
                out.append(s)
                continue
            bound = _bound_names([*s.body, *s.orelse]) + (_bound_names([s.target]) if isinstance(
                s, ast.For | ast.AsyncFor) else [])
            names = [n for n in dict.fromkeys(bound) if n not in self.skip and not n.startswith("__nki_")]
            if not names:
                out.append(s)
                continue
            self.count += 1
            var = f"__nki_s{self.count}"
            tup = ast.Tuple([ast.Constant(n) for n in names], ast.Load())
            locs = ast.Call(ast.Name("locals", ast.Load()), [], [])
            rt = ast.Name("__nki_scope__", ast.Load())
            enter = ast.Assign([ast.Name(var, ast.Store())],
                               ast.Call(ast.Attribute(rt, "enter", ast.Load()), [locs, tup], []))
            leave = ast.Assign([ast.Tuple([ast.Name(n, ast.Store()) for n in names], ast.Store())],
                               ast.Call(ast.Attribute(rt, "leave", ast.Load()),
                                        [locs, tup, ast.Name(var, ast.Load()),
                                         ast.Constant(s.lineno + self.line_offset)], []))
            for node in (enter, leave):
                ast.copy_location(node, s)
            out.extend([enter, s, leave])
        return out


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()  # LNC2 launches run cores as threads; sub-kernels may be instrumented from them


def instrument(fn: Callable) -> Callable:
    """``fn`` with scope checks (see module docstring), or ``fn`` itself if it cannot be instrumented."""
    with _LOCK:
        try:
            return _CACHE[fn]
        except (KeyError, TypeError):
            pass
        new = _instrument(fn)
        with contextlib.suppress(TypeError):
            _CACHE[fn] = new
        return new


def _instrument(fn: Callable) -> Callable:
    try:
        src = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(src)
        fdef = tree.body[0]
        if not isinstance(fdef, ast.FunctionDef) or fdef.name != fn.__name__:
            return fn
        fdef.decorator_list = []
        declared = {n for node in ast.walk(fdef) if isinstance(node, ast.Global | ast.Nonlocal) for n in node.names}
        rw = _Rewriter(declared, fn.__code__.co_firstlineno - 1)
        fdef.body = rw.body(fdef.body)
        if not rw.count:
            return fn
        free = list(fn.__code__.co_freevars)
        outer = ast.FunctionDef(
            name="__nki_outer__",
            args=ast.arguments(posonlyargs=[], args=[ast.arg(a) for a in ["__nki_scope__", *free]], kwonlyargs=[],
                               kw_defaults=[], defaults=[]),
            body=[fdef, ast.Return(ast.Name(fdef.name, ast.Load()))], decorator_list=[], returns=None,
            type_params=[])
        module = ast.Module([outer], type_ignores=[])
        ast.fix_missing_locations(module)
        ast.increment_lineno(module, fn.__code__.co_firstlineno - 1)
        flags = fn.__code__.co_flags & __future__.annotations.compiler_flag
        code = compile(module, fn.__code__.co_filename, "exec", flags=flags, dont_inherit=True)
        ns: dict = {}
        exec(code, fn.__globals__, ns)
        cells = [c.cell_contents for c in (fn.__closure__ or ())]
        new = ns["__nki_outer__"](_Runtime, *cells)
        new.__kwdefaults__ = fn.__kwdefaults__
        new.__defaults__ = fn.__defaults__
        functools.update_wrapper(new, fn, assigned=("__module__", "__name__", "__qualname__", "__doc__"),
                                 updated=())
        return new
    except Exception:  # diagnostics only: never refuse a kernel we cannot rewrite
        return fn
