"""Compatibility module under AWS TorchNeuron's import name, so code and libraries that probe for `torch_neuronx`
(transformers, accelerate, diffusers) find the `neuron` device. Importing it registers the device.

TorchNeuron's extras live here: op tracking (`get_fallback_ops`, `get_executed_ops`, `clear_op_tracking`), the
kernel compilation cache statistics, `torch_neuronx.metrics`, `NeuronProfiler` (a torch profiler whose trace has
simulated device lanes) and `simulation_report()` (this process's estimated device time, HBM, fallbacks). Like TorchNeuron, it also exposes the stream API
that `torch.neuron` forwards to (`Stream`, `Event`, `stream`, `current_stream`, ..., `synchronize`).
"""

from __future__ import annotations

from typing import Any

import torch  # noqa: F401  (first: importing torch autoloads and registers neuron_device)

import neuron_device
from neuron_device import __version__
from neuron_device.neuron import synchronize
from neuron_device.neuron.streams import Event, Stream, current_stream, default_stream, set_stream, stream
from neuron_device.simulation import kernels as _kernels
from neuron_device.simulation.profiler import NeuronProfiler
from neuron_device.simulation.report import report as simulation_report

__all__ = [
    "Event",
    "NeuronProfiler",
    "Stream",
    "__version__",
    "clear_compilation_cache",
    "clear_op_tracking",
    "current_stream",
    "default_stream",
    "get_compilation_cache_stats",
    "get_executed_ops",
    "get_fallback_ops",
    "set_stream",
    "simulation_report",
    "stream",
    "synchronize",
]

neuron_device.register()


# TorchNeuron names that a sibling wheel provides through the plugin hook `neuron_torch_neuronx_exports`, and the
# package to install when it is missing.
_FROM_PLUGINS = {"nki": "neuron-nki", "nki_op": "neuron-nki", "wrap_nki": "neuron-nki"}


def __getattr__(name: str) -> Any:
    """Names plugins add (TorchNeuron's NKI entry points `nki`, `nki_op`, `wrap_nki` come from neuron-nki)."""
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
    return _kernels.get_fallback_ops()


def get_executed_ops() -> list[str]:
    """Names of the operations executed by Neuron kernels, sorted."""
    return _kernels.get_executed_ops()


def clear_op_tracking() -> None:
    """Clear both the fallback and the executed operation tracking (useful in tests)."""
    _kernels.clear_op_tracking()


def get_compilation_cache_stats() -> dict[str, Any]:
    """Kernel compilation cache statistics: the real device compiles one kernel per op signature (op, input shapes
    and dtypes, non-tensor arguments). Keys as TorchNeuron's: ``total_compilations``, ``in_memory_hits``,
    ``in_memory_misses``, ``total_entries``, ``hit_rate``; plus ``compilations_per_op``."""
    return _kernels.compilation_stats()


def clear_compilation_cache() -> None:
    """Drop every cached kernel and reset the counters: the next call of every signature compiles again."""
    _kernels.clear_compilation_cache()
