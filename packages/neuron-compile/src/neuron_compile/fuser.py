"""Adaptive eager's fuser (`neuron_fuse` hook): the host code of a run of queued eager ops.

neuron-device queues fusable eager ops (`neuron_device.adaptive_eager`) and, once a run of them repeats, hands the
run over as an FX graph of ATen ops on CPU tensors; neuron-device prices the fused kernel's simulated device time.
Its host code is the one `NEURON_COMPILE_HOST_CODE` names, "aten" by default: the FX graph itself, calling the
same CPU kernels as eager with no compile at all, which is the cheaper one for the short runs adaptive eager sees
(Inductor's C++ compile of a run costs seconds, which a few hundred calls of saved microseconds never repay); its
views call `torch.as_strided`, the same ATen op without `OpOverload`'s Python call (`_direct_views`).
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
        compiled = _direct_views(graph_module)

    def run(*inputs: torch.Tensor) -> Any:
        with torch.no_grad():
            return compiled(*inputs)

    return run


def _direct_views(graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`graph_module` with its `aten.as_strided` calls made through `torch.as_strided`: the same op, minus the
    `OpOverload` frame and the schema-driven parsing of its arguments (2 us of 3.5 per view; adaptive eager's runs
    read a view of a queued result for every linear layer's input and output and every reshape)."""
    as_strided = torch.ops.aten.as_strided.default
    nodes = [n for n in graph_module.graph.nodes if n.op == "call_function" and n.target is as_strided]
    for node in nodes:
        node.target = torch.as_strided
    if nodes:
        graph_module.recompile()
    return graph_module
