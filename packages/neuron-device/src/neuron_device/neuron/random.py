"""Random number generators of the `neuron` devices (`torch.cuda.random`'s twin).

torch 2.13 cannot create a `torch.Generator("neuron")` from Python (`_patches` makes it raise an error naming
`default_generator`), so each device owns a CPU `torch.Generator` that the host kernels draw from, passed to them
explicitly (`fallback.seeded_call`; never swapped into the CPU's default generator). Random ops on `neuron` are
therefore reproducible under `torch.manual_seed`, and with the same seed they produce exactly the numbers the CPU
would.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

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

_generators: dict[int, torch.Generator] = {}


def _index(device) -> int:
    from . import _check_index, _get_device_index

    return _check_index(_get_device_index(device))


def default_generator(index: int) -> torch.Generator:
    """The generator of device `index` (created on first use with CPU's default seed)."""
    generator = _generators.get(index)
    if generator is None:
        generator = _generators.setdefault(index, torch.Generator())
    return generator


def _all_indices() -> range:
    from . import device_count

    return range(device_count())


def manual_seed(seed: int) -> None:
    """Seed the generator of the current device."""
    default_generator(_index(None)).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seed the generators of all devices (called by `torch.manual_seed`)."""
    for index in _all_indices():
        default_generator(index).manual_seed(int(seed))


def seed() -> None:
    """Seed the current device's generator with a non-deterministic random number."""
    default_generator(_index(None)).seed()


def seed_all() -> None:
    """Seed all devices with one non-deterministic random number."""
    value = torch.Generator().seed()
    manual_seed_all(value)


def initial_seed() -> int:
    """The seed of the current device's generator."""
    return default_generator(_index(None)).initial_seed()


def get_rng_state(device: int | str | torch.device = "neuron") -> torch.Tensor:
    """The RNG state of a device, as a CPU ByteTensor."""
    return default_generator(_index(device)).get_state()


def set_rng_state(new_state: torch.Tensor, device: int | str | torch.device = "neuron") -> None:
    """Restore the RNG state of a device from `get_rng_state`'s output."""
    if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8:
        raise TypeError("set_rng_state expects a torch.ByteTensor as returned by get_rng_state")
    default_generator(_index(device)).set_state(new_state.cpu())


def get_rng_state_all() -> list[torch.Tensor]:
    """The RNG states of all devices."""
    return [get_rng_state(index) for index in _all_indices()]


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    """Restore the RNG states of all devices."""
    for index, state in enumerate(new_states):
        set_rng_state(state, index)
