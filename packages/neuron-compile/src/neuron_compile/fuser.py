"""Adaptive eager's fuser (`neuron_fuse` hook): the host code of a run of queued eager ops.

neuron-device queues fusable eager ops (`neuron_device.adaptive_eager`) and, once a run of them repeats, hands the
run over as an FX graph of ATen ops on CPU tensors; neuron-device prices the fused kernel's simulated device time.
Its host code is the one `NEURON_COMPILE_HOST_CODE` names, "aten" by default: the FX graph itself, calling the
same CPU kernels as eager with no compile at all, which is the cheaper one for the short runs adaptive eager sees
(Inductor's C++ compile of a run costs seconds, which a few hundred calls of saved microseconds never repay); its
code calls each op's C function by one global name (`_direct_calls`), not through `torch.ops`, and reads a
permuted result as eager's kernel laid it out instead of copying it first (`_without_relayouts`).
"inductor" compiles the run with Inductor's C++ backend: fused loops that read the run's inputs once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from neuron_device import services

from . import envvars

__all__ = ["fuse"]


def fuse(graph_module: torch.fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> Callable[..., Any]:
    """The host code of `graph_module` (called with `example_inputs`-like CPU tensors): see the module doc."""
    if envvars.HOST_CODE.read() == "inductor":
        from torch._inductor.compile_fx import compile_fx

        with torch.no_grad():
            compiled = compile_fx(graph_module, list(example_inputs))
    else:
        compiled = _direct_calls(_without_relayouts(graph_module))

    call = compiled.forward if isinstance(compiled, torch.fx.GraphModule) else compiled  # no `Module.__call__`

    def run(*inputs: torch.Tensor) -> Any:
        with torch.no_grad():
            return call(*inputs)

    return run


def _without_relayouts(graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`graph_module` without its relayout clones (`services.FUSE_RELAYOUT`) and their permutes: the aten host code
    runs eager's CPU kernels, whose results already have the layout the views were recorded on, so the copy (a
    tiny-Llama layer's key, 128 KiB) only cost time (about 25 us a forward, net of the slower copy that follows)."""
    graph = graph_module.graph
    for node in list(graph.nodes):
        if node.meta.get(services.FUSE_RELAYOUT):
            permute = node.args[0]
            node.replace_all_uses_with(permute.args[0])
            graph.erase_node(node)
            if not permute.users:
                graph.erase_node(permute)
    return graph_module


def _direct_calls(graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`graph_module` with each ATen op called as its C callable, named by one global: `torch.as_strided` for the
    views (the same op, 2 us of 3.5 less per call than through its `OpOverload`), `_kernel` for the others. FX would
    call `torch.ops.aten.<op>.<overload>`: a chain of four attribute lookups and `OpOverload.__call__`'s Python frame
    per node, about 5 us per node inside a run, whose CPU kernels have evicted the host's caches (0.58 ms of the
    tiny Llama forward's 118 nodes)."""
    as_strided = torch.ops.aten.as_strided.default
    changed = False
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        node.target = torch.as_strided if node.target is as_strided else _kernel(node.target)
        changed = True
    if changed:
        graph_module.recompile()
    return graph_module


_kernels: dict[torch._ops.OpOverload, Any] = {}


def _kernel(op: torch._ops.OpOverload) -> Any:
    """A callable that is `op._op` (what `OpOverload.__call__` calls), as FX can name it: an instance of a class whose
    `__call__` is that C function, so a call runs no Python frame, and whose module is not torch's, so FX's code
    refers to it by one global instead of its `torch.ops` path."""
    kernel = _kernels.get(op)
    if kernel is None:
        name = f"{op._opname}_{op._overloadname}"
        namespace = {"__slots__": (), "__call__": staticmethod(op._op), "__name__": name, "__module__": __name__}
        kernel = _kernels[op] = type(name, (), namespace)()
    return kernel
