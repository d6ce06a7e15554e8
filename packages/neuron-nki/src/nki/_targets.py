"""The NeuronCore target a kernel is checked and costed for.

The figures (SBUF/PSUM sizes, clocks, DMA, HBM share, matmul limits) are the hardware spec's
(`neuron_spec.hardware`, shared by every wheel); the target is chosen per kernel launch: the `neuron` device's
target for a kernel launched on `neuron` tensors (the torch adapter passes it), else what the environment selects
(`NEURON_PLATFORM_TARGET_OVERRIDE`, or the target of `NEURON_SIM_INSTANCE_TYPE`; default trn2), parsed by the
spec's one parser. Aliases (``gen3``, ``inf2``, ...) mean what they mean on the device.
"""

from __future__ import annotations

import os

from neuron_spec.hardware import TARGETS, Target
from neuron_spec.hardware import resolve_target as _resolve_name
from neuron_spec.machine import read_lnc, read_target

__all__ = ["TARGETS", "Target", "current_lnc", "current_target", "resolve_target"]


def resolve_target(name: str | None) -> Target:
    """Map a target name or alias (``trn2``, ``gen3``, ``inf2`` …) to its :class:`Target`; None: the current one."""
    return current_target() if name is None else _resolve_name(name)


def current_target() -> Target:
    """The target the environment selects (default trn2, as our simulated device)."""
    return read_target(os.environ)


def current_lnc(target: Target) -> int:
    """Physical cores per logical core that the environment selects on `target` (``NEURON_LOGICAL_NC_CONFIG``)."""
    return read_lnc(os.environ, target)
