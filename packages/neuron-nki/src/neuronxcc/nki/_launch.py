"""Legacy launch: ``@nki.jit(mode=...)``, SPMD grids with ``nl.spmd_dim``/``nl.nc``, ``simulate_kernel``,
``baremetal``, ``benchmark`` and ``profile`` — all running on the shared core simulator (``nki._launch.run_kernel``).

Differences from the current API, and why:

* storage precision defaults to fp32 ("imprecise"): NKI 0.1's simulator kept fp32 values in bf16 tiles and its
  doc tests compare bf16 outputs to fp32 goldens with default ``np.allclose`` tolerances. ``NKI_PRECISE_FP=1``
  still opts in to exact narrow-float storage;
* kernel arguments become :class:`~neuronxcc.nki._tile.LegacyTile` so ``nl.arange`` indexing and masks work;
* a grid without ``nl.nc`` runs every instance serially on one NeuronCore (the legacy compilation model);
  ``nl.nc``/``nl.spmd_dim`` place instances on cores exactly as the legacy docs' examples describe;
* there is no device: ``baremetal`` and ``benchmark`` run the simulator and report its *simulated* cost
  (``CostReport.simulated`` is always True); ``profile`` writes that report as JSON instead of an NTFF trace;
* kernels run eagerly: every loop iteration executes (the legacy tracer ran a loop body once and compiled it),
  so Python side effects in loops behave like Python. The legacy block-scope rules are still enforced
  (``_scope``), and outputs come back in their declared dtype.
"""

from __future__ import annotations

import inspect
import json
import math
import pathlib
from collections.abc import Callable

import numpy as np

from nki import envvars
from nki import extension as _ext
from nki.extension import (
    Kernel,
    KernelRun,
    NkiError,
    NkiTensor,
    hbm,
    precise_fp_default,
    resolve_target,
    run_kernel,
    wrap_array,
)
from nki.extension import benchmark as _core_benchmark

from ._index import nc, spmd_dim
from ._scope import OutOfScope, instrument
from ._tile import wrap

__all__ = ["LegacyKernel", "baremetal", "benchmark", "jit", "profile", "simulate_kernel", "trace"]

MODES = ("auto", "jax", "torchxla", "baremetal", "benchmark", "simulation", "trace")


def legacy_precise() -> bool:
    """fp32 storage unless ``NKI_PRECISE_FP`` is set explicitly (see module docstring)."""
    return precise_fp_default() if envvars.PRECISE_FP.is_set() else False


def grid_plan(grid) -> tuple[tuple[int, ...], Callable | None, int]:
    """Launch grid → (sizes, core_assignment, number of cores)."""
    if grid is None or grid == ():
        return (), None, 1
    if not isinstance(grid, tuple):
        grid = (grid,)
    sizes, dims = [], []
    for g in grid:
        if isinstance(g, nc):
            g = spmd_dim(g)
        dims.append(g if isinstance(g, spmd_dim) else None)
        sizes.append(int(g.__nki_grid_size__()) if hasattr(g, "__nki_grid_size__") else int(g))
    n_cores = math.prod(d.core_of(0)[1] for d in dims if d is not None)

    def assign(i: int, pid: tuple[int, ...], n: int) -> int:
        core = 0
        for d, p in zip(dims, pid):
            if d is not None:
                c, k = d.core_of(p)
                core = core * k + c
        return core % n

    return tuple(sizes), assign, n_cores


def _is_mutable_annotation(a) -> bool:
    from .typing import mutable_tensor

    return a is mutable_tensor or (isinstance(a, str) and a.split(".")[-1] == "mutable_tensor")


def _returned_arrays(out) -> list[np.ndarray]:
    if isinstance(out, np.ndarray):
        return [out]
    if isinstance(out, (tuple, list)):
        return [a for v in out for a in _returned_arrays(v)]
    if isinstance(out, dict):
        return [a for v in out.values() for a in _returned_arrays(v)]
    return []


def _reject_out_of_scope(x) -> None:
    """Returning a tensor whose block scope ended is the same error as any other use of it."""
    if isinstance(x, OutOfScope):
        x._raise()
    if isinstance(x, (tuple, list)):
        for v in x:
            _reject_out_of_scope(v)


def _dtype_tree(x):
    """Declared dtypes of returned tensors, with the same nesting as the return value."""
    if isinstance(x, NkiTensor):
        return x.dtype
    if isinstance(x, (tuple, list)):
        return type(x)(_dtype_tree(v) for v in x)
    if isinstance(x, dict):
        return {k: _dtype_tree(v) for k, v in x.items()}
    return None


def _as_declared(out, dtypes):
    if isinstance(out, np.ndarray) and isinstance(dtypes, np.dtype):
        return out if out.dtype == dtypes or dtypes.metadata else out.astype(dtypes)
    if isinstance(out, (tuple, list)) and isinstance(dtypes, (tuple, list)):
        return type(out)(_as_declared(o, d) for o, d in zip(out, dtypes))
    if isinstance(out, dict) and isinstance(dtypes, dict):
        return {k: _as_declared(v, dtypes.get(k)) for k, v in out.items()}
    return out


def _mutable_arguments(sig: inspect.Signature, args, kwargs) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``nt.mutable_tensor`` parameters given as arrays: name → (array, copy before the launch)."""
    bound = sig.bind_partial(*args, **kwargs).arguments if sig.parameters else {}
    return {n: (bound[n], bound[n].copy()) for n, p in sig.parameters.items()
            if n in bound and isinstance(bound[n], np.ndarray) and _is_mutable_annotation(p.annotation)}


def _check_mutable_returned(mutable: dict, outputs) -> None:
    """``err_mutable_parameter_not_returned``: a modified mutable parameter must be among the kernel's outputs."""
    returned = _returned_arrays(outputs)
    for n, (a, before) in mutable.items():
        changed = not np.array_equal(before, a, equal_nan=a.dtype.kind in "fc")
        if changed and not any(r is a or np.shares_memory(r, a) for r in returned):
            raise NkiError(f"mutable parameter '{n}' is modified but not returned by the kernel; return it",
                           code="err_mutable_parameter_not_returned")


class LegacyKernel(Kernel):
    """A legacy ``@nki.jit`` kernel; ``kernel[g0, g1, ...]`` binds an SPMD grid, calling it simulates."""

    def __init__(self, fn: Callable, grid=(), mode: str = "auto", **options):
        if mode not in MODES:
            raise ValueError(f"nki.jit mode must be one of {MODES}, got {mode!r}")
        super().__init__(fn, grid, **options)
        self.mode = mode

    def __getitem__(self, grid) -> LegacyKernel:
        return LegacyKernel(self.fn, grid, self.mode, **self.options)

    def checked_fn(self) -> Callable:
        """The kernel function with the legacy scope checks (``_scope``), unless ``check_scopes=False``."""
        return instrument(self.fn) if self.options.get("check_scopes", True) else self.fn

    def run(self, *args, **kwargs) -> KernelRun:
        """Simulate on NumPy arrays; returns outputs and the simulated :class:`~nki.CostReport`."""
        sizes, assign, n_cores = grid_plan(self.grid)
        precise = self.options.get("precise", legacy_precise())
        target = self.options.get("platform_target") or self.options.get("target")
        sig = inspect.signature(self.fn)
        names = list(sig.parameters)

        def as_tensor(v, name):
            return wrap(wrap_array(v, name, precise, hbm)) if isinstance(v, np.ndarray) else v

        w_args = tuple(as_tensor(a, names[i] if i < len(names) else f"arg{i}") for i, a in enumerate(args))
        w_kwargs = {k: as_tensor(v, k) for k, v in kwargs.items()}
        mutable = _mutable_arguments(sig, args, kwargs)
        fn = self.checked_fn()
        declared: list = []

        def kernel(*a, **kw):
            out = fn(*a, **kw)
            _reject_out_of_scope(out)
            if not declared:
                declared.append(_dtype_tree(out))
            return out

        run = run_kernel(kernel, w_args, w_kwargs, grid=sizes, target=resolve_target(target) if target else None,
                         precise=precise, lnc=n_cores, core_assignment=assign)
        if declared:  # fp32-stored narrow floats leave the kernel as their declared dtype
            run = KernelRun(_as_declared(run.outputs, declared[0]), run.cost)
        _check_mutable_returned(mutable, run.outputs)
        self.last_run = run
        return run

    def __call__(self, *args, **kwargs):
        if _ext.current_context() is not None:  # a sub-kernel (``mode='trace'``) called from a kernel runs inline
            if self.grid not in ((), None):
                raise NkiError("Calling a NKI kernel with a SPMD grid from another NKI kernel is not supported",
                               code="err_nested_kernel_with_spmd_grid")
            return self.checked_fn()(*args, **kwargs)
        return super().__call__(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<neuronxcc.nki.jit kernel {getattr(self.fn, '__name__', self.fn)} grid={self.grid} mode={self.mode}>"


def _as_legacy(kernel, mode: str = "auto", **options) -> LegacyKernel:
    if isinstance(kernel, LegacyKernel):
        return kernel
    if isinstance(kernel, Kernel):
        return LegacyKernel(kernel.fn, kernel.grid, mode, **options)
    return LegacyKernel(kernel, (), mode, **options)


def jit(func: Callable | None = None, mode: str = "auto", **kwargs):
    """``@nki.jit`` / ``@nki.jit(mode=...)``: every mode runs in the simulator (there is no device);
    ``mode='benchmark'`` additionally exposes ``.benchmark_result``. ``platform_target='trn1'|'trn2'|'trn3'`` picks
    the simulated NeuronCore."""
    for k in ("kernel_return", "debug_kernel", "show_compiler_tb", "additional_compile_opt", "experimental_flags"):
        kwargs.pop(k, None)

    def deco(f):
        k = LegacyKernel(f.fn if isinstance(f, Kernel) else f, getattr(f, "grid", ()), mode, **kwargs)
        return benchmark(k) if mode == "benchmark" else k

    return deco(func) if func is not None else deco


def trace(func: Callable | None = None, **kwargs):
    """``nki.trace`` (older alias used by legacy doc tests): ``jit(mode='trace')``."""
    return jit(func, mode="trace", **kwargs)


def simulate_kernel(kernel, *args, **kwargs):
    """``nki.simulate_kernel(kernel[grid], *np_arrays)`` → the kernel's outputs as NumPy arrays."""
    return _as_legacy(kernel, "simulation").run(*args, **kwargs).outputs


def baremetal(kernel: Callable | None = None, save_neff_name: str | None = None, save_trace_name: str | None = None,
              additional_compile_opt: str | None = None, artifacts_dir: str | None = None, **kwargs):
    """``nki.baremetal``: no device here, so the kernel runs in the simulator; its simulated cost is on
    ``kernel.last_run.cost`` after each call. No NEFF or trace files are written."""
    def deco(f):
        return _as_legacy(f, "baremetal", **kwargs)

    return deco(kernel) if kernel is not None else deco


def benchmark(kernel: Callable | None = None, warmup: int = 10, iters: int = 100, save_neff_name: str | None = None,
              save_trace_name: str | None = None, additional_compile_opt: str | None = None, **kwargs):
    """``nki.benchmark``: one simulated run; ``f.benchmark_result.nc_latency.get_latency_percentile(p)`` is the
    simulated latency in µs (the same for every percentile: the model is deterministic)."""
    def deco(f):
        return _core_benchmark(_as_legacy(f, "benchmark", **kwargs), warmup=warmup, iters=iters)

    return deco(kernel) if kernel is not None else deco


class _Profiled:
    """``nki.profile`` wrapper: runs the simulator and saves the simulated cost report as JSON."""

    def __init__(self, kernel: LegacyKernel, working_directory, save_trace_name: str, overwrite: bool):
        self.kernel = kernel
        self.working_directory = working_directory
        self.save_trace_name = save_trace_name
        self.overwrite = overwrite
        self.report_path: pathlib.Path | None = None

    def __getitem__(self, grid) -> _Profiled:
        return _Profiled(self.kernel[grid], self.working_directory, self.save_trace_name, self.overwrite)

    def __call__(self, *args, **kwargs):
        run = self.kernel.run(*args, **kwargs)
        if self.working_directory is not None:
            path = pathlib.Path(self.working_directory) / f"{self.save_trace_name}.simulated.json"
            if path.exists() and not self.overwrite:
                raise FileExistsError(f"{path} exists; pass overwrite=True")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(run.cost.to_dict(), indent=2))
            self.report_path = path
        return run.outputs


def profile(func: Callable | None = None, working_directory: str | None = None, save_neff_name: str = "file.neff",
            save_trace_name: str = "profile.ntff", additional_compile_opt: str | None = None, overwrite: bool = False,
            profile_nth: int = 1, **kwargs):
    """``nki.profile``: runs in the simulator and writes ``<working_directory>/<save_trace_name>.simulated.json``
    (the simulated per-engine cost report; no NEFF/NTFF exists without a device)."""
    def deco(f):
        return _Profiled(_as_legacy(f, "auto", **kwargs), working_directory, save_trace_name, overwrite)

    return deco(func) if func is not None else deco
