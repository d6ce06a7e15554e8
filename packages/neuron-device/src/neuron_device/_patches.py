"""Every patch of torch internals, in one place, each with its reason. Applied once by `register()`.

torch 2.13 cannot register a c10 allocator for a Python PrivateUse1 backend, so every torch path that asks the C++
allocator for `neuron` memory dereferences a null allocator and kills the process. Those paths all meet in a few
storage entry points, patched here to allocate through `torch.empty` (our allocator) instead:

* `UntypedStorage(n, device="neuron")`, which also serves `TypedStorage(..., device=...)`, `storage.clone()`
  (and so `copy.deepcopy` of tensors), `storage.to(device)` / `storage.neuron()`, and every `torch.load` onto a
  `neuron` device (torch's own deserializer for the PrivateUse1 tag does `storage.to(device)`). Fixing the one
  constructor fixes them all, so `torch.serialization` needs no deserializer of ours.
* `UntypedStorage.new()`, `UntypedStorage.resize_()` (the C++ side asks the hooks for `resizePrivateUse1Bytes`,
  which Python cannot provide).

Pinned memory has no Python-registrable allocator either; `Tensor.pin_memory()` gets a clear error instead of torch's
message about C++ hook registration.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import allocator

__all__ = ["apply_all"]

_NEURON = "neuron"
_applied = False


def _neuron_device(device) -> torch.device | None:
    """`device` as a torch.device if it names a `neuron` device, else None."""
    if device is None:
        return None
    device = torch.device(device)
    return device if device.type == _NEURON else None


def _allocate_storage(nbytes: int, device: torch.device) -> torch.UntypedStorage:
    return torch.empty(nbytes, dtype=torch.uint8, device=device).untyped_storage()


def _patch_storage_constructor() -> None:
    """`torch.UntypedStorage(size_or_sequence, device="neuron")` allocates through our allocator, not c10's."""
    construct = torch.UntypedStorage.__new__

    def __new__(cls, *args, device=None, **kwargs):
        target = _neuron_device(device)
        if target is None:
            if device is not None:
                kwargs["device"] = device
            return construct(cls, *args, **kwargs)
        if cls is not torch.UntypedStorage:
            raise NotImplementedError(
                f"{cls.__qualname__}(..., device='{target}'): subclasses of UntypedStorage cannot be allocated on "
                "neuron; allocate a torch.UntypedStorage instead"
            )
        if "allocator" in kwargs:
            raise NotImplementedError(
                "UntypedStorage(..., allocator=...) on neuron: the neuron device always uses its own allocator"
            )
        if not args:
            return _allocate_storage(0, target)
        size = args[0]
        if len(args) == 1 and isinstance(size, int) and not isinstance(size, bool):
            return _allocate_storage(size, target)
        host = construct(cls, *args, **kwargs)  # torch parses and validates the arguments (e.g. a byte sequence)
        return _allocate_storage(host.nbytes(), target).copy_(host)

    torch.UntypedStorage.__new__ = staticmethod(__new__)


def _patch_storage_new() -> None:
    """`storage.new()` (an empty storage on the same device) asks the C++ allocator."""
    new = torch.UntypedStorage.new

    def storage_new(self: torch.UntypedStorage) -> torch.UntypedStorage:
        if self.device.type == _NEURON:
            return _allocate_storage(0, self.device)
        return new(self)

    _replace(torch.UntypedStorage, "new", new, storage_new)


def _patch_storage_resize() -> None:
    """`storage.resize_(n)` on neuron raises from C++ (no `resizePrivateUse1Bytes` hook); FSDP2 needs it to work."""
    resize_ = torch.UntypedStorage.resize_

    def storage_resize_(self: torch.UntypedStorage, size: int) -> torch.UntypedStorage:
        if self.device.type != _NEURON:
            return resize_(self, size)
        if not isinstance(size, int) or isinstance(size, bool):
            raise TypeError(f"resize_(): argument 'size' must be int, not {type(size).__name__}")
        allocator.resize(self, size)
        return self

    _replace(torch.UntypedStorage, "resize_", resize_, storage_resize_)


def _patch_pin_memory() -> None:
    """Pinning a CPU tensor asks the current accelerator (neuron) for a pinned-memory allocator, which a Python
    backend cannot register in torch 2.13: say that, instead of torch's message about C++ hook registration."""
    pin_memory = torch.Tensor.pin_memory

    def tensor_pin_memory(self: torch.Tensor, device=None) -> torch.Tensor:
        if self.device.type == "cpu" and (device is None or _neuron_device(device) is not None):
            raise RuntimeError(
                "pin_memory(): pinned host memory is not implemented for the neuron device yet (torch 2.13 cannot "
                "register a pinned-memory allocator from Python). Leave memory unpinned, e.g. "
                "DataLoader(..., pin_memory=False); the simulator's device memory is host memory anyway."
            )
        return pin_memory(self) if device is None else pin_memory(self, device)

    _replace(torch.Tensor, "pin_memory", pin_memory, tensor_pin_memory)


def _patch_clear_autocast_cache() -> None:
    """Leaving the outermost autocast region calls `torch.clear_autocast_cache()`, which clears only the C++ weight
    cache: also clear the cache of the Python `neuron` autocast policies (`autocast.py`)."""
    from . import autocast

    clear = torch.clear_autocast_cache

    def clear_autocast_cache() -> None:
        clear()
        autocast.clear_cache()

    clear_autocast_cache.__doc__ = clear.__doc__
    torch.clear_autocast_cache = clear_autocast_cache


def _replace(owner: type, name: str, original: Callable, replacement: Callable) -> None:
    """Install `replacement` as `owner.name`, keeping the original's name and docstring for help() and Sphinx."""
    replacement.__name__ = name
    replacement.__qualname__ = f"{owner.__qualname__}.{name}"
    replacement.__doc__ = original.__doc__
    setattr(owner, name, replacement)


_PATCHES = (
    _patch_storage_constructor,
    _patch_storage_new,
    _patch_storage_resize,
    _patch_pin_memory,
    _patch_clear_autocast_cache,
)


def apply_all() -> None:
    """Apply all patches (idempotent)."""
    global _applied
    if _applied:
        return
    for patch in _PATCHES:
        patch()
    _applied = True
