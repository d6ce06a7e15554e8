"""The compile pipeline of one graph: AOTAutograd (forward and backward) with the Neuron decomposition table, the
Neuron FX passes on each AOT graph, then Inductor's C++ host codegen for the `neuron` device.

Inputs on the CPU are compiled (and, at run time, copied) as `neuron` tensors: TorchNeuron's auto-copy.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import inductor_device, nki_substitution, passes
from .artifacts import ArtifactWriter
from .decompositions import neuron_decompositions

__all__ = ["compile_graph", "has_cpu_tensor_inputs", "to_neuron"]

_DEVICE = "neuron"


def has_cpu_tensor_inputs(inputs: Sequence[Any]) -> bool:
    """Whether any argument is a CPU tensor (which auto-copy moves to `neuron`)."""
    return any(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in inputs)


def to_neuron(inputs: Sequence[Any]) -> list[Any]:
    """CPU tensors copied to the current `neuron` device (differentiably); everything else unchanged."""
    return [v.to(_DEVICE) if isinstance(v, torch.Tensor) and v.device.type == "cpu" else v for v in inputs]


def _retarget_cpu_devices(gm: torch.fx.GraphModule) -> None:
    """Tensors the graph creates with `device=cpu` follow its inputs to `neuron` (they were traced from CPU inputs)."""
    target = torch.device(_DEVICE, torch.neuron.current_device())
    changed = False
    for node in gm.graph.nodes:
        device = node.kwargs.get("device")
        if isinstance(device, (torch.device, str)) and torch.device(device).type == "cpu":
            node.update_kwarg("device", target)
            changed = True
    if changed:
        gm.recompile()


def _inner_compile(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *args: Any,
    artifacts: ArtifactWriter,
    plans: dict[str, passes.KernelPlan],
    **kwargs: Any,
) -> Any:
    """Neuron FX passes on one AOT graph, then Inductor's codegen for it."""
    from torch._inductor.compile_fx import compile_fx_inner

    stage = "backward" if kwargs.get("is_backward") else ("inference" if kwargs.get("is_inference") else "forward")
    nki_substitution.substitute(gm)
    plans[stage] = passes.plan_kernels(gm)
    artifacts.write_graph(stage, gm)
    compiled = compile_fx_inner(gm, example_inputs, *args, **kwargs)
    artifacts.write_code(stage, getattr(compiled, "source_code", None))
    return compiled


def compile_graph(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    artifacts: ArtifactWriter,
    autocopy: bool,
    plans: dict[str, passes.KernelPlan],
) -> Callable:
    """Compile a Dynamo graph with static shapes to a callable taking the same arguments; `plans` receives the
    kernel plan of each AOT graph compiled ("forward", "backward" or "inference"; none on an AOT cache hit)."""
    from torch._inductor.compile_fx import compile_fx

    inductor_device.register()
    inputs = list(example_inputs)
    if autocopy and has_cpu_tensor_inputs(inputs):
        inputs = to_neuron(inputs)
        _retarget_cpu_devices(gm)
    artifacts.write_graph("dynamo", gm)
    inner = functools.partial(_inner_compile, artifacts=artifacts, plans=plans)
    # The backward graph is compiled now, not at the first backward: failures surface at compile time, and the
    # compile cache and the debug artifacts see both graphs.
    with torch._functorch.config.patch(force_non_lazy_backward_lowering=True):
        return compile_fx(gm, inputs, inner_compile=inner, decompositions=neuron_decompositions())
