"""neuron-compile's hooks on the device's plugin seam (`neuron_device.plugins`). They run inside `import torch`,
so nothing here imports torch._dynamo or torch._inductor: the device module gets the compile metrics, and a lazy
hook through which Inductor's own discovery of a PrivateUse1 backend (`torch.neuron.Scheduling` etc.) registers
`neuron` with Dynamo and Inductor the first time Inductor initialises a graph."""

from __future__ import annotations

from typing import Any

from neuron_device.services import hookimpl

from . import metrics

# Names Inductor's discovery of a PrivateUse1 backend reads from `torch.neuron` -> what `inductor_device` provides.
_INDUCTOR_HOOKS = {
    "Scheduling": "CppScheduling",
    "PythonWrapperCodegen": "NeuronWrapperCodegen",
    "CppWrapperCodegen": "NeuronCppWrapperUnsupported",
    "WrapperFxCodegen": "WrapperFxCodegen",
}


def _lazy_inductor_hooks(original: Any) -> Any:
    """A module `__getattr__` for `torch.neuron` that registers `neuron` with Dynamo and Inductor on Inductor's first
    look-up (inside its own initialisation, so importing it then is safe) and answers with our classes."""

    def __getattr__(name: str) -> Any:
        if name in _INDUCTOR_HOOKS:
            from . import inductor_device

            inductor_device.register()
            return getattr(inductor_device, _INDUCTOR_HOOKS[name])
        if original is None:
            raise AttributeError(f"module 'torch.neuron' has no attribute {name!r}")
        return original(name)

    return __getattr__


@hookimpl
def neuron_fuse(graph_module: Any, example_inputs: list) -> Any:
    """Adaptive eager hands a repeated run of queued ops over: its host code (`fuser`)."""
    from . import fuser

    return fuser.fuse(graph_module, example_inputs)


@hookimpl
def neuron_report_graphs() -> dict[str, Any]:
    """The compiled-graph counters of the simulation report."""
    return metrics.counters()


@hookimpl
def neuron_torch_neuronx_exports() -> dict[str, Any]:
    """TorchNeuron's compile names on `torch_neuronx`: `get_dynamo_metrics`, `reset_dynamo_metrics` and the helper
    module `neuron_dynamo_backend` (loaded on first access); and the shape-bucket policy (`buckets`:
    `pad_to_buckets`, `ShapeBuckets`, `powers_of_two`), which TorchNeuron does not have."""
    import importlib

    def from_buckets(name: str) -> Any:
        return lambda: getattr(importlib.import_module("neuron_compile.buckets"), name)

    return {
        "get_dynamo_metrics": lambda: metrics.get_dynamo_metrics,
        "reset_dynamo_metrics": lambda: metrics.reset_dynamo_metrics,
        "neuron_dynamo_backend": lambda: importlib.import_module("neuron_compile.dynamo_backend_api"),
        **{name: from_buckets(name) for name in ("pad_to_buckets", "ShapeBuckets", "powers_of_two")},
    }


@hookimpl
def neuron_device_ready(device_module: Any) -> None:
    """Give `torch.neuron` the compile metrics and Inductor's lazy registration hooks."""
    device_module.get_dynamo_metrics = metrics.get_dynamo_metrics
    device_module.reset_dynamo_metrics = metrics.reset_dynamo_metrics
    device_module.__getattr__ = _lazy_inductor_hooks(getattr(device_module, "__getattr__", None))
