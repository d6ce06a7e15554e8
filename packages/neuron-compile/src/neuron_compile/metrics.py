"""Compile counters behind `torch.neuron.get_dynamo_metrics()` / `reset_dynamo_metrics()` (TorchNeuron's names).

A *compilation* is one graph handed to the backend (or one new static shape of it); a *recompilation* is a
compilation of a frame that had already been compiled: with static shapes, every new input shape is one.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["get_dynamo_metrics", "record", "reset_dynamo_metrics"]

_FIELDS = ("compilations", "recompilations", "cache_hits", "cache_misses", "fallbacks", "failures")
_lock = threading.Lock()
_counts: dict[str, int] = dict.fromkeys(_FIELDS, 0)
_compile_seconds = 0.0


def record(field: str, amount: int = 1, seconds: float = 0.0) -> None:
    """Count an event (one of `_FIELDS`) and add compile wall time."""
    global _compile_seconds
    if field not in _counts:
        raise KeyError(f"unknown compile metric {field!r}; metrics are {_FIELDS}")
    with _lock:
        _counts[field] += amount
        _compile_seconds += seconds


def get_dynamo_metrics() -> dict[str, Any]:
    """Counts since the last reset, plus total compile wall time in seconds."""
    with _lock:
        return {**_counts, "compile_time_seconds": _compile_seconds}


def reset_dynamo_metrics() -> None:
    """Zero every counter."""
    global _compile_seconds
    with _lock:
        for field in _FIELDS:
            _counts[field] = 0
        _compile_seconds = 0.0
