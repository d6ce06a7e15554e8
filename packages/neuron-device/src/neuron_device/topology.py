"""The simulated machine of this process: read once from the environment when the runtime initialises, as the real
runtime does.

The figures (`TARGETS`, `INSTANCE_TYPES`) live in the hardware spec `neuron_spec.hardware`, the parser of the
variables that choose the machine (`read_topology`, documented there) in `neuron_spec.machine`; this module is
the device's cached view of them.
"""

from __future__ import annotations

import functools
import os

from neuron_spec.hardware import INSTANCE_TYPES, TARGETS, GiB, Instance, Target, resolve_target
from neuron_spec.machine import Topology, parse_size, read_topology

__all__ = [
    "INSTANCE_TYPES",
    "TARGETS",
    "GiB",
    "Instance",
    "Target",
    "Topology",
    "parse_size",
    "read_topology",
    "resolve_target",
    "topology",
]


@functools.cache
def topology() -> Topology:
    """The topology of this process, read once from the environment (the runtime reads it at initialisation)."""
    return read_topology(os.environ)
