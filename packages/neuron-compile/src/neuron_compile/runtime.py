"""The callable the backend hands Dynamo: auto-copies CPU inputs to `neuron`, runs the compiled graph, and charges
the simulated device timeline once per graph execution with the summed time of its fused kernels (the backward
kernels are charged when autograd runs the graph's backward)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from neuron_device import timeline

from .compiler import to_neuron

__all__ = ["CompiledGraph"]


class CompiledGraph:
    """A compiled (or, with fallback execution, eager) graph plus its run-time contract."""

    __slots__ = ("autocopy", "backward_seconds", "fn", "forward_seconds", "index")

    def __init__(
        self, fn: Callable, *, autocopy: bool, index: int, forward_seconds: float, backward_seconds: float
    ) -> None:
        self.fn = fn
        self.autocopy = autocopy
        self.index = index
        self.forward_seconds = forward_seconds
        self.backward_seconds = backward_seconds

    def _charge_backward(self, grad_outputs: Any) -> None:
        timeline.charge(self.index, self.backward_seconds, "neuron_compile::graph_backward")

    def __call__(self, *args: Any) -> Any:
        if self.autocopy:
            args = tuple(to_neuron(args))
        outputs = self.fn(*args)
        if self.forward_seconds:
            timeline.charge(self.index, self.forward_seconds, "neuron_compile::graph_forward")
        if self.backward_seconds:
            for output in outputs if isinstance(outputs, (list, tuple)) else (outputs,):
                if isinstance(output, torch.Tensor) and output.grad_fn is not None:
                    output.grad_fn.register_prehook(self._charge_backward)
                    break
        return outputs
