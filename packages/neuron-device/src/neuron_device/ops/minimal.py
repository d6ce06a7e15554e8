"""The minimal kernels a PrivateUse1 backend must provide itself (PyTorch's OpenReg list, plus what torch 2.13
cannot serve through the fallback): allocation, metadata-only views, resize, copies, scalar reads and the
"overrideable" convolution entry points."""

from __future__ import annotations

import functools
import math

import torch

from .. import allocator
from ..fallback import run_on_host
from ..simulation import ledger as _ledger
from ..storage import host_alias
from .registry import kernel

aten = torch.ops.aten
_CPU_KEYSET = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def _device_index(device) -> int:
    if device is None:
        return torch.neuron.current_device()
    return torch.neuron._check_index(torch.neuron._get_device_index(device))


def _lazy_init_and_index(device, pin_memory) -> int:
    if pin_memory:
        raise RuntimeError("Only dense CPU tensors can be pinned")  # CUDA's message for a pinned device tensor
    torch.neuron.init()
    return _device_index(device)


@kernel("aten::empty.memory_format")
def empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return allocator.empty(
        size, dtype=dtype or torch.get_default_dtype(), index=_lazy_init_and_index(device, pin_memory),
        memory_format=memory_format,
    )


@kernel("aten::empty_strided")
def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    if len(size) != len(stride):
        raise RuntimeError(
            f"dimensionality of sizes ({len(size)}) must match dimensionality of strides ({len(stride)})"
        )
    return allocator.empty(size, stride, dtype=dtype or torch.get_default_dtype(),
                           index=_lazy_init_and_index(device, pin_memory))


def _metadata_only(overload: torch._ops.OpOverload):
    """A view or `set_` op: the CPU kernel only rewrites sizes/strides/storage, which is valid for host memory."""

    # what `overload.redispatch` calls, bound to the CPU key in C: every view op (`t`, `transpose`, slicing: each
    # reaches `as_strided`) enters no Python frame of ours
    run = functools.partial(overload._handle.redispatch_boxed, _CPU_KEYSET)
    run.__name__ = f"{overload._schema.name.split('::')[1]}_metadata_only"
    return run


for _name in (
    "as_strided",
    "view",
    "_reshape_alias",
    "unfold",
    "view_as_real",
    "view_as_complex",
):
    _packet, _, _overload = _name.partition(".")
    kernel(f"aten::{_name}")(_metadata_only(getattr(getattr(aten, _packet), _overload or "default")))


def _check_storage_device(self: torch.Tensor, source) -> None:
    device = source.device
    if device.type != "neuron" or device.index != self.device.index:
        raise RuntimeError(
            f"Attempted to set the storage of a tensor on device \"{self.device}\" to a storage on different device "
            f"\"{device}\".  This is no longer allowed; the devices must match."
        )


def _set_from(overload: torch._ops.OpOverload):
    """`set_` rewrites metadata only; the source storage must live on the same `neuron` device."""

    def run(self, source, *args):
        _check_storage_device(self, source)
        return overload.redispatch(_CPU_KEYSET, self, source, *args)

    return run


for _name in ("source_Storage", "source_Storage_storage_offset", "source_Tensor"):
    kernel(f"aten::set_.{_name}")(_set_from(getattr(aten.set_, _name)))


@kernel("aten::set_")
def set_empty(self):
    empty = allocator.empty((0,), dtype=self.dtype, index=self.device.index)
    return aten.set_.source_Storage_storage_offset.redispatch(
        _CPU_KEYSET, self, empty.untyped_storage(), 0, (0,), (1,)
    )


def _contiguous_strides(size, memory_format) -> tuple[int, ...]:
    return torch.empty(size, device="meta", memory_format=memory_format or torch.contiguous_format).stride()


@kernel("aten::resize_")
def resize_(self, size, memory_format=None):
    """Resize in place. A same-size resize is a no-op (it must not reset strides: `out=` on views relies on it)."""
    size = tuple(size)
    if any(s < 0 for s in size):
        raise RuntimeError(f"Trying to create tensor with negative dimension {min(size)}: {list(size)}")
    if tuple(self.shape) == size and memory_format is None:
        return self
    strides = _contiguous_strides(size, memory_format)
    numel = math.prod(size)
    needed = (self.storage_offset() + numel) * self.element_size() if numel else 0
    storage = self.untyped_storage()
    old_nbytes = storage.nbytes()
    if needed > old_nbytes:
        # Grow the storage itself, as CPU and CUDA do: views sharing it keep seeing the same memory.
        allocator.resize(storage, needed)
        _fill_resized_deterministically(self, storage, old_nbytes)
    return aten.set_.source_Storage_storage_offset.redispatch(
        _CPU_KEYSET, self, storage, self.storage_offset(), size, strides
    )


def _fill_resized_deterministically(self: torch.Tensor, storage: torch.UntypedStorage, old_nbytes: int) -> None:
    """Under `torch.use_deterministic_algorithms(True)` with `fill_uninitialized_memory`, the grown part of the
    storage is filled as CPU and CUDA fill it (ATen's `fill_resize_deterministic_`): NaN for floating and complex
    dtypes, the dtype's maximum for integers (True for bool). The new bytes come from a uint8 buffer, whose own
    fill (255) read back as -1 for every signed integer dtype."""
    if not (torch.are_deterministic_algorithms_enabled() and torch.utils.deterministic.fill_uninitialized_memory):
        return
    dtype, itemsize = self.dtype, self.element_size()
    first, end = old_nbytes // itemsize, storage.nbytes() // itemsize
    grown = host_alias(torch.empty(0, dtype=dtype, device=self.device).set_(storage, first, (end - first,), (1,)))
    if dtype.is_floating_point or dtype.is_complex:
        grown.fill_(float("nan"))
    else:
        grown.fill_(True if dtype == torch.bool else torch.iinfo(dtype).max)


def _host(tensor: torch.Tensor) -> torch.Tensor:
    return host_alias(tensor) if tensor.device.type == "neuron" else tensor


@kernel("aten::_copy_from")
def _copy_from(self, dst, non_blocking=False):
    """Copy `self` into `dst`, either of which may be on the host: one memcpy between host buffers."""
    _host(dst).copy_(_host(self))
    _ledger.transfer("aten::_copy_from", self, dst)
    return dst


@kernel("aten::copy_")
def copy_(self, src, non_blocking=False):
    """Direct kernel: torch's generic `copy_` loops forever on a conjugate-view source of a Python backend."""
    if not isinstance(src, torch.Tensor):  # a wrapped Python number (GradScaler's `found_inf.copy_(...)` path)
        src = torch.tensor(src)
    _host(self).copy_(_host(src))
    _ledger.transfer("aten::copy_", src, self)
    return self


@kernel("aten::_copy_from_and_resize")
def _copy_from_and_resize(self, dst):
    if dst.shape != self.shape:
        dst.resize_(self.shape)
    return _copy_from(self, dst)


@kernel("aten::_to_copy")
def _to_copy(self, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    """`Tensor.to` with a copy: convert on the host, then adopt the result when it stays on a `neuron` device.

    torch's generic kernel pins the CPU destination of a `non_blocking` device-to-host copy, which needs a pinned
    allocator torch 2.13 cannot take from Python; host memory needs no pinning for the copy to be correct.
    """
    target = self.device if device is None else torch.device(device)
    if target.type == "neuron" and memory_format in (None, torch.preserve_format) and self.is_contiguous():
        # Device to device: take the device memory (and its capacity check) before any host memory. `size()`, not
        # `.shape`: a lazy module's uninitialized parameter refuses `.shape` but moves between devices.
        result = allocator.empty(self.size(), dtype=dtype or self.dtype, index=_device_index(target))
        host_alias(result).copy_(host_alias(self))
        _ledger.transfer("aten::_to_copy", self, result)
        return result
    result = aten._to_copy.default(
        host_alias(self), dtype=dtype, layout=layout, pin_memory=pin_memory, memory_format=memory_format
    )
    _ledger.transfer("aten::_to_copy", self, result, target)
    if target.type == "neuron":
        return allocator.adopt_tracked(result, _device_index(target))
    if target.type != "cpu":
        return result.to(target, non_blocking=non_blocking)
    return result


@kernel("aten::_local_scalar_dense")
def _local_scalar_dense(self):
    value = host_alias(self)
    _ledger.transfer("aten::_local_scalar_dense", self, value)
    return value.item()


@kernel("aten::convolution_overrideable")
def convolution_overrideable(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    return run_on_host(aten.convolution.default, input, weight, bias, stride, padding, dilation, transposed,
                       output_padding, groups)


@kernel("aten::convolution_backward_overrideable")
def convolution_backward_overrideable(grad_output, input, weight, stride, padding, dilation, transposed,
                                      output_padding, groups, output_mask):
    bias_sizes = [weight.shape[1] * groups if transposed else weight.shape[0]]
    return run_on_host(aten.convolution_backward.default, grad_output, input, weight, bias_sizes, stride, padding,
                       dilation, transposed, output_padding, groups, output_mask)


@kernel("aten::_has_compatible_shallow_copy_type")
def _has_compatible_shallow_copy_type(self, other):
    """CPU and `neuron` tensors are both plain strided TensorImpls, so `param.data = moved` may swap them.

    This is what makes `Module.to("neuron")` keep the same `Parameter` objects, as on CUDA: an optimizer built
    before the move must keep training the moved parameters.
    """
    return (
        self.layout == torch.strided
        and other.layout == torch.strided
        and self.device.type in ("cpu", "neuron")
        and other.device.type in ("cpu", "neuron")
    )


@kernel("aten::conj_physical_")
def conj_physical_(self):
    """torch's kernel is CompositeExplicitAutograd and calls the CPU's DispatchStub with the `neuron` device type (an
    internal assert): run it on the host alias, as every other op."""
    return run_on_host(aten.conj_physical_.default, self)


@kernel("aten::_lazy_clone")
def _lazy_clone(self):
    """torch makes a copy-on-write storage, which needs a C++ allocator's context (none for a Python backend:
    "Expected storage != nullptr"). A real clone has the same values; copy-on-write only saves the copy."""
    return aten.clone.default(self)
