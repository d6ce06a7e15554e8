"""The simulated machine: which target, how many chips and (logical) NeuronCores, HBM per device, parsed from the
environment. The one parser of the target/topology variables; the device reads it once at initialisation
(`neuron_device.topology.topology()`), NKI per kernel launch (`read_target`).

A `neuron:<i>` device is one logical NeuronCore, as in TorchNeuron: on trn2 with the default logical-core size
(LNC=2) two physical cores form one device, so a trn2 chip shows 4 devices. The HBM of a chip is shared by its
logical cores; each device gets an equal share (trn2, LNC=2: 96 GiB / 4 = 24 GiB).

=================================== ==========================================================================
``NEURON_PLATFORM_TARGET_OVERRIDE`` ``trn1``, ``trn2`` (default) or ``trn3``, or an alias (``gen3``, ``inf2``...).
``NEURON_LOGICAL_NC_CONFIG``        physical cores per logical core: ``1`` or ``2`` (trn1 allows only ``1``).
``NEURON_SIM_INSTANCE_TYPE``        an instance whose chips are simulated, e.g. ``trn2.48xlarge`` (16 chips);
                                    see `INSTANCE_TYPES`. It implies the target.
``NEURON_SIM_CHIPS``                number of chips, for any target (default 1).
``NEURON_RT_VISIBLE_CORES``         which logical cores this process uses: ``2``, ``0-3``, ``1,5`` or ``0-1,4``.
``NEURON_RT_NUM_CORES``             how many logical cores this process uses (the first ones; ``0`` = all).
``NEURON_SIM_DEVICE_MEMORY``        HBM per device instead of the target's share, e.g. ``512MiB``, ``2GiB`` or a
                                    byte count (to test out-of-memory behaviour cheaply).
=================================== ==========================================================================

Visible cores are numbered across the whole instance (chip ``c`` holds logical cores ``c * per_chip`` to
``(c + 1) * per_chip - 1``) and become ``neuron:0``, ``neuron:1``, ... in increasing order, as with the real runtime.
Every invalid value raises an `EnvVarError` (a RuntimeError and a ValueError) naming the variable and the accepted
forms.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from .env import EnvVar, EnvVarError
from .hardware import DEFAULT_TARGET, INSTANCE_TYPES, TARGET_FORMS, TARGETS, Instance, Target, resolve_target

__all__ = ["VARIABLES", "Topology", "parse_size", "read_lnc", "read_target", "read_topology"]

TARGET = EnvVar("NEURON_PLATFORM_TARGET_OVERRIDE", str, None,
                "simulated generation: `trn1`, `trn2` (default), `trn3`", owner="device, nki")
LNC = EnvVar("NEURON_LOGICAL_NC_CONFIG", str, None,
             "physical cores per logical core (device): `1` or `2` (default 2 on trn2/trn3; trn1 allows only 1)",
             owner="device, nki")
INSTANCE = EnvVar("NEURON_SIM_INSTANCE_TYPE", str, None,
                  "simulate an instance's chips, e.g. `trn2.48xlarge` (16 chips); implies the target")
CHIPS = EnvVar("NEURON_SIM_CHIPS", str, None, "number of chips (default 1)")
VISIBLE_CORES = EnvVar("NEURON_RT_VISIBLE_CORES", str, None,
                       "logical cores this process uses: `2`, `0-3`, `1,5`, `0-1,4`; they become `neuron:0`, "
                       "`neuron:1`, ...")
NUM_CORES = EnvVar("NEURON_RT_NUM_CORES", str, None, "use the first N logical cores (`0` = all)")
DEVICE_MEMORY = EnvVar("NEURON_SIM_DEVICE_MEMORY", str, None,
                       "HBM per device instead of the target's share, e.g. `512MiB`, `2GiB` (test out-of-memory "
                       "cheaply)")
VARIABLES = (TARGET, LNC, INSTANCE, CHIPS, VISIBLE_CORES, NUM_CORES, DEVICE_MEMORY)

TARGET_ENV = TARGET.name
LNC_ENV = LNC.name
INSTANCE_ENV = INSTANCE.name
CHIPS_ENV = CHIPS.name
VISIBLE_CORES_ENV = VISIBLE_CORES.name
NUM_CORES_ENV = NUM_CORES.name
DEVICE_MEMORY_ENV = DEVICE_MEMORY.name

_CORE_FORMS = "a core id ('2'), an inclusive range ('0-3') or a comma-separated list of ids and ranges ('1,5', '0-1,4')"


@dataclasses.dataclass(frozen=True)
class Topology:
    """The simulated machine seen by this process; `visible[i]` is the logical core id of `neuron:i`."""

    target: Target
    chips: int
    lnc: int
    visible: tuple[int, ...]
    hbm_bytes_per_device: int
    instance_type: str | None = None

    @property
    def logical_cores_per_chip(self) -> int:
        return self.target.physical_cores_per_chip // self.lnc

    @property
    def total_logical_cores(self) -> int:
        """Logical cores of the whole instance, visible to this process or not."""
        return self.chips * self.logical_cores_per_chip

    @property
    def device_count(self) -> int:
        return len(self.visible)

    def core_id(self, index: int) -> int:
        """Instance-wide logical core id of `neuron:index`."""
        return self.visible[index]

    def chip_of(self, index: int) -> int:
        """Chip that holds `neuron:index`."""
        return self.visible[index] // self.logical_cores_per_chip

    def physical_cores_of(self, index: int) -> tuple[int, ...]:
        """Physical core ids (within its chip) that form `neuron:index`."""
        first = (self.visible[index] % self.logical_cores_per_chip) * self.lnc
        return tuple(range(first, first + self.lnc))


def _error(variable: str, raw: str, problem: str, forms: str) -> EnvVarError:
    return EnvVarError(f"{variable}={raw!r} is invalid: {problem}. Accepted: {forms}.")


def _read_instance(env: Mapping[str, str]) -> Instance | None:
    raw = INSTANCE.raw(env)
    if raw is None:
        return None
    name = raw.strip().lower()
    if name not in INSTANCE_TYPES:
        raise _error(INSTANCE_ENV, raw, "unknown instance type", f"one of {sorted(INSTANCE_TYPES)}")
    return INSTANCE_TYPES[name]


def _read_target(env: Mapping[str, str], instance: Instance | None) -> Target:
    raw = TARGET.raw(env)
    if raw is None:
        return TARGETS[instance.target if instance else DEFAULT_TARGET]
    try:
        target = resolve_target(raw)
    except ValueError:
        raise _error(TARGET_ENV, raw, "unknown NeuronCore target (not a Trainium target this simulator knows)",
                     TARGET_FORMS) from None
    if instance and instance.target != target.name:
        raise EnvVarError(
            f"{TARGET_ENV}={raw!r} contradicts {INSTANCE_ENV}={env[INSTANCE_ENV]!r}, whose chips are "
            f"{instance.target}; set only one of them."
        )
    return target


def read_target(env: Mapping[str, str]) -> Target:
    """The target the environment `env` selects: the override, else the simulated instance's, else trn2."""
    return _read_target(env, _read_instance(env))


def _read_positive_int(env: Mapping[str, str], variable: EnvVar, forms: str) -> int | None:
    raw = variable.raw(env)
    if raw is None:
        return None
    text = raw.strip()
    if not text.isdigit() or int(text) < 1:
        raise _error(variable.name, raw, "not a positive integer", forms)
    return int(text)


def _read_chips(env: Mapping[str, str], instance: Instance | None) -> int:
    chips = _read_positive_int(env, CHIPS, "a positive number of chips, e.g. '16'")
    if chips is None:
        return instance.chips if instance else 1
    if instance and instance.chips != chips:
        raise EnvVarError(
            f"{CHIPS_ENV}={chips} contradicts {INSTANCE_ENV}={env[INSTANCE_ENV]!r}, which has {instance.chips} "
            "chips; set only one of them."
        )
    return chips


def read_lnc(env: Mapping[str, str], target: Target) -> int:
    """Physical cores per logical core that `env` selects on `target` (its default when unset)."""
    raw = LNC.raw(env)
    if raw is None:
        return target.default_lnc
    forms = f"{' or '.join(map(str, target.lnc_options))} on {target.name}"
    text = raw.strip()
    if not text.isdigit() or int(text) not in target.lnc_options:
        raise _error(LNC_ENV, raw, "unsupported logical NeuronCore size", forms)
    return int(text)


def _parse_cores(raw: str, total: int) -> tuple[int, ...]:
    forms = f"{_CORE_FORMS}, with ids from 0 to {total - 1}"
    cores: list[int] = []
    for item in raw.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", item)
        if match is None:
            raise _error(VISIBLE_CORES_ENV, raw, f"{item.strip()!r} is neither a core id nor a range", forms)
        first = int(match[1])
        last = first if match[2] is None else int(match[2])
        if last < first:
            raise _error(VISIBLE_CORES_ENV, raw, f"range {item.strip()!r} is reversed", forms)
        cores.extend(range(first, last + 1))
    if len(set(cores)) != len(cores):
        raise _error(VISIBLE_CORES_ENV, raw, "a core is listed twice", forms)
    if max(cores) >= total:
        raise _error(VISIBLE_CORES_ENV, raw, f"core {max(cores)} does not exist (the instance has {total})", forms)
    return tuple(sorted(cores))


def _read_visible(env: Mapping[str, str], total: int) -> tuple[int, ...]:
    raw_count = NUM_CORES.raw(env)
    count = None
    if raw_count is not None:
        text = raw_count.strip()
        if not text.isdigit() or int(text) > total:
            raise _error(NUM_CORES_ENV, raw_count, "not a core count of this instance", f"0 (all) to {total}")
        count = int(text) or total
    raw_visible = VISIBLE_CORES.raw(env)
    if raw_visible is None:
        return tuple(range(total if count is None else count))
    visible = _parse_cores(raw_visible, total)
    if count is not None and count != len(visible):
        raise EnvVarError(
            f"{NUM_CORES_ENV}={raw_count!r} asks for {count} cores but {VISIBLE_CORES_ENV}={raw_visible!r} lists "
            f"{len(visible)}; set only one of them."
        )
    return visible


_SIZE_UNITS = {"": 1, "b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
               "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}


def parse_size(text: str, variable: str) -> int:
    """Bytes of a size written as '2GiB', '512 MiB', '1.5GB' or a plain byte count; `variable` names it in errors."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match[2].lower() if match else None
    if match is None or unit not in _SIZE_UNITS or float(match[1]) * _SIZE_UNITS[unit] < 1:
        raise _error(variable, text, "not a positive memory size", "a byte count or a number with a unit "
                     "(B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. '512MiB'")
    return int(float(match[1]) * _SIZE_UNITS[unit])


def read_topology(env: Mapping[str, str]) -> Topology:
    """The topology described by the environment `env` (validated; see the module docstring)."""
    instance = _read_instance(env)
    target = _read_target(env, instance)
    chips = _read_chips(env, instance)
    lnc = read_lnc(env, target)
    per_chip = target.physical_cores_per_chip // lnc
    visible = _read_visible(env, chips * per_chip)
    raw_memory = DEVICE_MEMORY.raw(env)
    memory = target.hbm_bytes_per_chip // per_chip if raw_memory is None else parse_size(raw_memory, DEVICE_MEMORY_ENV)
    instance_type = instance.name if instance else None
    return Topology(target, chips, lnc, visible, memory, instance_type)
