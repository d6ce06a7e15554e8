"""`neuron-monitor` and `neuron-top` for simulated `neuron` devices, named and shaped after the Neuron SDK tools.

Both read what running processes publish (`livestats`): per logical NeuronCore, utilisation (percent of the
simulated time that passed between two readings that the core was busy, and the split by engine), HBM in use,
kernels executed and compiled, CPU fallbacks.

* `neuron-monitor` prints one JSON report per period on stdout, in the tool's documented structure
  (`neuron_runtime_data[]` with `pid`, `neuron_runtime_tag`, `error`, `report.{neuroncore_counters, memory_used,
  execution_stats}`; `instance_info`, `neuron_hardware_info`); `-c/--config-file` takes the documented JSON
  config, of which the `period` (e.g. "1s") is honoured; `-n/--count` stops after N reports (ours).
* `neuron-top` redraws a terminal view every `-d/--delay` seconds (ours; default 1); `-n/--iterations` stops after N
  screens (ours; default: until Ctrl-C).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from . import allocator as _allocator
from . import livestats
from . import topology as _topology

__all__ = ["build_report", "format_top", "monitor_main", "top_main"]


def _hardware() -> tuple[dict[str, Any], dict[str, Any]]:
    topo = _topology.topology()
    instance = {"instance_type": topo.instance_type or f"{topo.target.name} (simulated, {topo.chips} chip)",
                "instance_id": "simulated", "error": ""}
    hardware = {"neuron_device_count": topo.chips, "neuroncore_per_device_count": topo.logical_cores_per_chip,
                "logical_neuroncore_config": topo.lnc, "error": ""}
    return instance, hardware


def _runtime_entry(now: dict[str, Any], before: dict[str, Any] | None, period: float) -> dict[str, Any]:
    usage = livestats.utilisation(before, now)
    previous = before or {}
    cores = {str(device["core_id"]): {"neuroncore_utilization": usage[index]["busy"],
                                      "engine_utilization": usage[index]["engines"]}
             for index, device in now["devices"].items()}
    memory = {str(device["core_id"]): {"tensors": device["hbm_used_bytes"]} for device in now["devices"].values()}
    return {
        "pid": now["pid"],
        "neuron_runtime_tag": now["command"],
        "error": "",
        "report": {
            "neuroncore_counters": {"period": period, "neuroncores_in_use": cores, "error": ""},
            "memory_used": {"period": period, "neuron_runtime_used_bytes": {
                "host": 0, "neuron_device": sum(d["hbm_used_bytes"] for d in now["devices"].values()),
                "usage_breakdown": {"neuroncore_memory_usage": memory}}, "error": ""},
            "execution_stats": {"period": period, "execution_summary": {
                "completed": now["kernel_calls"] - previous.get("kernel_calls", 0),
                "completed_with_err": 0, "completed_with_num_err": 0, "timed_out": 0, "incorrect_input": 0,
                "failed_to_queue": 0},
                "kernels_compiled": now["kernels_compiled"] - previous.get("kernels_compiled", 0),
                "cpu_fallbacks": now["fallback_calls"] - previous.get("fallback_calls", 0),
                "cpu_fallback_ops": now["fallback_ops"], "error": ""},
        },
    }


def build_report(current: list[dict[str, Any]], previous: dict[int, dict[str, Any]], period: float) -> dict[str, Any]:
    """One `neuron-monitor` report from the processes' counters now and at the previous report (by pid)."""
    instance, hardware = _hardware()
    return {
        "neuron_runtime_data": [_runtime_entry(now, previous.get(now["pid"]), period) for now in current],
        "system_data": None,
        "instance_info": instance,
        "neuron_hardware_info": hardware,
    }


_PERIOD = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m)?\s*$")


def _parse_period(text: str) -> float:
    match = _PERIOD.match(str(text))
    if not match:
        raise ValueError(f"period {text!r} is not a duration such as '1s', '500ms' or '2m'")
    value, unit = float(match.group(1)), match.group(2) or "s"
    seconds = value / 1000 if unit == "ms" else value * 60 if unit == "m" else value
    if seconds <= 0:
        raise ValueError(f"period {text!r} must be positive")
    return seconds


def monitor_main(argv: list[str] | None = None) -> int:
    """Entry point of the `neuron-monitor` console script."""
    parser = argparse.ArgumentParser(prog="neuron-monitor", description="Periodic JSON reports of the processes "
                                     "using simulated neuron devices.")
    parser.add_argument("-c", "--config-file", help="JSON configuration file; its 'period' (e.g. '1s') is honoured")
    parser.add_argument("--verbose", type=int, default=0, choices=range(5), help="verbosity on stderr, 0-4")
    parser.add_argument("-n", "--count", type=int, default=0, help="stop after this many reports (default: never)")
    parser.add_argument("--output-format", choices=["json"], default="json",
                        help="report format (the real tool's 2.34 option; JSON, its default, is the one format here)")
    args = parser.parse_args(argv)
    period = 5.0  # the real tool's default period
    try:
        if args.config_file:
            with open(args.config_file) as handle:
                period = _parse_period(json.load(handle).get("period", "5s"))
        _topology.topology()
    except (OSError, ValueError, RuntimeError) as error:
        print(f"neuron-monitor: {error}", file=sys.stderr)
        return 2

    def announce(number: int, current: list[dict[str, Any]]) -> None:
        print(f"neuron-monitor: report {number}, {len(current)} process(es)", file=sys.stderr)

    return _refresh("neuron-monitor", lambda current, previous: json.dumps(build_report(current, previous, period))
                    + "\n", args.count, period, announce if args.verbose else None)


def _bar(percent: float, width: int = 20) -> str:
    filled = round(percent / 100 * width)
    return "[" + "#" * filled + " " * (width - filled) + "]"


def format_top(current: list[dict[str, Any]], previous: dict[int, dict[str, Any]]) -> str:
    """One `neuron-top` screen."""
    size = _allocator.format_size
    instance, hardware = _hardware()
    lines = [f"neuron-top (simulated) - instance: {instance['instance_type']}, "
             f"{hardware['neuron_device_count']} device(s) x {hardware['neuroncore_per_device_count']} logical "
             f"NeuronCores (LNC={hardware['logical_neuroncore_config']})", ""]
    if not current:
        lines.append("No process is using a simulated neuron device.")
    for now in current:
        before = previous.get(now["pid"])
        usage = livestats.utilisation(before, now)
        lines.append(f"PID {now['pid']}  {now['command'][:100]}")
        lines.append(f"  kernels executed {now['kernel_calls']}, compiled {now['kernels_compiled']}, "
                     f"CPU fallbacks {now['fallback_calls']}"
                     + (f" ({', '.join(now['fallback_ops'][:5])})" if now["fallback_ops"] else ""))
        lines.append(f"  {'NeuronCore':<11} {'utilisation':<28} {'by engine':<46} {'HBM used':>22}")
        for index, device in sorted(now["devices"].items(), key=lambda item: int(item[0])):
            busy = usage[index]["busy"]
            engines = ", ".join(f"{engine} {percent:.0f}%" for engine, percent in
                                sorted(usage[index]["engines"].items(), key=lambda item: -item[1]) if percent >= 0.5)
            hbm = f"{size(device['hbm_used_bytes'])} / {size(device['hbm_total_bytes'])}"
            lines.append(f"  nc{device['core_id']:<9} {_bar(busy)} {busy:5.1f}%  {engines or '-':<46} {hbm:>22}")
        lines.append("")
    return "\n".join(lines) + "\n"


def top_main(argv: list[str] | None = None) -> int:
    """Entry point of the `neuron-top` console script."""
    parser = argparse.ArgumentParser(prog="neuron-top", description="Live view of the processes using simulated "
                                     "neuron devices: per-core utilisation by engine, HBM, kernels, fallbacks.")
    parser.add_argument("-d", "--delay", type=float, default=1.0, help="seconds between screens (default 1)")
    parser.add_argument("-n", "--iterations", type=int, default=0, help="stop after this many screens")
    args = parser.parse_args(argv)
    if args.delay <= 0:
        parser.error(f"--delay must be positive, got {args.delay}")
    try:
        _topology.topology()
    except RuntimeError as error:
        print(f"neuron-top: {error}", file=sys.stderr)
        return 2
    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else ""
    return _refresh("neuron-top", lambda current, previous: clear + format_top(current, previous),
                    args.iterations, args.delay)


_Processes = list[dict[str, Any]]


def _refresh(tool: str, render: Callable[[_Processes, dict[int, dict[str, Any]]], str], count: int, period: float,
             announce: Callable[[int, _Processes], None] | None = None) -> int:
    """The tools' loop: every `period` seconds write `render(processes now, processes at the last refresh by pid)`
    to stdout, then `announce(refresh number, processes)`; stop after `count` refreshes (0: never) or at Ctrl-C."""
    previous: dict[int, dict[str, Any]] = {}
    refreshes = 0
    with livestats.publish_tool(tool):
        try:
            while True:
                current = livestats.processes()
                sys.stdout.write(render(current, previous))
                sys.stdout.flush()
                if announce is not None:
                    announce(refreshes + 1, current)
                previous = {now["pid"]: now for now in current}
                refreshes += 1
                if count and refreshes >= count:
                    return 0
                time.sleep(period)
        except KeyboardInterrupt:
            return 0
