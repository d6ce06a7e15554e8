"""Compile metrics: TorchNeuron's per-graph records behind `torch.neuron.get_dynamo_metrics()` /
`reset_dynamo_metrics()`, its metric tables (CSV files written at exit), and our event counters.

* `get_dynamo_metrics()` returns one `NeuronCompilationMetrics` per compiled graph, in TorchNeuron's shape: graph id
  (the compile-cache key), name, model name, whether it has collectives, FX node count, timestamp, and the phase
  timings in microseconds (`torch_neuronx_fx_passes_us`: the Neuron FX passes; `torch_neuronx_lower_us`: lowering
  to host code; `torch_neuronx_compile_us`: the whole compile of the graph). Timings are host wall time.
* `TORCH_NEURONX_ENABLED_METRIC_TABLES=graph_stats` writes those records at exit to
  `$TORCH_NEURONX_METRICS_DIR/metric_table_graph_stats_rank{RANK}.csv` (default directory `/tmp`), one file per rank;
  `TORCH_NEURONX_METRICS_ENABLED=0` records nothing.
* `counters()`: compilations, recompilations, compile-cache hits/misses, fallbacks, failures, compile seconds (the
  simulation report shows them). A *recompilation* is a compilation of a frame that had already been compiled: with
  static shapes, every new input shape is one.
"""

from __future__ import annotations

import atexit
import contextlib
import csv
import dataclasses
import datetime
import os
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from . import envvars

__all__ = [
    "METRIC_TABLES",
    "NeuronCompilationMetrics",
    "counters",
    "get_dynamo_metrics",
    "graph",
    "now",
    "phase",
    "record",
    "reset_dynamo_metrics",
    "write_metric_tables",
]



@dataclasses.dataclass
class NeuronCompilationMetrics(Mapping[str, Any]):
    """One compiled graph, as TorchNeuron records it (field names are TorchNeuron's). TorchNeuron documents the
    records as dicts (`r["graph_id"]`): a record is a read-only mapping of its fields, and keeps attribute access."""

    graph_id: str
    graph_name: str = ""
    model_name: str = ""
    has_collectives: bool = False
    graph_node_count: int = 0
    timestamp: str = ""
    torch_neuronx_fx_passes_us: int = 0
    torch_neuronx_lower_us: int = 0
    torch_neuronx_compile_us: int = 0

    def __getitem__(self, field: str) -> Any:
        if field not in self.__dataclass_fields__:
            raise KeyError(field)
        return getattr(self, field)

    def __iter__(self) -> Iterator[str]:
        return iter(self.__dataclass_fields__)

    def __len__(self) -> int:
        return len(self.__dataclass_fields__)


METRIC_TABLES: dict[str, list[str]] = {"graph_stats": [f.name for f in dataclasses.fields(NeuronCompilationMetrics)]}

_FIELDS = ("compilations", "recompilations", "cache_hits", "cache_misses", "fallbacks", "failures")
_lock = threading.Lock()
_counts: dict[str, int] = dict.fromkeys(_FIELDS, 0)
_compile_seconds = 0.0
_graphs: list[NeuronCompilationMetrics] = []
_current = threading.local()  # .record: the graph being compiled on this thread


def record(field: str, amount: int = 1, seconds: float = 0.0) -> None:
    """Count an event (one of `_FIELDS`) and add compile wall time."""
    global _compile_seconds
    if field not in _counts:
        raise KeyError(f"unknown compile metric {field!r}; metrics are {_FIELDS}")
    with _lock:
        _counts[field] += amount
        _compile_seconds += seconds


def counters() -> dict[str, Any]:
    """Event counts since the last reset, plus total compile wall time in seconds."""
    with _lock:
        return {**_counts, "compile_time_seconds": _compile_seconds}


@contextlib.contextmanager
def graph(metrics: NeuronCompilationMetrics) -> Iterator[NeuronCompilationMetrics]:
    """Time the compile of one graph; its record is kept when the compile ends (failed compiles included, as
    TorchNeuron records a graph before NEFF compilation)."""
    started = time.perf_counter()
    _current.record = metrics
    try:
        yield metrics
    finally:
        _current.record = None
        metrics.torch_neuronx_compile_us = int((time.perf_counter() - started) * 1e6)
        if envvars.METRICS_ENABLED.read():
            with _lock:
                _graphs.append(metrics)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Add the time of a compile phase (`fx_passes` or `lower`) to the graph being compiled on this thread."""
    started = time.perf_counter()
    try:
        yield
    finally:
        metrics = getattr(_current, "record", None)
        if metrics is not None:
            field = f"torch_neuronx_{name}_us"
            setattr(metrics, field, getattr(metrics, field) + int((time.perf_counter() - started) * 1e6))


def now() -> str:
    """The timestamp of a record (UTC, ISO 8601)."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")


def get_dynamo_metrics() -> list[NeuronCompilationMetrics]:
    """Every graph compiled since the last reset, oldest first."""
    with _lock:
        return list(_graphs)


def reset_dynamo_metrics() -> None:
    """Forget the graph records and zero every counter."""
    global _compile_seconds
    with _lock:
        _graphs.clear()
        for field in _FIELDS:
            _counts[field] = 0
        _compile_seconds = 0.0


def _enabled_tables() -> list[str]:
    names = [name.strip() for name in envvars.METRIC_TABLES.read().split(",") if name.strip()]
    unknown = [name for name in names if name not in METRIC_TABLES]
    if unknown:
        raise ValueError(f"{envvars.METRIC_TABLES.name}: metric table(s) {unknown} are not registered; "
                         f"available tables: {sorted(METRIC_TABLES)}")
    return names


def write_metric_tables() -> list[str]:
    """Write the enabled metric tables of this rank as CSV; return the paths written. Run at exit."""
    written = []
    rank = envvars.RANK.read()
    directory = envvars.METRICS_DIR.read()
    for table in _enabled_tables():
        path = os.path.join(directory, f"metric_table_{table}_rank{rank}.csv")
        columns = METRIC_TABLES[table]
        with _lock:
            rows = [[getattr(m, column) for column in columns] for m in _graphs]
        os.makedirs(directory, exist_ok=True)
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(columns)
            writer.writerows(rows)
        written.append(path)
    return written


def _write_at_exit() -> None:
    try:
        write_metric_tables()
    except (OSError, ValueError) as error:  # at exit a raise would only print a traceback: say what went wrong
        warnings.warn(f"neuron-compile: metric tables not written: {error}", RuntimeWarning, stacklevel=1)


atexit.register(_write_at_exit)
