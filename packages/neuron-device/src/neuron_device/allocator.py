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

__all__ = ["DeviceStats", "adopt_tracked", "empty", "resize", "stats"]


class DeviceStats:
    """Allocated and peak bytes of one device, plus allocation counters (CUDA's names)."""

    __slots__ = ("allocated", "allocation_count", "free_count", "peak")

    def __init__(self) -> None:
        self.allocated = 0
        self.peak = 0
        self.allocation_count = 0
        self.free_count = 0


class _Block:
    """The bytes counted for one storage; mutable because `resize` changes a live storage's size."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


_lock = threading.Lock()
_stats: dict[int, DeviceStats] = {}
_blocks: weakref.WeakKeyDictionary[torch.UntypedStorage, _Block] = weakref.WeakKeyDictionary()


def stats(index: int) -> DeviceStats:
    """The (live) statistics of device `index`."""
    found = _stats.get(index)
    if found is None:
        with _lock:
            found = _stats.setdefault(index, DeviceStats())
    return found


def _free(device_stats: DeviceStats, block: _Block) -> None:
    with _lock:
        device_stats.allocated -= block.nbytes
        device_stats.free_count += 1


def _track(neuron_tensor: torch.Tensor, index: int) -> None:
    storage = neuron_tensor.untyped_storage()
    nbytes = storage.nbytes()
    device_stats = stats(index)
    block = _Block(nbytes)
    with _lock:
        device_stats.allocated += nbytes
        device_stats.allocation_count += 1
        if device_stats.allocated > device_stats.peak:
            device_stats.peak = device_stats.allocated
        _blocks[storage] = block
    weakref.finalize(storage, _free, device_stats, block)


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


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """A CPU uint8 tensor over all the bytes of a `neuron` storage."""
    return hostmem.host_alias(torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage))


def resize(storage: torch.UntypedStorage, nbytes: int) -> None:
    """Resize a `neuron` storage in place, keeping the bytes that fit (CUDA's `storage.resize_`; FSDP2 relies on it).

    An adopted storage cannot grow or shrink its own memory, so the kept bytes move to a new host buffer whose data
    pointer is swapped into `storage`: the storage object stays the same, and every tensor and view of it sees the
    new memory. `_swap_data_ptr_` only swaps with an empty storage, hence the empty go-between.
    """
    if nbytes < 0:
        raise RuntimeError(f"Storage size must be non-negative, but got {nbytes}")
    old = storage.nbytes()
    if nbytes == old:
        return
    index = storage.device.index
    fresh = hostmem.adopt(torch.empty(nbytes, dtype=torch.uint8), index).untyped_storage()
    kept = min(old, nbytes)
    if kept:
        _bytes_of(fresh)[:kept].copy_(_bytes_of(storage)[:kept])
    holder = hostmem.adopt(torch.empty(0, dtype=torch.uint8), index).untyped_storage()
    storage._swap_data_ptr_(holder)  # storage: empty; holder: the old bytes, freed when it dies below
    storage._swap_data_ptr_(fresh)  # storage: the new bytes
    with _lock:
        block = _blocks.get(storage)
        if block is None:  # adopted without tracking: nothing was counted, nothing to recount
            return
        device_stats = stats(index)
        device_stats.peak = max(device_stats.peak, device_stats.allocated + nbytes)
        device_stats.allocated += nbytes - old
        device_stats.allocation_count += 1
        device_stats.free_count += 1
        block.nbytes = nbytes
