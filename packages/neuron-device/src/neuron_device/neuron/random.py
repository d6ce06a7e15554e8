"""Random number generators of the `neuron` devices (`torch.cuda.random`'s twin).

torch 2.13 cannot create a `torch.Generator("neuron")` from Python (`_patches` makes it raise an error naming
`default_generator`), so each device owns a CPU `torch.Generator` that the host kernels draw from, passed to them
explicitly (`ops.seeded`; never swapped into the CPU's default generator). Random ops on `neuron` are
therefore reproducible under `torch.manual_seed`, and after it they produce exactly the numbers the CPU would.

The state a device hands out is CUDA's: 16 bytes, a Philox-style (seed: uint64, offset: int64) pair, which
`torch.distributed.tensor`'s RNG tracker reads and shifts per shard (`_PhiloxState`). The stream at (seed, offset)
is a function of the pair alone: the Mersenne Twister seeded with `seed` at offset 0 (the CPU's numbers), and one
seeded with a 64-bit mix of the pair at any other offset. A state is handed out (`get_rng_state`) at the position
its generator has reached; if the generator has drawn since its stream began there, the offset advances by 4 (a
Philox draw's step) and the generator continues on the new pair's stream, so that restoring the state replays
exactly what follows. Hence numbers drawn after a `get_rng_state` are not the CPU's (they are reproducible).
"""

from __future__ import annotations

import ctypes
import struct
import threading
from collections.abc import Iterable

import numpy as np
import torch

from ..device import _check_index, _get_device_index, device_count

__all__ = [
    "default_generator",
    "get_rng_state",
    "get_rng_state_all",
    "initial_seed",
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "set_rng_state",
    "set_rng_state_all",
]

_STATE_BYTES = 16  # seed and offset, as CUDA's Philox state
_OFFSET_STEP = 4  # CUDA's offsets are multiples of 4 (DTensor aligns them so too)
_MASK64 = (1 << 64) - 1
_LAYOUT = "<Qq"  # seed: uint64, offset: int64, as DTensor's `_PhiloxState` reads them


def _stream_seed(seed: int, offset: int) -> int:
    """The Mersenne Twister seed of the stream at (seed, offset): `seed` itself at offset 0, else a splitmix64 mix
    of the pair (so neighbouring offsets give unrelated streams)."""
    if offset == 0:
        return seed
    z = (seed + (offset + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _host_bytes(state: torch.Tensor) -> bytes:
    """A contiguous CPU state tensor's bytes, read from its memory: no tensor op, which a dispatch mode would see
    (activation checkpointing saves and restores states under plan mode's fake tensors and tracing modes)."""
    return ctypes.string_at(state.data_ptr(), state.numel())


_PYTHON_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.Python) | torch._C.DispatchKeySet(
    torch._C.DispatchKey.PythonTLSSnapshot)


def _engine_state(engine: torch.Generator) -> bytes:
    """The engine's state, allocated past the Python dispatch modes (a fake tensor mode would make it fake)."""
    with torch._C._ExcludeDispatchKeyGuard(_PYTHON_KEYS):
        return _host_bytes(engine.get_state())


class _DeviceRandom:
    """One device's generator: the CPU `engine` the host kernels draw from, and the (seed, offset) its stream began
    at, with the engine's state there (to tell whether it has drawn since)."""

    __slots__ = ("engine", "lock", "offset", "origin", "seed")

    def __init__(self) -> None:
        self.engine = torch.Generator()
        self.lock = threading.Lock()
        self.start(self.engine.initial_seed(), 0)

    def start(self, seed: int, offset: int) -> None:
        self.seed, self.offset = seed & _MASK64, offset
        self.engine.manual_seed(_stream_seed(self.seed, offset))
        self.origin = _engine_state(self.engine)

    def state(self) -> torch.Tensor:
        with self.lock:
            if _engine_state(self.engine) != self.origin:  # drawn since: a new position
                self.start(self.seed, self.offset + _OFFSET_STEP)
            packed = struct.pack(_LAYOUT, self.seed, self.offset)
        with torch._C._ExcludeDispatchKeyGuard(_PYTHON_KEYS):  # a real tensor under a fake tensor mode too
            return torch.from_numpy(np.frombuffer(packed, dtype=np.uint8).copy())

    def set_state(self, state: torch.Tensor) -> None:
        if state.numel() != _STATE_BYTES:
            raise RuntimeError("RNG state is wrong size")
        seed, offset = struct.unpack(_LAYOUT, _host_bytes(state.contiguous()))
        with self.lock:
            self.start(seed, offset)


_devices: dict[int, _DeviceRandom] = {}


def _index(device) -> int:
    return _check_index(_get_device_index(device))


def _device(index: int) -> _DeviceRandom:
    random = _devices.get(index)
    if random is None:
        random = _devices.setdefault(index, _DeviceRandom())
    return random


def default_generator(index: int) -> torch.Generator:
    """The CPU generator device `index`'s random ops draw from (created on first use with CPU's default seed)."""
    return _device(index).engine


def _all_indices() -> range:
    return range(device_count())


def manual_seed(seed: int) -> None:
    """Seed the generator of the current device."""
    _device(_index(None)).start(int(seed), 0)


def manual_seed_all(seed: int) -> None:
    """Seed the generators of all devices (called by `torch.manual_seed`)."""
    for index in _all_indices():
        _device(index).start(int(seed), 0)


def seed() -> None:
    """Seed the current device's generator with a non-deterministic random number."""
    _device(_index(None)).start(torch.Generator().seed(), 0)


def seed_all() -> None:
    """Seed all devices with one non-deterministic random number."""
    value = torch.Generator().seed()
    manual_seed_all(value)


def initial_seed() -> int:
    """The seed of the current device's generator."""
    return _device(_index(None)).seed


def get_rng_state(device: int | str | torch.device = "neuron") -> torch.Tensor:
    """The RNG state of a device, as a CPU ByteTensor of 16 bytes: seed and offset (see the module doc)."""
    return _device(_index(device)).state()


def set_rng_state(new_state: torch.Tensor, device: int | str | torch.device = "neuron") -> None:
    """Restore the RNG state of a device from `get_rng_state`'s output (or one whose offset DTensor shifted)."""
    if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8:
        raise TypeError("set_rng_state expects a torch.ByteTensor as returned by get_rng_state")
    _device(_index(device)).set_state(new_state.cpu())


def get_rng_state_all() -> list[torch.Tensor]:
    """The RNG states of all devices."""
    return [get_rng_state(index) for index in _all_indices()]


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    """Restore the RNG states of all devices."""
    for index, state in enumerate(new_states):
        set_rng_state(state, index)
