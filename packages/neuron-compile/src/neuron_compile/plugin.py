"""neuron-compile's hooks on the device's plugin seam (`neuron_device.plugins`). They run inside `import torch`,
so nothing here imports torch._dynamo or torch._inductor: the device module gets the compile metrics, and lazy
hooks through which Inductor's own discovery of a PrivateUse1 backend (`torch.neuron.Scheduling` etc.) registers
`neuron` with Inductor the first time a plain `torch.compile` meets a `neuron` tensor."""

from __future__ import annotations

from typing import Any

from neuron_device.plugins import hookimpl

from . import metrics


def _register() -> Any:
    from . import inductor_device

    inductor_device.register()
    return inductor_device


class _LazyScheduling:
    """`torch.neuron.Scheduling`: Inductor calls it with a scheduler to build the kernel scheduling."""

    def __call__(self, scheduler: Any) -> Any:
        from torch._inductor.codegen.cpp import CppScheduling

        _register()
        return CppScheduling(scheduler)


class _LazyWrapper:
    """`torch.neuron.PythonWrapperCodegen`: Inductor calls `.create(...)`."""

    @staticmethod
    def create(*args: Any, **kwargs: Any) -> Any:
        return _register().NeuronWrapperCodegen.create(*args, **kwargs)


class _LazyCppWrapper:
    """`torch.neuron.CppWrapperCodegen`: not built for `neuron` (raises a clear error when used)."""

    @staticmethod
    def create(*args: Any, **kwargs: Any) -> Any:
        return _register().NeuronCppWrapperUnsupported.create(*args, **kwargs)


@hookimpl
def neuron_device_ready(device_module: Any) -> None:
    """Give `torch.neuron` the compile metrics and Inductor's lazy registration hooks."""
    device_module.get_dynamo_metrics = metrics.get_dynamo_metrics
    device_module.reset_dynamo_metrics = metrics.reset_dynamo_metrics
    device_module.Scheduling = _LazyScheduling()
    device_module.PythonWrapperCodegen = _LazyWrapper
    device_module.CppWrapperCodegen = _LazyCppWrapper
