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
from neuron_device import optracking as _optracking
from neuron_device.neuron import synchronize
from neuron_device.neuron.streams import Event, Stream, current_stream, default_stream, set_stream, stream
from neuron_device.profiler import NeuronProfiler
from neuron_device.report import report as simulation_report

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


_NKI_EXPORTS = {"nki": "nki", "nki_op": "nki.torch", "wrap_nki": "nki.torch"}


def __getattr__(name: str) -> Any:
    """TorchNeuron's NKI entry points (`nki`, `nki_op`, `wrap_nki`), provided by neuron-nki when it is installed."""
    module = _NKI_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'torch_neuronx' has no attribute {name!r}")
    import importlib

    try:
        import nki.torch  # noqa: F401  (registers the torch adapter of @nki.jit kernels)
    except ImportError as error:
        raise ImportError(f"torch_neuronx.{name} needs the neuron-nki package (pip install neuron-nki)") from error
    found = importlib.import_module(module)
    return found if name == "nki" else getattr(found, name)


def get_fallback_ops() -> list[str]:
    """Names of the operations that fell back to CPU (e.g. ``'aten::linalg_inv_ex.inverse'``), sorted."""
    return _optracking.get_fallback_ops()


def get_executed_ops() -> list[str]:
    """Names of the operations executed by Neuron kernels, sorted."""
    return _optracking.get_executed_ops()


def clear_op_tracking() -> None:
    """Clear both the fallback and the executed operation tracking (useful in tests)."""
    _optracking.clear_op_tracking()


def get_compilation_cache_stats() -> dict[str, Any]:
    """Kernel compilation cache statistics: the real device compiles one kernel per op signature (op, input shapes
    and dtypes, non-tensor arguments). Keys as TorchNeuron's: ``total_compilations``, ``in_memory_hits``,
    ``in_memory_misses``, ``total_entries``, ``hit_rate``; plus ``compilations_per_op``."""
    return _optracking.compilation_stats()


def clear_compilation_cache() -> None:
    """Drop every cached kernel and reset the counters: the next call of every signature compiles again."""
    _optracking.clear_compilation_cache()
