"""Memory statistics of the `neuron` devices (`torch.cuda.memory`'s names), from the allocator's accounting."""

from __future__ import annotations

import torch

from .. import allocator

__all__ = ["empty_cache", "max_memory_allocated", "memory_allocated", "reset_peak_memory_stats"]


def _index(device) -> int:
    from . import _check_index, _get_device_index

    return _check_index(_get_device_index(device))


def memory_allocated(device: int | str | torch.device | None = None) -> int:
    """Bytes currently held by `neuron` storages on a device."""
    return allocator.stats(_index(device)).allocated


def max_memory_allocated(device: int | str | torch.device | None = None) -> int:
    """Peak of `memory_allocated` since start or the last `reset_peak_memory_stats`."""
    return allocator.stats(_index(device)).peak


def reset_peak_memory_stats(device: int | str | torch.device | None = None) -> None:
    """Restart peak tracking from the current allocation."""
    device_stats = allocator.stats(_index(device))
    device_stats.peak = device_stats.allocated


def empty_cache() -> None:
    """Release cached, unused blocks. The allocator frees storage as soon as it dies, so nothing is cached."""
