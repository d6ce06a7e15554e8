"""Bookkeeping of an op that ran on fake `neuron` tensors (plan mode): what a real run's kernel would charge.

In a real run each op's kernel computes on the host and then charges the simulator: the op catalogue's cost on the
current stream (`kernels.charge`, after `fallback.admit`), a DMA for copies (`kernels.transfer`), and the device
allocator for every new storage (`allocator.adopt_tracked` / `allocator.empty`). Plan mode runs the op's fake kernel
instead (no host memory) and hands the result here, which makes the same calls with the same shapes and dtypes, so
a plan is charged exactly what the run would be: plan mode changes what is stored, not what is charged. An op a
real run runs as its composite kernel (`randn`, `zeros_like`: no device kernel of its own) reaches here as the ops
that kernel calls: the planner runs the composite kernel on the fakes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from .. import allocator as _allocator
from .. import fallback as _fallback
from ..ops import registry as _registry
from ..ops.call import overload_record, records
from . import ledger as _ledger

__all__ = ["account", "resize_storage", "track_storage"]

_aten = torch.ops.aten
# Direct kernels of a real run that charge no device time: allocation, storage plumbing, type queries.
_UNCHARGED = frozenset({
    _aten.empty.memory_format, _aten.empty_strided.default, _aten.set_.source_Storage_storage_offset,
    _aten.set_.source_Storage, _aten.set_.source_Tensor, _aten.set_.default, _aten.resize_.default,
    _aten._has_compatible_shallow_copy_type.default, _aten.detach.default, _aten.alias.default,
    _aten.lift_fresh.default,
})
# Copies: a DMA (device<->device through HBM, host<->device over the host link), as the real copy kernels charge.
_COPIES = {_aten._to_copy.default: "aten::_to_copy", _aten.copy_.default: "aten::copy_",
           _aten._copy_from.default: "aten::_copy_from"}


def _neuron_tensors(value: Any):
    if isinstance(value, torch.Tensor):
        if value.device.type == "neuron":
            yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _neuron_tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _neuron_tensors(item)


def track_storage(storage: torch.UntypedStorage, index: int) -> bool:
    """Charge `storage` to device `index`'s allocator model unless it already holds a block (an alias, or charged
    before); it is freed when the storage dies, as a real one is. True when it was charged now."""
    if _allocator._holding_of(storage) is not None:
        return False
    nbytes = storage.nbytes()
    allocator = _allocator.device(index)
    _allocator._bind(storage, allocator, allocator.malloc(nbytes) if nbytes else None)
    return True


def resize_storage(storage: torch.UntypedStorage, nbytes: int) -> None:
    """A planned storage resized in place to `nbytes` (FSDP2 frees its unsharded parameters so, and refills them):
    its block in the allocator model follows, as `allocator.resize` moves a real storage's (the new block first)."""
    holding = _allocator._holding_of(storage)
    if holding is None:  # not a planned device storage
        return
    block = holding.allocator.malloc(nbytes) if nbytes else None
    previous, holding.block = holding.block, block
    if previous is not None:
        holding.allocator.free(previous)


def _device_index(tensors: list[torch.Tensor]) -> int:
    for tensor in tensors:
        if tensor.device.index is not None:
            return tensor.device.index
    return torch.neuron.current_device()


def account(op: torch._ops.OpOverload, args: tuple, kwargs: dict, result: Any) -> list[torch.UntypedStorage]:
    """Charge one call of `op` on fake tensors as its real kernel would; return the storages it newly allocated."""
    inputs = list(_neuron_tensors(args)) + list(_neuron_tensors(kwargs))
    outputs = list(_neuron_tensors(result))
    if not inputs and not outputs:
        return []
    index = _device_index(outputs or inputs)
    if op is _aten._local_scalar_dense.default:  # `.item()`: one element copied to the host, which waits for it
        _ledger.transfer("aten::_local_scalar_dense", args[0], args[0], torch.device("cpu"))
    elif op in _COPIES:
        if op is _aten._to_copy.default:
            _ledger.transfer(_COPIES[op], args[0], result, result.device)
        else:
            src, dst = (args[0], args[1]) if op is _aten._copy_from.default else (args[1], args[0])
            if isinstance(src, torch.Tensor):
                _ledger.transfer(_COPIES[op], src, dst)
    elif op not in _UNCHARGED and op.namespace == "aten":
        estimator = _registry.plugin_estimator(op.name())
        seconds = None
        if estimator is not None:  # e.g. neuron-nki's attention: the NKI kernel's latency for the signature
            with _disable_current_modes():  # it may simulate the kernel once on real sample tensors
                seconds = estimator(*args, **kwargs)
        if seconds is not None:
            _ledger.record_kernel(op.name(), index, _ledger.signature((*args, *kwargs.values())), seconds)
        else:
            record = records.get(op) or overload_record(op)
            if record.info.engine != "view":  # a fallback only where the device has no kernel of its own (`histc`)
                if record.name not in _registry.kernels:
                    _fallback.admit(op)
                _ledger.charge(record, index, args, kwargs, result)
    fresh = []
    for tensor in outputs:
        storage = tensor.untyped_storage()
        if track_storage(storage, tensor.device.index if tensor.device.index is not None else index):
            fresh.append(storage)
    return fresh
