"""The callable the backend hands Dynamo: auto-copies CPU inputs to `neuron`, runs the compiled graph, and charges
the simulated device timeline once per graph execution with the summed time of its fused kernels (the backward
kernels are charged when autograd runs the graph's backward).

The graph's intermediates live in host buffers Inductor allocates, which the device allocator never sees; each run
therefore takes the plan's workspace (`KernelPlan.workspace_bytes`) from the device allocator while the graph runs,
so `max_memory_allocated` and out-of-memory account for them as in eager mode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from neuron_device import services

from .compiler import to_neuron

__all__ = ["CompiledGraph"]


class CompiledGraph:
    """A compiled (or, with fallback execution, eager) graph plus its run-time contract."""

    __slots__ = ("autocopy", "backward_seconds", "backward_workspace", "fn", "forward_seconds", "forward_workspace",
                 "index")

    def __init__(
        self,
        fn: Callable,
        *,
        autocopy: bool,
        index: int,
        forward_seconds: float,
        backward_seconds: float,
        forward_workspace: int = 0,
        backward_workspace: int = 0,
    ) -> None:
        self.fn = fn
        self.autocopy = autocopy
        self.index = index
        self.forward_seconds = forward_seconds
        self.backward_seconds = backward_seconds
        self.forward_workspace = forward_workspace
        self.backward_workspace = backward_workspace

    def _charge_backward(self, grad_outputs: Any) -> None:
        if self.backward_seconds:
            services.charge(self.index, self.backward_seconds, "neuron_compile::graph_backward")
        if self.backward_workspace:  # the backward graph runs right after this hook: its peak, checked now
            device = services.device_allocator(self.index)
            device.free(device.malloc(self.backward_workspace))

    def __call__(self, *args: Any) -> Any:
        if self.autocopy:
            args = tuple(to_neuron(args))
        if self.forward_workspace:
            device = services.device_allocator(self.index)
            workspace = device.malloc(self.forward_workspace)
            try:
                outputs = self.fn(*args)
            finally:
                device.free(workspace)
        else:
            outputs = self.fn(*args)
        if self.forward_seconds:
            services.charge(self.index, self.forward_seconds, "neuron_compile::graph_forward")
        if self.backward_seconds or self.backward_workspace:
            for output in outputs if isinstance(outputs, (list, tuple)) else (outputs,):
                if isinstance(output, torch.Tensor) and output.grad_fn is not None:
                    output.grad_fn.register_prehook(self._charge_backward)
                    break
        return outputs
