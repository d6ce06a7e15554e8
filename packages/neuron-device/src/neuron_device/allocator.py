"""Device memory accounting: every byte of `neuron` storage is counted against the core (device) that owns it.

Storage is host memory (see `hostmem`), allocated by the CPU allocator and adopted as `neuron` storage. The
allocator counts each adopted storage when it is created and uncounts it when the storage dies: a
`weakref.finalize` on the storage's Python object fires exactly when the last tensor, view or storage reference is
gone, because torch keeps a storage's Python object alive for as long as its C++ StorageImpl lives.
"""

from __future__ import annotations

import threading
import weakref

import torch

from . import hostmem

__all__ = ["DeviceStats", "adopt_tracked", "empty", "stats"]


class DeviceStats:
    """Allocated and peak bytes of one device, plus allocation counters (CUDA's names)."""

    __slots__ = ("allocated", "allocation_count", "free_count", "peak")

    def __init__(self) -> None:
        self.allocated = 0
        self.peak = 0
        self.allocation_count = 0
        self.free_count = 0


_lock = threading.Lock()
_stats: dict[int, DeviceStats] = {}


def stats(index: int) -> DeviceStats:
    """The (live) statistics of device `index`."""
    found = _stats.get(index)
    if found is None:
        with _lock:
            found = _stats.setdefault(index, DeviceStats())
    return found


def _free(device_stats: DeviceStats, nbytes: int) -> None:
    with _lock:
        device_stats.allocated -= nbytes
        device_stats.free_count += 1


def _track(neuron_tensor: torch.Tensor, index: int) -> None:
    storage = neuron_tensor.untyped_storage()
    nbytes = storage.nbytes()
    device_stats = stats(index)
    with _lock:
        device_stats.allocated += nbytes
        device_stats.allocation_count += 1
        if device_stats.allocated > device_stats.peak:
            device_stats.peak = device_stats.allocated
    weakref.finalize(storage, _free, device_stats, nbytes)


def adopt_tracked(cpu_tensor: torch.Tensor, index: int) -> torch.Tensor:
    """`hostmem.adopt`, counting the new storage against device `index`."""
    tensor = hostmem.adopt(cpu_tensor, index)
    _track(tensor, index)
    return tensor


def empty(size, stride=None, *, dtype: torch.dtype, index: int, memory_format=None) -> torch.Tensor:
    """Allocate an uninitialised `neuron:index` tensor."""
    if stride is None:
        host = torch.empty(size, dtype=dtype, memory_format=memory_format or torch.contiguous_format)
    else:
        host = torch.empty_strided(size, stride, dtype=dtype)
    return adopt_tracked(host, index)
