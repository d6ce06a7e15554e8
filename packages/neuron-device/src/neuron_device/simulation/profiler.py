"""`NeuronProfiler`: torch.profiler plus simulated device lanes in the exported Chrome/Perfetto trace.

torch 2.13 cannot take device activities from a Python backend: a `torch.profiler.profile` with
``ProfilerActivity.PrivateUse1`` records CPU events only. So while a `NeuronProfiler` is recording, every charge to a
device timeline (ops, host copies, NKI kernels, compiled graphs, collectives) is recorded here with its simulated
start and end and the wall-clock time of its launch; `export_chrome_trace` writes torch's trace and adds:

* one process per device (``neuron:<i> (simulated <target>)``) with one thread lane per stream (``stream <id>``)
  holding every device event, and one lane per engine where known (``engine: tensor``, ``vector``, ``dma``, ...,
  ``collective``, ``compiled graph``, ``host (CPU fallback)``) holding the same events split by what ran them;
* ``process_name`` / ``thread_name`` / ``*_sort_index`` metadata events naming those lanes.

Alignment: a device event starts at the wall-clock time of the CPU op that launched it (the same clock and base,
``baseTimeNanoseconds``, as torch's CPU events), or when the previous event of its lane ends if that is later, as a
queue on a real device would. Its duration is the simulated device time. Simulated start and end, in the device's
own simulated clock, are in the event's ``args``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

import torch
from torch.profiler import ProfilerActivity

from .. import timeline as _timeline
from .. import topology as _topology
from ..ops import call as _call

__all__ = ["DEVICE_PID_BASE", "NeuronProfiler", "device_trace_events"]

DEVICE_PID_BASE = 1_000_000  # pid of neuron:<i>'s lanes is DEVICE_PID_BASE + i (clear of real process ids)
_ENGINE_TID_BASE = 1_000  # engine lanes follow the stream lanes
_ENGINE_ORDER = ("tensor", "vector", "scalar", "gpsimd", "dma", "collective", "compiled graph", "host (CPU fallback)")

# (name, device, stream, simulated start, simulated end, wall-clock ns at launch)
_Record = tuple[str, int, int, float, float, int]


def _engine_of(name: str, engines: dict[str, str | None]) -> str | None:
    """What ran a device event, where the simulator knows it."""
    if name.startswith("c10d::"):
        return "collective"
    if name.startswith("neuron_compile::"):
        return "compiled graph"
    if name.endswith("->device)") or name.endswith("->host)"):
        return "dma"
    if name in engines:
        return engines[name] or "host (CPU fallback)"
    return None


def device_trace_events(records: Iterable[_Record], base_ns: int) -> list[dict[str, Any]]:
    """Chrome trace events (lanes and their metadata) of the recorded device work; `base_ns` is the trace's
    ``baseTimeNanoseconds`` (timestamps are microseconds after it)."""
    engines = {record.name: record.info.engine for record in list(_call.records.values())}
    target = _topology.topology().target.name
    events: list[dict[str, Any]] = []
    lanes: dict[tuple[int, int], str] = {}
    lane_end: dict[tuple[int, int], float] = {}

    def place(pid: int, tid: int, label: str, name: str, ts: float, dur: float, args: dict[str, Any]) -> None:
        lanes[(pid, tid)] = label
        start = max(ts, lane_end.get((pid, tid), ts))
        lane_end[(pid, tid)] = start + dur
        events.append({"ph": "X", "cat": "neuron_device", "name": name, "pid": pid, "tid": tid, "ts": start,
                       "dur": dur, "args": args})

    for name, index, stream, start, end, wall_ns in records:
        pid = DEVICE_PID_BASE + index
        launched = (wall_ns - base_ns) / 1e3
        dur = (end - start) * 1e6
        engine = _engine_of(name, engines)
        args = {"simulated_start_us": start * 1e6, "simulated_end_us": end * 1e6, "launched_at_us": launched,
                "stream": stream, "engine": engine or "unknown"}
        place(pid, stream, f"stream {stream}", name, launched, dur, args)
        if engine is not None:
            place(pid, _ENGINE_TID_BASE + _ENGINE_ORDER.index(engine), f"engine: {engine}", name, launched, dur, args)
    metadata: list[dict[str, Any]] = []
    for pid in sorted({pid for pid, _ in lanes}):
        index = pid - DEVICE_PID_BASE
        metadata += [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                      "args": {"name": f"neuron:{index} (simulated {target})"}},
                     {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
    for (pid, tid), label in sorted(lanes.items()):
        metadata += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": label}},
                     {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}]
    return metadata + events


class NeuronProfiler(torch.profiler.profile):
    """`torch.profiler.profile` (same arguments; activities default to CPU and PrivateUse1) whose Chrome trace also
    has the simulated device lanes of `neuron` (see the module docstring)."""

    def __init__(self, *, activities: Iterable[ProfilerActivity] | None = None, **kwargs: Any) -> None:
        activities = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1] if activities is None else activities
        super().__init__(activities=activities, **kwargs)
        self.device_records: list[_Record] = []
        self._previous: _timeline.Recorder | None = None

    def _record(self, name: str, index: int, stream: int, start: float, end: float, part: _timeline.Part) -> None:
        self.device_records.append((name, index, stream, start, end, time.time_ns()))
        if self._previous is not None:  # an enclosing profiler (or a planner) keeps recording
            self._previous(name, index, stream, start, end, part)

    def start_trace(self) -> None:
        self.device_records = []
        self._previous = _timeline.set_recorder(self._record)
        super().start_trace()

    def stop_trace(self) -> None:
        super().stop_trace()
        _timeline.set_recorder(self._previous)

    def export_chrome_trace(self, path: str) -> None:
        """Write torch's Chrome trace to `path`, with the device lanes merged in (`path` may end in ``.gz``)."""
        super().export_chrome_trace(path)
        opener = _gzip_open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as file:
            trace = json.load(file)
        base_ns = int(trace.get("baseTimeNanoseconds", 0))
        trace["traceEvents"].extend(device_trace_events(self.device_records, base_ns))
        with opener(path, "wt", encoding="utf-8") as file:
            json.dump(trace, file)


def _gzip_open(path: str, mode: str, encoding: str):
    import gzip

    return gzip.open(path, mode, encoding=encoding)
