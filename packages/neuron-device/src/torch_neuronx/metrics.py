"""Neuron metrics counters, as TorchNeuron's `torch_neuronx.metrics`.

    import torch_neuronx.metrics as met
    met.get_counter_value("CompilationCache.TotalCompilations")

Counters: ``CompilationCache.TotalCompilations`` (kernels compiled, one per new op signature),
``CompilationCache.InMemoryHits`` (calls that reused a compiled kernel) and ``CompilationCache.InMemoryMisses``.
A counter reads None until its first increment, as in TorchNeuron.
"""

from __future__ import annotations

from neuron_device.simulation import ledger as _ledger

__all__ = ["clear_all", "clear_counters", "get_compilation_metrics", "get_counter_names", "get_counter_value", "report"]

_COUNTERS = {
    "CompilationCache.TotalCompilations": "total_compilations",
    "CompilationCache.InMemoryHits": "in_memory_hits",
    "CompilationCache.InMemoryMisses": "in_memory_misses",
}


def _values() -> dict[str, int]:
    stats = _ledger.compilation_stats()
    return {name: stats[key] for name, key in _COUNTERS.items() if stats[key]}


def get_counter_names() -> list[str]:
    """Names of the counters that have data."""
    return sorted(_values())


def get_counter_value(name: str) -> int | None:
    """Value of counter `name`, or None if it was never incremented."""
    return _values().get(name)


def get_compilation_metrics() -> dict[str, int]:
    """The compilation-related counters that have data."""
    return {name: value for name, value in _values().items() if "Compilation" in name}


def report() -> str:
    """A text report of the counters, one per line."""
    return "".join(f"Counter: {name}\n  Value: {value}\n" for name, value in sorted(_values().items()))


def clear_counters() -> None:
    """Reset all counters (compiled kernels stay cached)."""
    _ledger.clear_compilation_counters()


def clear_all() -> None:
    """Reset all counters and metrics (the simulator keeps counters only)."""
    clear_counters()
