"""Adaptive eager's fuser (`neuron_fuse` hook): the host code of a run of queued eager ops.

neuron-device queues fusable eager ops (`neuron_device.adaptive_eager`) and, once a run of them repeats, hands the
run over as an FX graph of ATen ops on CPU tensors; neuron-device prices the fused kernel's simulated device time.
Its host code is the one `NEURON_COMPILE_HOST_CODE` names, "aten" by default: the FX graph itself, calling the
same CPU kernels as eager with no compile at all, which is the cheaper one for the short runs adaptive eager sees
(Inductor's C++ compile of a run costs seconds, which a few hundred calls of saved microseconds never repay).
"inductor" compiles the run with Inductor's C++ backend: fused loops that read the run's inputs once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import envvars

__all__ = ["fuse"]


def fuse(graph_module: torch.fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> Callable[..., Any]:
    """The host code of `graph_module` (called with `example_inputs`-like CPU tensors): see the module doc."""
    if envvars.HOST_CODE.read() == "inductor":
        from torch._inductor.compile_fx import compile_fx

        with torch.no_grad():
            compiled = compile_fx(graph_module, list(example_inputs))
    else:
        compiled = graph_module

    def run(*inputs: torch.Tensor) -> Any:
        with torch.no_grad():
            return compiled(*inputs)

    return run
