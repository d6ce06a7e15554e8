"""Adaptive eager's fuser (`neuron_fuse` hook): compile a run of queued eager ops into one host kernel.

neuron-device queues fusable eager ops (`neuron_device.adaptive_eager`) and, once a run of them repeats, hands the
run over as an FX graph of ATen ops on CPU tensors. Device memory is host memory, so the run is compiled exactly
as a CPU graph with Inductor's C++ backend: the fused loops read the run's inputs once and write only its live
outputs, with no per-op Python. The simulated device time of the fused kernel is priced by neuron-device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["fuse"]


def fuse(graph_module: torch.fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> Callable[..., Any]:
    """Inductor's CPU compilation of `graph_module` (called with `example_inputs`-like CPU tensors)."""
    from torch._inductor.compile_fx import compile_fx

    with torch.no_grad():
        compiled = compile_fx(graph_module, list(example_inputs))

    def run(*inputs: torch.Tensor) -> Any:
        with torch.no_grad():
            return compiled(*inputs)

    return run
