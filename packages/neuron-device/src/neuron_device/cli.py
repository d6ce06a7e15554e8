"""`neuron-ls`: the simulated machine this process would see, the processes using it, and which of our packages and
plugins are installed.

Named and laid out after the Neuron SDK's `neuron-ls`: the `instance-type` / `instance-id` /
`logical-neuroncore-config` header, then one row per Neuron device (chip) with its NeuronCores, logical core ids,
memory and connected devices, and the processes using its cores (from what they publish, `livestats`). Its flags:
`-j/--json-output` (the same as JSON, one object per device), `-t/--topology` (how the devices connect),
`-a/--show-all-procs` (also monitoring tools such as neuron-top), `-w/--wide` (commands not shortened). PCI BDF,
CPU affinity and NUMA node have no meaning for a simulated chip: they show as `-` (null in JSON).

It reads the same environment as the runtime (`topology`), so it shows what ``torch.neuron`` will show in a
process started with that environment; ``--json`` (ours) prints the simulator's own description as JSON.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from typing import Any

from . import allocator as _allocator
from . import livestats
from . import topology as _topology

__all__ = ["DISTRIBUTIONS", "connected_devices", "describe", "device_table", "format_devices", "format_text", "main"]

DISTRIBUTIONS = ("neuron-device", "neuron-compile", "neuron-distributed", "neuron-nki", "torch-neuronx")


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _plugins() -> dict[str, str]:
    """Each `neuron_device.plugins` entry point and its state after loading ("ok" or the error)."""
    import torch  # noqa: F401  (registers the device and loads the plugins)

    from . import plugins, register

    register()
    return dict(sorted(plugins.loaded_plugins.items()))


def describe(topo: _topology.Topology | None = None) -> dict[str, Any]:
    """Everything `neuron-ls` shows, as a JSON-serialisable dict."""
    topo = _topology.topology() if topo is None else topo
    target = topo.target
    devices = [{"device": f"neuron:{index}", "logical_core": topo.core_id(index), "chip": topo.chip_of(index),
                "physical_cores": list(topo.physical_cores_of(index)), "hbm_bytes": topo.hbm_bytes_per_device}
               for index in range(topo.device_count)]
    return {
        "target": target.name,
        "core_version": target.core_version,
        "instance_type": topo.instance_type,
        "chips": topo.chips,
        "physical_cores_per_chip": target.physical_cores_per_chip,
        "physical_cores": topo.chips * target.physical_cores_per_chip,
        "lnc": topo.lnc,
        "logical_cores_per_chip": topo.logical_cores_per_chip,
        "logical_cores": topo.total_logical_cores,
        "visible_cores": list(topo.visible),
        "hbm_bytes_per_chip": target.hbm_bytes_per_chip,
        "hbm_bytes_per_core": topo.hbm_bytes_per_device,
        "devices": devices,
        "packages": {name: _version(name) for name in DISTRIBUTIONS},
        "plugins": _plugins(),
    }


def format_text(info: dict[str, Any]) -> str:
    """`describe()`'s dict as a terminal table."""
    size = _allocator.format_size
    instance = f" ({info['instance_type']})" if info["instance_type"] else ""
    lines = [
        f"Simulated target: {info['target']} (NeuronCore-{info['core_version']}){instance}",
        f"Chips: {info['chips']}, {size(info['hbm_bytes_per_chip'])} HBM each",
        f"Physical NeuronCores: {info['physical_cores']} ({info['physical_cores_per_chip']} per chip)",
        f"Logical NeuronCores: {info['logical_cores']} (LNC={info['lnc']}, {info['logical_cores_per_chip']} per chip)",
        f"Visible cores: {len(info['visible_cores'])} of {info['logical_cores']}, "
        f"{size(info['hbm_bytes_per_core'])} HBM per core",
        "",
        f"  {'device':<10} {'logical core':>12} {'chip':>5}  {'physical cores':<15} {'HBM':>10}",
    ]
    lines += [f"  {d['device']:<10} {d['logical_core']:>12} {d['chip']:>5}  "
              f"{','.join(map(str, d['physical_cores'])):<15} {size(d['hbm_bytes']):>10}" for d in info["devices"]]
    lines += ["", "Packages:"]
    lines += [f"  {name:<20} {version or 'not installed'}" for name, version in info["packages"].items()]
    lines += ["", "Plugins:"]
    lines += [f"  {name:<20} {state}" for name, state in info["plugins"].items()] or ["  none"]
    return "\n".join(lines) + "\n"


def connected_devices(chip: int, chips: int) -> list[int]:
    """Chips `chip` has NeuronLink to: on a 16-chip instance (trn1/trn2 .32xl/.48xl) a 4x4 2D torus, listed as
    `neuron-ls` lists them (up, left, down, right: chip 0 -> 12, 3, 4, 1); on fewer chips a ring."""
    if chips == 16:
        row, column = divmod(chip, 4)
        return [(chip - 4) % 16, row * 4 + (column - 1) % 4, (chip + 4) % 16, row * 4 + (column + 1) % 4]
    if chips == 1:
        return []
    return sorted({(chip - 1) % chips, (chip + 1) % chips} - {chip})


def _runtime_version() -> str:
    return _version("neuron-device") or "unknown"


def device_table(topo: _topology.Topology | None = None, show_all: bool = False) -> list[dict[str, Any]]:
    """One entry per Neuron device (chip), as `neuron-ls --json-output` prints it."""
    topo = _topology.topology() if topo is None else topo
    per_chip = topo.logical_cores_per_chip
    procs = livestats.processes(include_tools=show_all)
    table = []
    for chip in range(topo.chips):
        core_ids = list(range(chip * per_chip, (chip + 1) * per_chip))
        users = []
        for proc in procs:
            used = sorted(device["core_id"] for device in proc["devices"].values() if device["chip"] == chip)
            if used or (proc.get("kind") == "tool" and chip == 0):
                users.append({"pid": proc["pid"], "command": proc["command"], "neuroncore_ids": used,
                              "neuron_runtime_version": _runtime_version() if proc.get("kind") != "tool" else None})
        table.append({
            "neuron_device": chip,
            "bdf": None,
            "connected_to": connected_devices(chip, topo.chips) or None,
            "nc_count": topo.target.physical_cores_per_chip,
            "logical_neuroncore_config": topo.lnc,
            "neuroncore_ids": core_ids,
            "memory_size": topo.target.hbm_bytes_per_chip,
            "cpu_affinity": None,
            "numa_node": None,
            "neuron_processes": users,
        })
    return table


def _ranges(ids: list[int]) -> str:
    if not ids:
        return "-"
    return f"{ids[0]}-{ids[-1]}" if ids == list(range(ids[0], ids[-1] + 1)) and len(ids) > 1 else ",".join(map(str, ids))


def _grid(header: list[tuple[str, str]], rows: list[list[str]]) -> list[str]:
    """An ASCII table in `neuron-ls`'s style: two header lines, `+---+` rules."""
    widths = [max(len(top), len(bottom), *(len(row[i]) for row in rows)) for i, (top, bottom) in enumerate(header)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    return [rule, line([t.center(w) for (t, _), w in zip(header, widths)]),
            line([b.center(w) for (_, b), w in zip(header, widths)]), rule, *map(line, rows), rule]


def format_devices(table: list[dict[str, Any]], topo: _topology.Topology, wide: bool = False) -> str:
    """The documented `neuron-ls` text: header lines, the device table, the processes using each device."""
    lines = [f"instance-type: {topo.instance_type or topo.target.name + ' (simulated)'}",
             "instance-id: simulated",
             f"logical-neuroncore-config: {topo.lnc}"]
    rows = [[str(d["neuron_device"]), str(d["nc_count"]), _ranges(d["neuroncore_ids"]), f"{d['memory_size'] // 2**30} GB",
             ", ".join(map(str, d["connected_to"] or [])) or "-", "-", "-", "-"] for d in table]
    lines += _grid([("NEURON", "DEVICE"), ("NEURON", "CORES"), ("NEURON", "CORE IDS"), ("NEURON", "MEMORY"),
                    ("CONNECTED", "DEVICES"), ("PCI", "BDF"), ("CPU", "AFFINITY"), ("NUMA", "NODE")], rows)
    procs = [[str(d["neuron_device"]), _ranges(p["neuroncore_ids"]), str(p["pid"]),
              p["command"] if wide else (p["command"][:40] + "..." if len(p["command"]) > 43 else p["command"]),
              p["neuron_runtime_version"] or "-"] for d in table for p in d["neuron_processes"]]
    if procs:
        lines += _grid([("NEURON", "DEVICE"), ("NEURON CORE", "IDS"), ("PID", ""), ("COMMAND", ""),
                        ("RUNTIME", "VERSION")], procs)
    return "\n".join(lines) + "\n"


def format_topology(topo: _topology.Topology) -> str:
    """`neuron-ls --topology`: which devices each device has NeuronLink to (and the torus as a grid)."""
    lines = ["Neuron device topology:"]
    if topo.chips == 16:
        lines += ["  " + " -- ".join(f"{row * 4 + column:>2}" for column in range(4)) for row in range(4)]
        lines.append("  (a 4x4 2D torus: each row and column wraps around)")
    lines += [f"  device {chip}: connected to {', '.join(map(str, connected_devices(chip, topo.chips))) or 'none'}"
              for chip in range(topo.chips)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `neuron-ls` console script."""
    parser = argparse.ArgumentParser(prog="neuron-ls", description="Show the simulated Trainium machine, the "
                                     "processes using it, and the installed neuron packages and plugins.")
    parser.add_argument("-j", "--json-output", action="store_true", help="output in JSON format")
    parser.add_argument("-t", "--topology", action="store_true", help="show how the Neuron devices connect")
    parser.add_argument("-a", "--show-all-procs", action="store_true",
                        help="also show processes that only monitor the devices (neuron-top, neuron-monitor)")
    parser.add_argument("-w", "--wide", action="store_true", help="do not shorten process commands")
    parser.add_argument("--json", action="store_true", help="print the simulator's own description as JSON "
                        "(target, LNC, visible cores, packages, plugins)")
    args = parser.parse_args(argv)
    try:
        topo = _topology.topology()
        info = describe(topo)
    except RuntimeError as error:  # an invalid environment variable: the message names it and the accepted forms
        print(f"neuron-ls: {error}", file=sys.stderr)
        return 2
    if args.json:
        sys.stdout.write(json.dumps(info, indent=2) + "\n")
        return 0
    table = device_table(topo, show_all=args.show_all_procs)
    if args.json_output:
        sys.stdout.write(json.dumps(table, indent=2) + "\n")
        return 0
    out = format_devices(table, topo, wide=args.wide)
    if args.topology:
        out += "\n" + format_topology(topo)
    sys.stdout.write(out + "\n" + format_text(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
