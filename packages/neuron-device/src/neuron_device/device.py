"""The `neuron` device: how many there are, which one is current (per thread), and the device guard.

torch 2.13's Python device guard (`NeuronGuard`) can only name the device type, so the current index lives here,
as `torch.cuda` keeps it: `current_device`, `set_device`, the `device` / `device_of` context managers (re-exported by
`torch.neuron`). Under a launcher the current device starts at ``neuron:<LOCAL_RANK>``. `torch.accelerator`'s
device-index functions are routed here by `_patches._patch_accelerator_device_index`.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from . import envvars
from . import topology as _topology

__all__ = ["NeuronGuard", "current_device", "device", "device_count", "device_of", "set_device"]

_Device = int | str | torch.device | None


class NeuronGuard(torch._C._acc.DeviceGuard):
    """torch 2.13's Python device guard can only name the device type; the index lives on each tensor."""

    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def device_count() -> int:
    """Number of `neuron` devices (logical NeuronCores) visible to this process."""
    return _topology.topology().device_count


class _CurrentDevice(threading.local):
    index: int | None = None


_current = _CurrentDevice()


def _default_index() -> int:
    # Under a launcher (torchrun, accelerate) each process works on neuron:<LOCAL_RANK>: accelerate's MULTI_NEURON
    # path never calls set_device and hands DDP device_ids=[local_rank].
    local_rank = envvars.LOCAL_RANK.read()
    if local_rank is not None and local_rank.isdigit() and int(local_rank) < device_count():
        return int(local_rank)
    return 0


def current_device() -> int:
    """Index of the current `neuron` device of this thread."""
    if _current.index is None:
        _current.index = _default_index()
    return _current.index


def _get_device_index(device: _Device, optional: bool = True) -> int:
    """Resolve `device` (int, "neuron:1", torch.device or None for the current device) to an index."""
    if device is None:
        if not optional:
            raise ValueError("Expected a neuron device, got None")
        return current_device()
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "neuron":
            raise ValueError(f"Expected a neuron device, but got: {device}")
        return current_device() if device.index is None else device.index
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    raise ValueError(f"Expected a neuron device index, name or torch.device, but got: {device!r}")


def _check_index(index: int) -> int:
    count = device_count()
    if not 0 <= index < count:
        raise RuntimeError(
            f"Invalid device index {index} for 'neuron': there are {count} neuron devices (valid indices 0..{count - 1})"
        )
    return index


def set_device(device: _Device) -> None:
    """Set the current `neuron` device of this thread. A negative index is ignored, as in `torch.cuda`.

    Like `torch.cuda.set_device`, it initialises the runtime: torch reads `is_initialized()` as "a device was chosen"
    (DeviceMesh then keeps it, fake tensors of DTensor's sharding propagation take `current_device()`, not index 0)."""
    index = _get_device_index(device)
    if index >= 0:
        _current.index = _check_index(index)
        from .neuron._lazy import lazy_init  # here: the facade imports this module

        lazy_init()


class device:
    """Context manager that changes the current `neuron` device (`torch.cuda.device`'s twin)."""

    def __init__(self, device: Any) -> None:
        self.idx = -1 if device is None else _get_device_index(device)
        self.prev_idx = -1

    def __enter__(self) -> None:
        self.prev_idx = current_device()
        if self.idx >= 0 and self.idx != self.prev_idx:
            set_device(self.idx)

    def __exit__(self, *exc: object) -> bool:
        if self.idx >= 0 and self.idx != self.prev_idx:
            set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the device of tensor `obj` current (no-op for a non-neuron tensor)."""

    def __init__(self, obj: torch.Tensor) -> None:
        super().__init__(obj.get_device() if obj.device.type == "neuron" else -1)
