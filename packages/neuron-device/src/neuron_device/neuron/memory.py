"""`torch.neuron` memory management, with `torch.cuda.memory`'s names, semantics and statistics keys.

The numbers come from the caching-allocator model in `neuron_device.allocator`: what the device's HBM would hold,
not the host memory that backs it.
"""

from __future__ import annotations

import collections
from typing import Any

import torch

from .. import allocator
from ..allocator import OutOfMemoryError
from ..device import _check_index, _get_device_index, device_count

__all__ = [
    "OutOfMemoryError",
    "empty_cache",
    "get_per_process_memory_fraction",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "set_per_process_memory_fraction",
]

_Device = int | str | torch.device | None


def _device(device: _Device) -> allocator.DeviceAllocator:
    return allocator.device(_check_index(_get_device_index(device)))


def memory_stats_as_nested_dict(device: _Device = None) -> dict[str, Any]:
    """`memory_stats` as a nested dictionary (pool and metric levels)."""
    return _device(device).stats_as_nested_dict()


def memory_stats(device: _Device = None) -> collections.OrderedDict[str, Any]:
    """The allocator statistics of a device under CUDA's flat keys, e.g. "allocated_bytes.all.current",
    "reserved_bytes.large_pool.peak", "num_alloc_retries", "num_ooms" (sorted, as `torch.cuda.memory_stats`)."""
    flat: list[tuple[str, Any]] = []

    def flatten(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                flatten(f"{prefix}.{key}" if prefix else key, inner)
        else:
            flat.append((prefix, value))

    flatten("", memory_stats_as_nested_dict(device))
    flat.sort()
    return collections.OrderedDict(flat)


def memory_allocated(device: _Device = None) -> int:
    """Bytes of device memory occupied by tensors (block sizes, rounded as the allocator rounds them)."""
    return _device(device).allocated()


def max_memory_allocated(device: _Device = None) -> int:
    """Peak of `memory_allocated` since start or the last `reset_peak_memory_stats`."""
    return memory_stats_as_nested_dict(device)["allocated_bytes"]["all"]["peak"]


def memory_reserved(device: _Device = None) -> int:
    """Bytes of device memory held by the caching allocator (allocated plus cached)."""
    return memory_stats_as_nested_dict(device)["reserved_bytes"]["all"]["current"]


def max_memory_reserved(device: _Device = None) -> int:
    """Peak of `memory_reserved` since start or the last `reset_peak_memory_stats`."""
    return memory_stats_as_nested_dict(device)["reserved_bytes"]["all"]["peak"]


def reset_peak_memory_stats(device: _Device = None) -> None:
    """Restart every "peak" statistic from its current value."""
    _device(device).reset_peak()


def reset_accumulated_memory_stats(device: _Device = None) -> None:
    """Zero the "allocated"/"freed" totals and the event counters (retries, OOMs, device allocs and frees)."""
    _device(device).reset_accumulated()


def empty_cache() -> None:
    """Release the cached, unoccupied segments of every device, so `memory_reserved` drops to what is in use."""
    for index in range(device_count()):
        allocator.device(index).empty_cache()


def mem_get_info(device: _Device = None) -> tuple[int, int]:
    """(free, total) device memory in bytes: total is the device's HBM, free what this process has not reserved."""
    model = _device(device)
    reserved = memory_stats_as_nested_dict(device)["reserved_bytes"]["all"]["current"]
    return max(model.capacity - reserved, 0), model.capacity


def set_per_process_memory_fraction(fraction: float, device: _Device = None) -> None:
    """Cap this process's reserved memory on a device at `fraction` of its capacity (exceeding it is an OOM)."""
    model = _device(device)
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if not 0 <= fraction <= 1:  # NaN too, as CUDA's allocator refuses it (`0 <= fraction && fraction <= 1`)
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    model.fraction = fraction  # under the device's lock, after the allocations queued under the old limit


def get_per_process_memory_fraction(device: _Device = None) -> float:
    """The fraction set by `set_per_process_memory_fraction` (1.0 by default)."""
    return _device(device).fraction


def memory_snapshot() -> list[dict[str, Any]]:
    """Every reserved segment of every device with its blocks (the segment part of `torch.cuda.memory_snapshot`)."""
    return [segment for index in range(device_count()) for segment in allocator.device(index).segments()]


def _format_scaled(value: int, reference: float, prefixes: list[str], limit: float, base: int, width: int) -> str:
    """Scale `value` down while `reference` is large, as CUDA's summary does for one row."""
    prefix = prefixes[0]
    for next_prefix in prefixes[1:]:
        if reference < limit:
            break
        prefix = next_prefix
        value //= base
        reference /= base
    return f"{value:{width}d} {prefix}"


def _format_bytes(value: int, reference: float) -> str:
    return _format_scaled(value, reference, ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"], 768 * 1024, 1024, 6)


def _format_count(value: int, reference: float) -> str:
    return _format_scaled(value, reference, [" ", "K", "M"], 750 * 1000, 1000, 7) + " "


_SUMMARY_ROWS = (
    ("allocated_bytes", "Allocated memory", _format_bytes),
    ("active_bytes", "Active memory", _format_bytes),
    ("requested_bytes", "Requested memory", _format_bytes),
    ("reserved_bytes", "HBM reserved memory", _format_bytes),
    ("inactive_split_bytes", "Non-releasable memory", _format_bytes),
    ("allocation", "Allocations", _format_count),
    ("active", "Active allocs", _format_count),
    ("segment", "HBM reserved segments", _format_count),
    ("inactive_split", "Non-releasable allocs", _format_count),
)


def memory_summary(device: _Device = None, abbreviated: bool = False) -> str:
    """A printable table of the allocator statistics of a device, laid out like `torch.cuda.memory_summary`."""
    index = _get_device_index(device)
    stats = memory_stats_as_nested_dict(device)
    rule, double = "-" * 75, "=" * 75
    lines = [
        double,
        f" {'':16} PyTorch Neuron memory summary, device ID {index:<15d} ",
        rule,
        f"  {'':8} Neuron OOMs: {stats['num_ooms']:<12d} | {'':4} device alloc retries: {stats['num_alloc_retries']:<7d}  ",
        double,
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ",
    ]
    pools = [("all", None)] if abbreviated else [("all", None), ("large_pool", "from large pool"),
                                                 ("small_pool", "from small pool")]
    for key, title, formatter in _SUMMARY_ROWS:
        lines.append(rule)
        first = stats[key]["all"]
        for pool, label in pools:
            stat = stats[key][pool]
            cells = " | ".join(formatter(stat[m], first[m]) for m in ("current", "peak", "allocated", "freed"))
            name = title if label is None else f"      {label}"
            lines.append(f" {name:<21} | {cells} ")
    lines.append(double)
    return "|" + "|\n|".join(lines) + "|\n"
