"""The simulated machine: which Trainium generation, how many chips and (logical) NeuronCores, HBM per core.

Figures come from AWS's public Neuron architecture docs (see `shared/reference/hardware.md` in the project).
A `neuron:<i>` device is one logical NeuronCore, as in TorchNeuron: on trn2 with the default logical-core size
(LNC=2) two physical cores form one device, so a trn2 chip shows 4 devices.
"""

from __future__ import annotations

import dataclasses
import functools
import os

__all__ = ["TARGETS", "Target", "Topology", "topology"]

GiB = 1024**3


@dataclasses.dataclass(frozen=True)
class Target:
    """Figures of one Trainium generation (per physical NeuronCore unless named per chip)."""

    name: str
    core_version: str
    physical_cores_per_chip: int
    default_lnc: int
    hbm_bytes_per_chip: int
    hbm_bandwidth_per_chip: float  # bytes/s
    tensor_tflops_bf16: float  # per physical core
    tensor_tflops_fp32: float
    tensor_tflops_fp8: float


TARGETS: dict[str, Target] = {
    "trn1": Target("trn1", "v2", 2, 1, 32 * GiB, 0.82e12, 92.0, 23.0, 92.0),
    "trn2": Target("trn2", "v3", 8, 2, 96 * GiB, 2.9e12, 79.0, 20.0, 158.0),
    "trn3": Target("trn3", "v4", 8, 2, 144 * GiB, 4.9e12, 79.0, 20.0, 315.0),
}

TARGET_ENV = "NEURON_PLATFORM_TARGET_OVERRIDE"
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"


@dataclasses.dataclass(frozen=True)
class Topology:
    """The simulated machine seen by this process."""

    target: Target
    chips: int
    lnc: int

    @property
    def logical_cores_per_chip(self) -> int:
        return self.target.physical_cores_per_chip // self.lnc

    @property
    def device_count(self) -> int:
        return self.chips * self.logical_cores_per_chip

    @property
    def hbm_bytes_per_device(self) -> int:
        return self.target.hbm_bytes_per_chip // self.logical_cores_per_chip


def _read_target() -> Target:
    name = os.environ.get(TARGET_ENV, "trn2").strip().lower()
    if name not in TARGETS:
        raise RuntimeError(
            f"{TARGET_ENV}={name!r} is not a Trainium target this simulator knows; use one of {sorted(TARGETS)}."
        )
    return TARGETS[name]


def _read_lnc(target: Target) -> int:
    raw = os.environ.get(LNC_ENV)
    if raw is None:
        return target.default_lnc
    if raw.strip() not in ("1", "2"):
        raise RuntimeError(f"{LNC_ENV}={raw!r} is invalid: the logical NeuronCore size must be 1 or 2.")
    lnc = int(raw)
    if target.physical_cores_per_chip % lnc:
        raise RuntimeError(f"{LNC_ENV}={lnc} does not divide the {target.physical_cores_per_chip} cores of {target.name}.")
    return lnc


@functools.cache
def topology() -> Topology:
    """The topology, read once from the environment (the runtime reads it at initialisation, like the real one)."""
    target = _read_target()
    return Topology(target=target, chips=1, lnc=_read_lnc(target))
