"""The simulation report: what this process would have done on the chip, built from the runtime's own counters.

``torch_neuronx.simulation_report()`` (or `report`) returns it on demand; ``NEURON_SIM_REPORT=text`` (or ``json``)
prints it to stderr when the process exits, and ``NEURON_SIM_REPORT_FILE=path`` writes it to a file instead.

Sources, and nothing else: device time per stream is `timeline.DeviceTimeline.busy` (every charge: ops, compiled
graphs, collectives, NKI kernels); time per op is calls x seconds per call of each signature in
`ledger.launches()`; peak HBM is the allocator's ``allocated_bytes.all.peak``; fallbacks, kernels compiled per
op signature and graph recompilations are the op ledger's (`ledger`) and (when neuron-compile ran) its dynamo metrics. Time per
op, fallbacks and calls count since the last ``torch_neuronx.clear_op_tracking()``; stream time since start.

Re-estimating for another target reruns the cost model on the work each signature recorded (engine work, HBM
bytes, host copies). Device time recorded as seconds only (NKI kernels, compiled graphs, collectives) cannot be
re-estimated here and is reported separately, at its simulated-target value.
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from typing import Any

from neuron_spec.env import EnvVarError, parse_bool

from .. import allocator as _allocator
from .. import envvars
from .. import plugins as _plugins
from .. import timeline as _timeline
from .. import topology as _topology
from . import ledger as _ledger

__all__ = ["FILE_ENV", "REPORT_ENV", "collect", "format_text", "install_exit_report", "report"]

REPORT_ENV = envvars.REPORT.name
FILE_ENV = envvars.REPORT_FILE.name
_FORMATS = ("text", "json")
TOP_OPS = 15


def _capacity(target: _topology.Target, topo: _topology.Topology) -> int:
    """HBM per device on `target`, at this process's logical-core size when `target` allows it."""
    if target is topo.target:
        return topo.hbm_bytes_per_device
    lnc = topo.lnc if topo.lnc in target.lnc_options else target.default_lnc
    return target.hbm_bytes_per_chip // (target.physical_cores_per_chip // lnc)


def _fit(peak: int, capacity: int) -> str:
    if peak <= capacity:
        return "fits"
    return f"needs {math.ceil(peak / capacity)} cores with FSDP"


def _streams() -> list[dict[str, Any]]:
    rows = []
    for index in sorted(_timeline._timelines):
        line = _timeline._timelines[index]
        for stream_id in sorted(line.busy):
            rows.append({"device": index, "stream": stream_id, "busy_seconds": line.busy[stream_id],
                         "completes_at_seconds": line.clocks.get(stream_id, 0.0)})
    return rows


def _ops(launches: list[_ledger.Launch]) -> list[dict[str, Any]]:
    calls: Counter[str] = Counter()
    seconds: Counter[str] = Counter()
    signatures: Counter[str] = Counter()
    for launch in launches:
        calls[launch.name] += launch.calls
        seconds[launch.name] += launch.calls * launch.seconds
        signatures[launch.name] += 1
    compiled = _ledger.compilation_stats()["compilations_per_op"]
    return [{"name": name, "calls": calls[name], "seconds": seconds[name], "signatures": signatures[name],
             "kernels_compiled": compiled.get(name, 0)}
            for name in sorted(seconds, key=lambda name: (-seconds[name], name))]


def _by_target(launches: list[_ledger.Launch], unattributed: float) -> dict[str, dict[str, float]]:
    recorded = sum(launch.calls * launch.seconds for launch in launches if launch.work is None)
    result = {}
    for name, target in _topology.TARGETS.items():
        estimated = sum(launch.calls * launch.work.seconds(target) for launch in launches if launch.work is not None)
        result[name] = {"ops_seconds": estimated, "not_re_estimated_seconds": recorded + unattributed,
                        "total_seconds": estimated + recorded + unattributed}
    return result


def _memory(topo: _topology.Topology) -> list[dict[str, Any]]:
    rows = []
    for index in sorted(_allocator._devices):
        stats = _allocator._devices[index].stats_as_nested_dict()
        peak = stats["allocated_bytes"]["all"]["peak"]
        fits = {name: _fit(peak, _capacity(target, topo)) for name, target in _topology.TARGETS.items()}
        rows.append({"device": index, "peak_allocated_bytes": peak,
                     "peak_reserved_bytes": stats["reserved_bytes"]["all"]["peak"],
                     "capacity_bytes": topo.hbm_bytes_per_device, "verdict": fits[topo.target.name],
                     "verdict_by_target": fits})
    return rows


def _graphs() -> dict[str, Any] | None:
    """Compiled-graph counters, from the plugin that compiles graphs (neuron-compile's `neuron_report_graphs`)."""
    return _plugins.report_graphs()


def collect() -> dict[str, Any]:
    """The report as a JSON-serialisable dict (seconds are simulated device seconds)."""
    topo = _topology.topology()
    launches = _ledger.launches()
    ops = _ops(launches)
    streams = _streams()
    ops_total = sum(op["seconds"] for op in ops)
    busy_total = sum(row["busy_seconds"] for row in streams)
    # Stream time not in an op signature: compiled graphs, collectives, and ops before the last clear_op_tracking().
    unattributed = max(busy_total - ops_total, 0.0)
    fallback_names = set(_ledger.get_fallback_ops())
    stats = _ledger.compilation_stats()
    compiled = stats["compilations_per_op"]
    return {
        "target": {"name": topo.target.name, "chips": topo.chips, "lnc": topo.lnc, "devices": topo.device_count,
                   "hbm_bytes_per_device": topo.hbm_bytes_per_device},
        "streams": streams,
        "device_seconds": busy_total,
        "ops_seconds": ops_total,
        "unattributed_seconds": unattributed,
        "ops": ops,
        "by_target": _by_target(launches, unattributed),
        "memory": _memory(topo),
        "fallbacks": {op["name"]: op["calls"] for op in ops if op["name"] in fallback_names},
        "kernels_compiled": stats["total_compilations"],
        "kernel_cache_hits": stats["in_memory_hits"],
        "kernels_compiled_per_op": dict(sorted(compiled.items())),
        "recompiled_ops": {name: count - 1 for name, count in sorted(compiled.items()) if count > 1},
        "graphs": _graphs(),
    }


def _ms(seconds: float) -> str:
    """Simulated seconds in ms, or µs below a millisecond (eager ops are microseconds each)."""
    return f"{seconds * 1e3:.3f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us"


def format_text(data: dict[str, Any], top: int = TOP_OPS) -> str:
    """`collect()`'s dict as plain text for a terminal."""
    target = data["target"]
    lines = [f"Neuron simulation report: target {target['name']}, {target['chips']} chip(s), LNC={target['lnc']}, "
             f"{target['devices']} device(s), {_allocator.format_size(target['hbm_bytes_per_device'])} HBM each",
             "", f"Estimated device time: {_ms(data['device_seconds'])} (ops {_ms(data['ops_seconds'])}, "
             f"other {_ms(data['unattributed_seconds'])}: compiled graphs, collectives, work before "
             "clear_op_tracking())"]
    lines += [f"  neuron:{row['device']} stream {row['stream']}: busy {_ms(row['busy_seconds'])}, "
              f"completes at {_ms(row['completes_at_seconds'])}" for row in data["streams"]]
    lines += ["", f"Top ops by device time (of {len(data['ops'])}):",
              f"  {'op':<44} {'calls':>8} {'time':>12} {'kernels':>8}"]
    lines += [f"  {op['name'][:44]:<44} {op['calls']:>8} {_ms(op['seconds']):>12} {op['kernels_compiled']:>8}"
              for op in data["ops"][:top]]
    lines += ["", "Same run re-estimated per target:"]
    lines += [f"  {name}: {_ms(row['total_seconds'])} (ops {_ms(row['ops_seconds'])}, "
              f"not re-estimated {_ms(row['not_re_estimated_seconds'])})" for name, row in data["by_target"].items()]
    lines += ["", "Peak HBM per device:"]
    lines += [f"  neuron:{row['device']}: {_allocator.format_size(row['peak_allocated_bytes'])} of "
              f"{_allocator.format_size(row['capacity_bytes'])}: {row['verdict']} ("
              + ", ".join(f"{name}: {verdict}" for name, verdict in row["verdict_by_target"].items()) + ")"
              for row in data["memory"]] or ["  (no device memory used)"]
    lines += ["", "CPU fallbacks (calls):"]
    lines += [f"  {name}: {calls}" for name, calls in data["fallbacks"].items()] or ["  none"]
    lines += ["", f"Kernels compiled: {data['kernels_compiled']} (cache hits {data['kernel_cache_hits']}); "
              f"ops compiled for more than one signature: {len(data['recompiled_ops'])}"]
    lines += [f"  {name}: {count} recompilation(s)" for name, count in data["recompiled_ops"].items()]
    if data["graphs"] is not None:
        graphs = data["graphs"]
        lines += [f"torch.compile graphs: {graphs['compilations']} compiled, {graphs['recompilations']} recompiled, "
                  f"{graphs['fallbacks']} fell back"]
    return "\n".join(lines) + "\n"


def report(format: str = "text") -> str:
    """The simulation report of this process so far, as ``"text"`` or ``"json"``."""
    if format not in _FORMATS:
        raise ValueError(f"unknown report format {format!r}; use one of {_FORMATS}")
    data = collect()
    return json.dumps(data, indent=2) if format == "json" else format_text(data)


def _write_at_exit(format: str, path: str | None) -> None:
    text = report(format)
    if path:
        with open(path, "w", encoding="utf-8") as file:
            file.write(text)
    else:
        sys.stderr.write(text)


def install_exit_report() -> None:
    """Print the report at exit if ``NEURON_SIM_REPORT`` asks for it (``1``/``text`` or ``json``; ``0``: off)."""
    raw = envvars.REPORT.read().lower()
    try:
        format = "text" if parse_bool(REPORT_ENV, raw) else None
    except EnvVarError:
        format = raw  # not a boolean: a format name
    if format is None:
        return
    if format not in _FORMATS:
        raise EnvVarError(f"{REPORT_ENV}={raw!r} is invalid. Accepted: 1 or text, json, 0 (off).")
    import atexit

    atexit.register(_write_at_exit, format, envvars.REPORT_FILE.read())
