"""`neuron-ls`: the simulated machine this process would see, and which of our packages and plugins are installed.

Named after the Neuron SDK's own `neuron-ls`. It reads the same environment as the runtime (`topology`), so it
shows what ``torch.neuron`` will show in a process started with that environment; ``--json`` for tools.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from typing import Any

from . import allocator as _allocator
from . import topology as _topology

__all__ = ["DISTRIBUTIONS", "describe", "format_text", "main"]

DISTRIBUTIONS = ("neuron-device", "neuron-compile", "neuron-distributed", "neuron-nki")


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


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `neuron-ls` console script."""
    parser = argparse.ArgumentParser(prog="neuron-ls", description="Show the simulated Trainium machine and the "
                                     "installed neuron packages and plugins.")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    try:
        info = describe()
    except RuntimeError as error:  # an invalid environment variable: the message names it and the accepted forms
        print(f"neuron-ls: {error}", file=sys.stderr)
        return 2
    sys.stdout.write(json.dumps(info, indent=2) + "\n" if args.json else format_text(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
