"""Teach Dynamo and Inductor the `neuron` device, so `torch.compile` (Inductor, or our `neuron` backend) turns a
`neuron` graph into host C++ kernels.

Device memory is host memory, so Inductor's C++ CPU scheduling is correct for `neuron` buffers as-is. What is ours
is the wrapper: the generated `call()` aliases its `neuron` inputs to host tensors once, allocates intermediates as
plain CPU buffers, calls C++ and extern kernels on host tensors, and hands its outputs back as `neuron` tensors
(`host_runtime`). A compiled graph therefore runs at CPU Inductor speed, with no per-op Python and no per-op device
dispatch. C++-wrapper mode (`cpp_wrapper=True`) and AOTInductor are not supported for `neuron`.

This module imports `torch._dynamo`/`torch._inductor`; it is imported lazily (never during `import torch`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._inductor.codegen.common import register_backend_for_device, register_device_op_overrides
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.cpu_device_op_overrides import CpuDeviceOpOverrides
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.codegen.wrapper_fxir import WrapperFxCodegen

from . import _patches, dynamo_device

__all__ = ["CppScheduling", "NeuronWrapperCodegen", "WrapperFxCodegen", "register"]

DEVICE = _patches.DEVICE


class NeuronWrapperCodegen(PythonWrapperCodegen):
    """Python wrapper whose generated `call()` works on host aliases of its `neuron` inputs (see module doc)."""

    @staticmethod
    def create(is_subgraph: bool, subgraph_name: str | None, parent_wrapper: Any, partition_signatures: Any = None):
        if is_subgraph:
            return SubgraphPythonWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return NeuronWrapperCodegen()

    def write_header(self) -> None:
        super().write_header()
        self.imports.splice(
            "from neuron_compile.host_runtime import to_device as neuron_to_device, to_host as neuron_to_host",
            strip=True,
        )

    def write_args(self, input_names: list[str]) -> None:
        super().write_args(input_names)
        names = ", ".join(input_names) + ("," if len(input_names) == 1 else "")
        self.prefix.writeline(f"neuron_inputs = ({names})")
        self.prefix.writeline("neuron_hosts = neuron_to_host(neuron_inputs)")
        self.prefix.writeline(f"{names} = neuron_hosts")

    def generate_return(self, output_refs: list[str]) -> None:
        if not output_refs:
            self.wrapper_call.writeline("return ()")
            return
        inputs = "neuron_inputs, neuron_hosts" if self.get_graph_input_names() else "(), ()"
        outputs = ", ".join(output_refs) + ","
        self.wrapper_call.writeline(f"return neuron_to_device(({outputs}), {inputs})")

    def make_allocation(self, name, device, dtype, shape, stride, allocation_shape=None, is_pinned=False):
        if device.type == DEVICE:  # intermediates and outputs live in host memory; outputs are adopted on return
            device = torch.device("cpu")
        return super().make_allocation(name, device, dtype, shape, stride, allocation_shape, is_pinned)

    def _generate_kernel_call_helper(self, kernel_name: str, call_args, *, device=None, triton=True, **kwargs):
        if not triton:  # C++ kernels take raw host pointers: call them as on CPU
            self.writeline(self.wrap_kernel_call(kernel_name, call_args))
            return None
        return super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton, **kwargs)


class NeuronCppWrapperUnsupported:
    """Stands in for a C++ wrapper: `cpp_wrapper=True` / AOTInductor are not built for `neuron`."""

    supports_caching = False

    @staticmethod
    def create(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "Inductor's C++ wrapper (cpp_wrapper=True, AOTInductor) is not implemented for the 'neuron' device; "
            "use the default Python wrapper."
        )


@dynamo_device.register_once
def register() -> None:
    """Register `neuron` with Dynamo (`dynamo_device`) and Inductor's code generation (idempotent, thread-safe)."""
    dynamo_device.register()
    register_backend_for_device(DEVICE, CppScheduling, NeuronWrapperCodegen, NeuronCppWrapperUnsupported, WrapperFxCodegen)
    register_device_op_overrides(DEVICE, CpuDeviceOpOverrides())
    _patches.patch_scheduler_host_check()
    _patches.patch_current_backend()
