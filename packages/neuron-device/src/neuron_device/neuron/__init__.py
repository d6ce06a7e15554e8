"""`torch.neuron`: the device module, mirroring `torch.cuda` (device management here; RNG in `random`, memory in
`memory`). Names and semantics follow `torch.cuda` and AWS TorchNeuron's `torch.neuron`."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .. import topology as _topology
from ..device import (
    _check_index,
    _get_device_index,
    current_device,
    device,
    device_count,
    device_of,
    set_device,
)
from ..numerics import is_downcast_64bit_enabled, set_downcast_64bit
from . import amp as amp  # torch.neuron.amp, as torch.cuda.amp
from . import comm as comm  # torch.neuron.comm, as torch.cuda.comm
from . import legacy as legacy
from . import memory as memory  # torch.neuron.memory, as torch.cuda.memory
from ._lazy import _is_in_bad_fork as _is_in_bad_fork  # torch.random checks it before seeding
from ._lazy import is_initialized, lazy_init
from .legacy import *  # noqa: F403 - the legacy typed API: FloatTensor, FloatStorage, ... as on torch.cuda
from .memory import *  # noqa: F403 - the memory functions, as torch.cuda re-exports torch.cuda.memory's
from .random import (
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from .streams import (
    Event,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    query,
    record_event,
    set_stream,
    stream,
    wait_event,
    wait_stream,
)
from .streams import synchronize as _synchronize_streams

__all__ = [
    "Event",
    "NeuronDeviceProperties",
    "Stream",
    "StreamContext",
    "current_device",
    "current_stream",
    "default_stream",
    "device",
    "device_count",
    "device_of",
    "get_amp_supported_dtype",
    "get_device_name",
    "get_device_properties",
    "get_rng_state",
    "get_rng_state_all",
    "init",
    "initial_seed",
    "is_available",
    "is_bf16_supported",
    "is_downcast_64bit_enabled",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "query",
    "record_event",
    "seed",
    "seed_all",
    "set_device",
    "set_downcast_64bit",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "stream",
    "synchronize",
    "wait_event",
    "wait_stream",
]
__all__ += memory.__all__  # the memory functions, listed once: in their module
__all__ += legacy.__all__

_Device = int | str | torch.device | None


def __getattr__(name: str) -> Any:
    # torch.utils.checkpoint (and other code written for torch.cuda) reads the module global `_initialized`.
    if name == "_initialized":
        return is_initialized()
    raise AttributeError(f"module 'torch.neuron' has no attribute {name!r}")


def is_available() -> bool:
    """Always true: the simulated NeuronCores need no hardware."""
    return True


def init() -> None:
    """Initialise the runtime explicitly (it also initialises itself on first use)."""
    lazy_init()


@dataclasses.dataclass(frozen=True)
class NeuronDeviceProperties:
    """What `get_device_properties` reports for one device (a logical NeuronCore of the simulated target)."""

    name: str
    total_memory: int
    physical_cores: int
    logical_nc_config: int
    core_version: str
    core_id: int
    chip: int
    hbm_bandwidth: float

    def __repr__(self) -> str:
        return (
            f"NeuronDeviceProperties(name='{self.name}', total_memory={self.total_memory // 1024**2}MB, "
            f"physical_cores={self.physical_cores}, logical_nc_config={self.logical_nc_config}, "
            f"core_version='{self.core_version}', core_id={self.core_id}, chip={self.chip})"
        )


def get_device_properties(device: _Device = None) -> NeuronDeviceProperties:
    """Properties of a device; `.name` is the target chip (e.g. "trn2"), as TRL and TorchNeuron expect.

    `core_id` is the runtime's logical core id (what `NEURON_RT_VISIBLE_CORES` names), `chip` the chip holding it,
    `hbm_bandwidth` (bytes/s) the device's share of its chip's HBM bandwidth.
    """
    index = _check_index(_get_device_index(device))
    topo = _topology.topology()
    return NeuronDeviceProperties(
        name=topo.target.name,
        total_memory=topo.hbm_bytes_per_device,
        physical_cores=topo.lnc,
        logical_nc_config=topo.lnc,
        core_version=topo.target.core_version,
        core_id=topo.core_id(index),
        chip=topo.chip_of(index),
        hbm_bandwidth=topo.target.hbm_bandwidth_per_chip / topo.logical_cores_per_chip,
    )


def get_device_name(device: _Device = None) -> str:
    """Name of a device: "neuron:<index>", as TorchNeuron reports it."""
    return f"neuron:{_check_index(_get_device_index(device))}"


def synchronize(device: _Device = None) -> None:
    """Wait for all streams of `device`: the host's simulated time moves to the latest stream clock (the ops
    themselves already ran on the host)."""
    lazy_init()
    _synchronize_streams(device)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """NeuronCores compute natively in bfloat16."""
    return True


def get_amp_supported_dtype() -> list[torch.dtype]:
    """The dtypes `torch.autocast("neuron")` accepts."""
    return [torch.bfloat16, torch.float16, torch.float32]
