"""neuron-compile's hooks on the device's plugin seam (`neuron_device.plugins`). They run inside `import torch`,
so nothing here imports torch._dynamo or torch._inductor: the device module gets the compile metrics, a lazy
hook through which Inductor's own discovery of a PrivateUse1 backend (`torch.neuron.Scheduling` etc.) registers
`neuron` with Dynamo and Inductor the first time Inductor initialises a graph, and one that marks every Dynamo
compile as compile time once Dynamo is imported (`_after_import`)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
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


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then(module)` once the module `name` is imported (found by the other finders, executed as usual)."""

    def __init__(self, name: str, then: Callable[[Any], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            self.then(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _compile_time(convert_frame: Any) -> None:
    """Every Dynamo compile, any backend's (Inductor's own `torch.compile` of `neuron` tensors too), is compile time
    (`_patches.compile_time_of_every_frame`): applied when Dynamo is first imported, as our backend is not (a plain
    Inductor compile never imports it) and Inductor registers `neuron` only at its code generation, after the
    pattern library it builds on the inputs' device."""
    from neuron_device import services

    from . import _patches

    _patches.compile_time_of_every_frame(services.compiling)


def _after_import(name: str, then: Callable[[Any], None]) -> None:
    if name in sys.modules:
        then(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


@hookimpl
def neuron_device_ready(device_module: Any) -> None:
    """Give `torch.neuron` the compile metrics and Inductor's lazy registration hooks; mark Dynamo's compiles as
    compile time once it is imported."""
    device_module.get_dynamo_metrics = metrics.get_dynamo_metrics
    device_module.reset_dynamo_metrics = metrics.reset_dynamo_metrics
    device_module.__getattr__ = _lazy_inductor_hooks(getattr(device_module, "__getattr__", None))
    _after_import("torch._dynamo.convert_frame", _compile_time)
