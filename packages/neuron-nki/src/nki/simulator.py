"""Public simulator entry points (the NumPy seam for framework adapters and tools)."""

from __future__ import annotations

from ._cost import CostReport
from ._launch import Kernel, KernelRun, register_framework, run_kernel, simulate

__all__ = ["CostReport", "Kernel", "KernelRun", "register_framework", "run_kernel", "simulate", "simulate_kernel"]


def simulate_kernel(kernel, *args, **kwargs):
    """``simulate_kernel(kernel[grid], *arrays)`` → outputs (vLLM-style entry point)."""
    k = kernel if isinstance(kernel, Kernel) else Kernel(kernel)
    return k.run(*args, **kwargs).outputs
