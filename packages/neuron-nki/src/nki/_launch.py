"""Tracing and launch: ``nki.jit``, launch grids ``kernel[g]``, ``nki.simulate`` and the NumPy seam.

A kernel is plain Python executed eagerly (NKI 0.2+ control flow behaves like Python). Launching:

1. wrap NumPy arguments as HBM tensors *without copying* (writes to inputs reach the caller);
2. run every instance of the launch grid (``itertools.product`` over the grid, row-major) with
   ``nl.program_id``/``nl.num_programs`` answered from the launch context. Instances are spread round-robin over
   the logical NeuronCores (``NEURON_LOGICAL_NC_CONFIG``, default 2 on trn2/trn3, 1 on trn1) and run one after
   another; each core has its own engine timeline, HBM is shared. The k-th ``nl.shared_hbm`` allocation of every
   instance is the same tensor (kernel outputs are shared by all instances);
3. convert returned HBM tensors to NumPy arrays and build a :class:`~nki._cost.CostReport`.

:func:`run_kernel` is the seam for framework adapters (e.g. a later PyTorch adapter): NumPy in,
``KernelRun(outputs, cost)`` out. Adapters for other array types register with :func:`register_framework`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import itertools
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _blas, _context, _limits, envvars
from ._context import CoreState, LaunchContext
from ._cost import CoreTimeline, CostReport
from ._dtypes import precise_fp_default
from ._errors import NkiError, NkiValidationError
from ._liveness import touch
from ._targets import Target, current_lnc, resolve_target
from ._tensor import NkiTensor, hbm, wrap_array

__all__ = ["Kernel", "KernelRun", "benchmark", "jit", "register_framework", "run_kernel", "simulate"]


@dataclass
class KernelRun:
    """Result of one simulated launch: outputs (NumPy, same structure the kernel returned) and its cost."""

    outputs: Any
    cost: CostReport


def _normalize_grid(grid) -> tuple[int, ...]:
    """The launch grid as a tuple of ints; anything but integers is refused by name (a float grid was truncated
    or failed with "'float' object is not iterable")."""
    if grid is None or grid == ():
        return ()
    dims = (grid,) if not isinstance(grid, (tuple, list)) else grid
    out = []
    for g in dims:
        if hasattr(g, "__nki_grid_size__"):  # hook for legacy spmd_dim / nc objects
            g = g.__nki_grid_size__()
        if isinstance(g, bool) or not isinstance(g, (int, np.integer)):
            raise NkiValidationError(f"launch grid {grid!r}: grid dimensions must be integers, got "
                                     f"{type(g).__name__} {g!r}", code="err_invalid_launch_grid")
        out.append(int(g))
    return tuple(out)


_SCALARS = (bool, int, float, str, np.generic, np.dtype, type(None))


def _check_argument(value: Any, name: str) -> None:
    """A kernel argument that is not an array must be a constant: a number, a string, a dtype or a tuple of them.
    Anything else (a list, a tensor of another framework the launch did not convert) would reach the kernel's
    instructions as something they cannot read: an error naming the argument now."""
    if isinstance(value, (NkiTensor, *_SCALARS)) or callable(value):
        return
    if isinstance(value, tuple):
        for item in value:
            _check_argument(item, name)
        return
    hint = " (np.asarray(...) makes it an array)" if isinstance(value, list) or hasattr(value, "__array__") else ""
    raise NkiError(f"kernel argument `{name}` is a {type(value).__name__}: pass a NumPy array, or a number, string, "
                   f"dtype or tuple of them as a constant{hint}", code="err_invalid_kernel_argument")


def _lnc(target: Target, lnc: int | None) -> int:
    if lnc is not None:
        return int(lnc)
    return current_lnc(target)


def map_nested(values: Any, fn: Callable[[Any], Any]) -> Any:
    """``fn`` applied to every leaf of nested tuples, lists and dicts (a kernel's arguments or results), the
    nesting kept."""
    if isinstance(values, tuple):
        return tuple(map_nested(v, fn) for v in values)
    if isinstance(values, list):
        return [map_nested(v, fn) for v in values]
    if isinstance(values, dict):
        return {k: map_nested(v, fn) for k, v in values.items()}
    return fn(values)


def _to_host(x):
    if isinstance(x, NkiTensor):
        if x.buffer.on_chip:
            raise NkiError(f"kernel returned on-chip tensor `{x.name}` ({x.buffer!r}); outputs must be HBM tensors "
                           "(nl.ndarray(..., buffer=nl.shared_hbm))", code="err_unsupported_memory")
        return np.asarray(x.read())
    return x


def run_kernel(fn: Callable, args: tuple = (), kwargs: dict | None = None, grid=(), target: str | Target | None = None,
               precise: bool | None = None, lnc: int | None = None, core_assignment: Callable | None = None,
               extra: dict | None = None) -> KernelRun:
    """Run kernel function ``fn`` on NumPy arrays in the simulator; return outputs and simulated cost.

    ``core_assignment(instance_index, program_id, n_cores) -> core`` overrides round-robin placement (legacy
    ``nl.spmd_dim``/``nl.nc``). ``extra`` is copied into ``LaunchContext.extra`` for API layers.
    """
    kwargs = dict(kwargs or {})
    tgt = target if isinstance(target, Target) else resolve_target(target)
    precise = precise_fp_default() if precise is None else precise
    g = _normalize_grid(grid)
    _limits.check_grid(g)
    n_inst = 1
    for d in g:
        n_inst *= d
    n_cores = max(1, min(_lnc(tgt, lnc), n_inst)) if g else 1
    cores = [CoreState(i, CoreTimeline(tgt)) for i in range(n_cores)]
    ctx = LaunchContext(tgt, precise, g, cores, extra=dict(extra or {}))
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []

    def wrap(v, name):
        if isinstance(v, np.ndarray):
            return wrap_array(v, name, precise, hbm)
        _check_argument(v, name)
        return v

    w_args = tuple(wrap(a, params[i] if i < len(params) else f"arg{i}") for i, a in enumerate(args))
    w_kwargs = {k: wrap(v, k) for k, v in kwargs.items()}
    ids = list(itertools.product(*(range(d) for d in g))) if g else [()]
    per_core: list[list[tuple[int, tuple]]] = [[] for _ in cores]
    for i, pid in enumerate(ids):
        ci = core_assignment(i, pid, n_cores) if core_assignment else i % n_cores
        per_core[ci].append((i, tuple(pid)))
    results: dict[int, Any] = {}

    def run_core(c: int, cctx: LaunchContext) -> None:
        prev = _context.set_current(cctx)
        try:
            # single-threaded BLAS for the many small GEMMs; engine arithmetic raises no floating-point warnings
            with _blas.single_threaded(), np.errstate(all="ignore"):
                for i, pid in per_core[c]:
                    cctx.core = cores[c]
                    cctx.program_id = pid
                    cctx.shared_counter = 0
                    results[i] = fn(*w_args, **w_kwargs)
                    _touch_returned(results[i])  # returned tiles live to the kernel's end
                    cores[c].ledger.settle(tgt)
        finally:
            _context.set_current(prev)

    if n_cores == 1:
        run_core(0, ctx)
    else:
        _run_lockstep(ctx, n_cores, run_core)
    result = results.get(0)
    return KernelRun(map_nested(result, _to_host), CostReport.from_cores(tgt, cores))


def _touch_returned(result) -> None:
    if isinstance(result, NkiTensor):
        touch(result.alloc)
    elif isinstance(result, (tuple, list)):
        for r in result:
            _touch_returned(r)
    elif isinstance(result, dict):
        for r in result.values():
            _touch_returned(r)


class _LockStep:
    """Deterministic cooperative scheduling of LNC cores on threads: exactly one core runs at a time and the
    turn passes only when a core finishes or must wait (``core_barrier``, ``sendrecv``), lowest index first."""

    def __init__(self, n: int):
        self.n = n
        self.cv = threading.Condition()
        self.turn = 0
        self.done = [False] * n
        self.waiting: dict[int, Callable[[], bool]] = {}
        self.deadlock: str | None = None
        self.barrier_count = 0
        self.barrier_gen = 0
        self.mailbox: dict = {}

    def _pass(self, i: int) -> None:
        for k in range(1, self.n + 1):
            j = (i + k) % self.n
            if not self.done[j] and (j not in self.waiting or self.waiting[j]()):
                self.turn = j
                self.cv.notify_all()
                return
        if not all(self.done):
            self.deadlock = ("cores " + ", ".join(str(j) for j in sorted(self.waiting))
                             + " wait forever (core_barrier/sendrecv not reached by every core)")
        self.turn = -1
        self.cv.notify_all()

    def start(self, i: int) -> None:
        with self.cv:
            self.cv.wait_for(lambda: self.turn == i or self.deadlock is not None)

    def finish(self, i: int) -> None:
        with self.cv:
            self.done[i] = True
            self._pass(i)

    def wait_until(self, i: int, pred: Callable[[], bool]) -> None:
        with self.cv:
            if pred():
                return
            self.waiting[i] = pred
            self._pass(i)
            self.cv.wait_for(lambda: self.turn == i or self.deadlock is not None)
            self.waiting.pop(i, None)
            if self.deadlock is not None and self.turn != i:
                raise NkiError(f"LNC deadlock: {self.deadlock}", code="err_deadlock")

    def barrier(self, i: int) -> None:
        with self.cv:
            gen = self.barrier_gen
            self.barrier_count += 1
            if self.barrier_count == self.n:
                self.barrier_count = 0
                self.barrier_gen += 1
        self.wait_until(i, lambda: self.barrier_gen > gen)


def _run_lockstep(ctx: LaunchContext, n_cores: int, run_core: Callable) -> None:
    sched = _LockStep(n_cores)
    errors: list[tuple[int, BaseException]] = []

    def body(c: int) -> None:
        cctx = dataclasses.replace(ctx, extra=dict(ctx.extra))
        cctx.extra["core_barrier"] = lambda: sched.barrier(c)
        cctx.extra["lnc_sched"] = sched
        cctx.extra["lnc_core"] = c
        sched.start(c)
        try:
            if sched.deadlock is None:
                run_core(c, cctx)
        except BaseException as e:  # re-raised in the caller's thread
            errors.append((c, e))
        finally:
            sched.finish(c)

    threads = [threading.Thread(target=body, args=(c,), name=f"nki-core{c}") for c in range(n_cores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0][1]
    if sched.deadlock:
        raise NkiError(f"LNC deadlock: {sched.deadlock}", code="err_deadlock")


# -- framework adapters --------------------------------------------------------------------------------------
_FRAMEWORKS: list[tuple[str, Callable[[Any], bool], Callable]] = []


def register_framework(name: str, predicate: Callable[[Any], bool], runner: Callable) -> None:
    """Route kernel calls whose arguments satisfy ``predicate`` to ``runner(kernel, grid, args, kwargs)``.

    The PyTorch integration registers here (``torch.Tensor`` arguments); the core stays torch-free.
    """
    _FRAMEWORKS[:] = [f for f in _FRAMEWORKS if f[0] != name]
    _FRAMEWORKS.insert(0, (name, predicate, runner))


# top-level module of an argument's type -> the integration that registers its framework (imported on first use)
_INTEGRATIONS = {"torch": "nki.torch"}


def _framework_for(args, kwargs):
    vals = list(args) + list(kwargs.values())
    for v in vals:
        integration = _INTEGRATIONS.get(type(v).__module__.partition(".")[0])
        if integration is not None and integration not in sys.modules:
            importlib.import_module(integration)
    for name, pred, runner in _FRAMEWORKS:
        if any(pred(v) for v in vals):
            return name, runner
    return None, None


def _is_foreign_array(v) -> bool:
    return not isinstance(v, np.ndarray) and hasattr(v, "__dlpack__") and hasattr(v, "shape")


def _dlpack_fallback(kernel: Kernel, args, kwargs):
    """NKI_SIMULATOR=1 with CPU tensors of another framework: zero-copy via DLPack, outputs converted back."""
    def conv(v):
        return np.from_dlpack(v) if _is_foreign_array(v) else v

    sample = next(v for v in list(args) + list(kwargs.values()) if _is_foreign_array(v))
    mod = sys.modules.get(type(sample).__module__.split(".")[0])
    run = kernel.run(*(conv(a) for a in args), **{k: conv(v) for k, v in kwargs.items()})
    from_numpy = getattr(mod, "from_numpy", None) or getattr(mod, "asarray", None)

    def back(x):
        if isinstance(x, np.ndarray) and from_numpy is not None:
            return from_numpy(x)
        if isinstance(x, (tuple, list)):
            return type(x)(back(v) for v in x)
        return x

    return back(run.outputs)


class Kernel:
    """An ``@nki.jit`` kernel; ``kernel[grid]`` binds a launch grid, calling it runs the simulator."""

    def __init__(self, fn: Callable, grid=(), **options):
        self.fn = fn
        self.grid = grid
        self.options = options
        self.last_run: KernelRun | None = None
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid) -> Kernel:
        k = Kernel(self.fn, grid, **self.options)
        return k

    def run(self, *args, **kwargs) -> KernelRun:
        """Simulate on NumPy arrays and return :class:`KernelRun` (outputs + simulated cost)."""
        run = run_kernel(self.fn, args, kwargs, grid=self.grid, **{k: v for k, v in self.options.items()
                                                                      if k in ("target", "precise", "lnc")})
        self.last_run = run
        return run

    def __call__(self, *args, **kwargs):
        if _context.current() is not None:  # a kernel called from a running kernel is inlined (sub-kernel)
            return self.fn(*args, **kwargs)
        _, runner = _framework_for(args, kwargs)
        if runner is not None:
            return runner(self, self.grid, args, kwargs)
        if any(_is_foreign_array(v) for v in list(args) + list(kwargs.values())):
            if envvars.SIMULATOR.read():
                return _dlpack_fallback(self, args, kwargs)
            raise NkiError("no NKI framework integration is registered for argument types "
                           f"{sorted({type(v).__name__ for v in args})}; pass NumPy arrays, set NKI_SIMULATOR=1, or "
                           "install the neuron-nki PyTorch integration")
        # NumPy arguments: there is no device, so this is always the simulator.
        return self.run(*args, **kwargs).outputs

    def __repr__(self) -> str:
        return f"<nki.jit kernel {getattr(self.fn, '__name__', self.fn)} grid={self.grid}>"


def jit(fn: Callable | None = None, **kwargs):
    """Decorate an NKI kernel. ``platform_target=`` is an error (use ``NEURON_PLATFORM_TARGET_OVERRIDE``);
    ``mode=`` is accepted and ignored (deprecated in NKI 0.3)."""
    if "platform_target" in kwargs:
        raise TypeError("nki.jit(platform_target=...) is not supported since NKI 0.3.0; set "
                        "NEURON_PLATFORM_TARGET_OVERRIDE=trn1|trn2|trn3 instead")
    kwargs.pop("mode", None)
    kwargs.pop("kernel_return", None)
    kwargs.pop("debug_kernel", None)
    kwargs.pop("show_compiler_tb", None)

    def deco(f):
        return f if isinstance(f, Kernel) else Kernel(f, **kwargs)

    return deco(fn) if fn is not None else deco


def simulate(kernel) -> Callable:
    """``nki.simulate(kernel)(*arrays)``: run on the CPU simulator, NumPy in → NumPy out.

    ``kernel`` may be an ``@nki.jit`` kernel (optionally with a grid, ``kernel[2]``) or a plain function.
    """
    k = kernel if isinstance(kernel, Kernel) else Kernel(kernel)

    def call(*args, **kwargs):
        return k.run(*args, **kwargs).outputs

    call.kernel = k
    return call


def _materialize(v, rng: np.random.Generator):
    """A type placeholder argument (``nt.tensor[[8192, 4096], nl.bfloat16]``) becomes an input of that type."""
    make = getattr(v, "__nki_placeholder__", None)
    return make(rng) if make is not None else v


class _Benchmarked:
    def __init__(self, kernel: Kernel, warmup: int, iters: int):
        self.kernel = kernel
        self.warmup, self.iters = warmup, iters
        self.benchmark_result: CostReport | None = None

    def __getitem__(self, grid):
        return _Benchmarked(self.kernel[grid], self.warmup, self.iters)

    def __call__(self, *args, **kwargs):
        rng = np.random.default_rng(0)
        args = tuple(_materialize(a, rng) for a in args)
        kwargs = {k: _materialize(v, rng) for k, v in kwargs.items()}
        run = self.kernel.run(*args, **kwargs)
        self.benchmark_result = run.cost  # simulated: one deterministic estimate, no hardware timing
        return run.outputs


def benchmark(kernel=None, warmup: int = 10, iters: int = 100, **kwargs):
    """Run once in the simulator and expose ``.benchmark_result`` (a simulated :class:`CostReport` with
    ``nc_latency.get_latency_percentile(p)`` in µs, like the legacy ``nki.benchmark``). Arguments may be type
    placeholders (``nt.tensor[[8192, 4096], nl.bfloat16]``): inputs of that shape and dtype are generated."""
    def deco(f):
        return _Benchmarked(f if isinstance(f, Kernel) else Kernel(f), warmup, iters)

    return deco(kernel) if kernel is not None else deco
