"""Compatibility module under AWS TorchNeuron's import name, so code and libraries that probe for `torch_neuronx`
(transformers, accelerate, diffusers) find the `neuron` device. Importing it registers the device.

TorchNeuron's extras live here: op tracking (`get_fallback_ops`, `get_executed_ops`, `clear_op_tracking`), the
kernel compilation cache statistics, `torch_neuronx.metrics`, `NeuronProfiler` (a torch profiler whose trace has
simulated device lanes) and `simulation_report()` (this process's estimated device time, HBM, fallbacks).

Like TorchNeuron's `torch_neuronx`, it also carries the device functions scripts call on it directly (the
torch-neuronx DDP example calls `torch_neuronx.current_device()`): devices (`device_count`, `current_device`,
`set_device`, `device`, `get_device_properties`, `is_neuron_runtime_initialized`), memory (`empty_cache`,
`memory_stats`, ...), streams (`Stream`, `Event`, `stream`, `current_stream`, ..., `synchronize`) and the compile
metrics (`get_dynamo_metrics`, `reset_dynamo_metrics`, `neuron_dynamo_backend`, from neuron-compile). They are
`torch.neuron`'s own functions, so both names always agree. Not in TorchNeuron: the shape-bucket policy of compiled
serving, `pad_to_buckets` (with `ShapeBuckets`, `powers_of_two`), from neuron-compile.
"""

from __future__ import annotations

from typing import Any

import torch  # noqa: F401  (first: importing torch autoloads and registers neuron_device)

import neuron_device
from neuron_device import __version__
from neuron_device.neuron import (
    StreamContext,
    current_device,
    device,
    device_count,
    empty_cache,
    get_device_properties,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
    set_device,
    synchronize,
)
from neuron_device.neuron import is_initialized as is_neuron_runtime_initialized
from neuron_device.neuron.streams import Event, Stream, current_stream, default_stream, set_stream, stream
from neuron_device.simulation import ledger as _ledger
from neuron_device.simulation.profiler import NeuronProfiler
from neuron_device.simulation.report import report as simulation_report

__all__ = [
    "Event",
    "NeuronProfiler",
    "Stream",
    "StreamContext",
    "__version__",
    "clear_compilation_cache",
    "clear_op_tracking",
    "current_device",
    "current_stream",
    "default_stream",
    "device",
    "device_count",
    "empty_cache",
    "get_compilation_cache_stats",
    "get_device_properties",
    "get_executed_ops",
    "get_fallback_ops",
    "is_neuron_runtime_initialized",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_summary",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "set_device",
    "set_stream",
    "simulation_report",
    "stream",
    "synchronize",
]

neuron_device.register()


# TorchNeuron names that a sibling wheel provides through the plugin hook `neuron_torch_neuronx_exports`, and the
# package to install when it is missing.
_FROM_PLUGINS = {"nki": "neuron-nki", "nki_op": "neuron-nki", "wrap_nki": "neuron-nki",
                 "get_dynamo_metrics": "neuron-compile", "reset_dynamo_metrics": "neuron-compile",
                 "neuron_dynamo_backend": "neuron-compile", "pad_to_buckets": "neuron-compile",
                 "ShapeBuckets": "neuron-compile", "powers_of_two": "neuron-compile"}


def __getattr__(name: str) -> Any:
    """Names plugins add: TorchNeuron's NKI entry points `nki`, `nki_op`, `wrap_nki` come from neuron-nki, the compile
    metrics, `neuron_dynamo_backend` and the shape buckets (`pad_to_buckets`) from neuron-compile."""
    from neuron_device import plugins

    try:
        return plugins.torch_neuronx_export(name)
    except AttributeError:
        pass
    if name in _FROM_PLUGINS:
        raise ImportError(f"torch_neuronx.{name} needs the {_FROM_PLUGINS[name]} package (pip install "
                          f"{_FROM_PLUGINS[name]})")
    raise AttributeError(f"module 'torch_neuronx' has no attribute {name!r}")


def get_fallback_ops() -> list[str]:
    """Names of the operations that fell back to CPU (e.g. ``'aten::linalg_inv_ex.inverse'``), sorted."""
    return _ledger.get_fallback_ops()


def get_executed_ops() -> list[str]:
    """Names of the operations executed by Neuron kernels, sorted."""
    return _ledger.get_executed_ops()


def clear_op_tracking() -> None:
    """Clear both the fallback and the executed operation tracking (useful in tests)."""
    _ledger.clear_op_tracking()


def get_compilation_cache_stats() -> dict[str, Any]:
    """Kernel compilation cache statistics: the real device compiles one kernel per op signature (op, input shapes
    and dtypes, non-tensor arguments). Keys as TorchNeuron's: ``total_compilations``, ``in_memory_hits``,
    ``in_memory_misses``, ``total_entries``, ``hit_rate``; plus ``compilations_per_op``."""
    return _ledger.compilation_stats()


def clear_compilation_cache() -> None:
    """Drop every cached kernel and reset the counters: the next call of every signature compiles again."""
    _ledger.clear_compilation_cache()
