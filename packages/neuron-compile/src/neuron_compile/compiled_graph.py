"""The callable the backend hands Dynamo: auto-copies CPU inputs to `neuron` (and, with
`TORCH_NEURONX_RETAIN_DEVICE_MODE=1`, brings outputs and in-place changes back to the CPU), runs the compiled graph, and charges
the simulated device timeline once per graph execution with the summed time of its fused kernels (the backward
kernels are charged when autograd runs the graph's backward; activation checkpointing's rerun of the forward in the
backward is an execution too, also when checkpointing stops it early).

The graph's intermediates live in host buffers Inductor allocates, which the device allocator never sees; each run
therefore takes the plan's workspace (`KernelPlan.workspace_bytes`) from the device allocator while the graph runs,
so `max_memory_allocated` and out-of-memory account for them as in eager mode (a plan names the workspace and the
line that called the graph when it goes past the HBM: `services.allocating_from`; what the graph returns, outputs
and a training forward's saved activations, is charged buffer by buffer: `host_runtime`). The graph's constants (the frozen
weights' folded copies, `KernelPlan.constant_bytes`) are taken once, when the graph is made, and given back when it
is collected, as the runtime loads a compiled graph's constants with it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import _StopRecomputationError

from neuron_device import services

from . import envvars
from .compiler import to_neuron

__all__ = ["CompiledGraph"]


class CompiledGraph:
    """A compiled (or, with fallback execution, eager) graph plus its run-time contract."""

    __slots__ = ("__weakref__", "autocopy", "backward_parts", "backward_seconds", "backward_workspace", "fn",
                 "forward_parts", "forward_seconds", "forward_workspace", "index", "retain_device")

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
        retain_device: bool = False,
        forward_parts: dict[str, float] | None = None,
        backward_parts: dict[str, float] | None = None,
        constant_bytes: int = 0,
    ) -> None:
        if constant_bytes:
            device = services.device_allocator(index)
            with services.allocating_from("neuron_compile::graph_constants", None):
                weakref.finalize(self, device.free, device.malloc(constant_bytes))
        self.fn = fn
        self.autocopy = autocopy
        self.index = index
        self.forward_seconds = forward_seconds
        self.backward_seconds = backward_seconds
        self.forward_workspace = forward_workspace
        self.backward_workspace = backward_workspace
        self.retain_device = retain_device
        self.forward_parts = forward_parts  # the seconds split by what the kernels do (a planned step's breakdown)
        self.backward_parts = backward_parts

    def _charge_backward(self, grad_outputs: Any) -> None:
        if self.backward_seconds:
            services.charge(self.index, self.backward_seconds, "neuron_compile::graph_backward", self.backward_parts)
        if self.backward_workspace:  # the backward graph runs right after this hook: its peak, checked now
            device = services.device_allocator(self.index)
            with services.allocating_from("neuron_compile::graph_backward_workspace", None):
                device.free(device.malloc(self.backward_workspace))

    def __call__(self, *args: Any) -> Any:
        if self.autocopy and self.retain_device:
            return self._call_retaining_device(args)
        return self._run(tuple(to_neuron(args)) if self.autocopy else args)

    def _call_retaining_device(self, args: tuple) -> Any:
        """TORCH_NEURONX_RETAIN_DEVICE_MODE=1: CPU inputs give CPU outputs, as TorchNeuron's executor does; an
        input the graph changed in place gets the change back, and an output that is such an input is the input."""
        devices = sorted({a.device.type for a in args if isinstance(a, torch.Tensor)})
        if len(devices) > 1:
            raise RuntimeError(f"cannot mix input devices with {envvars.RETAIN_DEVICE.name}=1, got "
                               f"{' and '.join(devices)}")
        copies = to_neuron(args)
        copied = [(a, c) for a, c in zip(args, copies) if isinstance(c, torch.Tensor) and c is not a]
        outputs = self._run(tuple(copies))
        back = {}  # id of a changed neuron copy -> its CPU input
        for original, copy in copied:
            # compared by value: the graph writes through a host alias of the copy, whose version counter is its own
            changed = copy.detach().cpu()
            if not torch.equal(changed, original.detach()):
                with torch.no_grad():
                    original.copy_(changed)
                back[id(copy)] = original

        def to_cpu(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            original = back.get(id(value))
            if original is not None:
                return original
            return value.cpu() if value.device.type != "cpu" else value

        if isinstance(outputs, (list, tuple)):
            return type(outputs)(to_cpu(v) for v in outputs)
        return to_cpu(outputs)

    def _charge_forward(self) -> None:
        if self.forward_seconds:
            services.charge(self.index, self.forward_seconds, "neuron_compile::graph_forward", self.forward_parts)

    def _run(self, args: tuple) -> Any:
        try:
            with services.running_host_code(self.index):  # the collectives it traced are charged to its device
                if self.forward_workspace:
                    device = services.device_allocator(self.index)
                    with services.allocating_from("neuron_compile::graph_forward_workspace", None):
                        workspace = device.malloc(self.forward_workspace)
                    try:
                        outputs = self.fn(*args)
                    finally:
                        device.free(workspace)
                else:
                    outputs = self.fn(*args)
        except _StopRecomputationError:
            # Non-reentrant activation checkpointing reruns the graph in the backward and stops the rerun once the
            # last tensor it needs is saved: from the pack hook of the graph's `save_for_backward`, after the
            # forward graph ran. The recompute's work was done; uncharged, a checkpointed compiled block's
            # recompute was free (issue #34).
            self._charge_forward()
            raise
        self._charge_forward()
        if self.backward_seconds or self.backward_workspace:
            for output in outputs if isinstance(outputs, (list, tuple)) else (outputs,):
                if isinstance(output, torch.Tensor) and output.grad_fn is not None:
                    output.grad_fn.register_prehook(self._charge_backward)
                    break
        return outputs
