"""Device memory is host memory: adopt a CPU buffer as `neuron` storage, and alias `neuron` memory back as CPU.

The simulator keeps every `neuron` tensor in host RAM, so a `neuron` tensor is an ordinary TensorImpl with a real
`data_ptr`, strides, offset and storage whose dispatch key is PrivateUse1. Both directions are zero-copy and go
through DLPack: torch maps the DLPack device type `kDLExtDev` to PrivateUse1 and `kDLCPU` to CPU, and the capsule's
deleter keeps the original owner alive, so a storage is freed exactly when its last user dies.

We use the legacy (unversioned) DLPack capsule that `torch._C._to_dlpack` produces and relabel its `DLTensor.device`
in place. Every op relabels its inputs and result, so the relabel is one 64-bit store: the `DLDevice` word, at the
offset the ctypes declaration of `DLTensor` gives, of the struct the capsule points to (CPython's capsule keeps that
pointer right after the object header; checked against `PyCapsule_GetPointer` at import). DLPack has no conjugate
or negative bit, so those are stripped before export and re-applied on the alias.

**One host storage per device storage.** PyTorch's overlap and alias checks (`x[1:] = x[:-1]`, `out=` that overlaps
an input, an in-place op that would resize an input) compare *storages*: two aliases in storages of their own look
independent to the CPU kernels, which then compute garbage instead of raising. So `adopt` makes, once, a CPU storage
over the device storage's memory (`_HOST`, kept in the device storage's `__dict__`, which torch preserves with the
storage), and every host alias of every view of that device storage is a view of that one CPU storage. Lifetime:
the device storage owns its CPU twin (attribute) and the memory (DLPack context, which holds the twin's tensor);
the twin references nothing back, so there is no cycle, and a host alias that outlives its device storage keeps the
memory alive. The twin has a fixed size (a DLPack import is not resizable), so no CPU kernel can move device
memory; `swap_memory` moves the twin with the memory (`storage.resize_`), `take_memory` gives a storage new memory
with a twin over it (adaptive eager's results that take a fused run's memory). Adaptive eager's queued results are
adopted without a twin (`adopt_untwinned`): nothing reads them before the flush, which gives the live ones theirs.
"""

from __future__ import annotations

import ctypes
import sys

import torch
from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

from .barrier import flush_barrier

__all__ = [
    "adopt", "adopt_untwinned", "give_twin", "host_alias", "host_aliases", "kernel_input", "replace_memory",
    "swap_memory", "take_memory",
]

_KDL_CPU = 1
_KDL_EXT_DEV = 12  # torch maps this DLPack device type to PrivateUse1


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_to_dlpack = torch._C._to_dlpack
_from_dlpack = torch._C._from_dlpack

_POINTER_OFFSET = object.__basicsize__  # a PyCapsule: the object header, then `void *pointer`
_DEVICE_OFFSET = _DLTensor.device.offset
_pointer_at = ctypes.c_void_p.from_address
_word_at = ctypes.c_uint64.from_address  # a DLDevice (two int32) is one 64-bit word


def _device_word(device_type: int, device_id: int) -> int:
    """A DLDevice as the 64-bit word it is in memory."""
    return int.from_bytes(bytes(_DLDevice(device_type, device_id)), sys.byteorder)


def _check_layout() -> None:
    """The relabel's two assumptions, checked once on a real capsule: the capsule pointer's place and the word."""
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    capsule = _to_dlpack(torch.empty(0))
    pointer = get_pointer(capsule, b"dltensor")
    device = _DLTensor.from_address(pointer).device
    expected = (
        ctypes.sizeof(_DLDevice) == 8
        and _pointer_at(id(capsule) + _POINTER_OFFSET).value == pointer
        and _word_at(pointer + _DEVICE_OFFSET).value == _device_word(device.device_type, device.device_id)
    )
    if not expected:
        raise ImportError("neuron_device.storage: unexpected PyCapsule or DLTensor layout in this Python build")


_check_layout()
_CPU = _device_word(_KDL_CPU, 0)
# `neuron:i`'s word is `_NEURON_0 + i * _NEURON_STEP` (device_id is a fixed int32 field of the word, whatever the byte
# order): arithmetic per adopted result, where a cached call touches more memory than the rest of the relabel
_NEURON_0 = _device_word(_KDL_EXT_DEV, 0)
_NEURON_STEP = _device_word(_KDL_EXT_DEV, 1) - _NEURON_0


def _relabel(tensor: torch.Tensor, device_word: int) -> torch.Tensor:
    """`tensor` re-imported through DLPack as the device `device_word` (`_device_word`): same memory, same owner."""
    capsule = _to_dlpack(tensor)
    _word_at(_pointer_at(id(capsule) + _POINTER_OFFSET).value + _DEVICE_OFFSET).value = device_word
    return _from_dlpack(capsule)


def _relabel_fake(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A fake tensor (plan mode: shape, no memory) as `device`: a fake of the same sizes, strides and offset in a
    storage of its own of the same size, as `_relabel` gives the same memory a storage of its own (the device
    allocator model then frees a device storage when its device tensors die, whatever its host aliases do)."""
    with in_kernel_invocation_manager(tensor.fake_mode):
        storage = torch.empty(tensor.untyped_storage().nbytes(), dtype=torch.uint8, device="meta")
        meta = storage.view(tensor.dtype).as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())
    return FakeTensor(tensor.fake_mode, meta, device)


_HOST = "_neuron_host"  # attribute of a device storage: {dtype: CPU tensor of its CPU twin storage}, one storage


def adopt(cpu_tensor: torch.Tensor, index: int) -> torch.Tensor:
    """Return a `neuron:index` tensor over the same host memory as `cpu_tensor` (which must be dense CPU).

    The new tensor's storage keeps `cpu_tensor`'s storage alive; nothing is copied.
    """
    if isinstance(cpu_tensor, FakeTensor):
        return _relabel_fake(cpu_tensor, torch.device("neuron", index))
    if cpu_tensor.is_conj() or cpu_tensor.is_neg():
        cpu_tensor = cpu_tensor.resolve_conj().resolve_neg()
    twin = _from_dlpack(_to_dlpack(cpu_tensor))  # the same memory in a fixed-size CPU storage of its own
    capsule = _to_dlpack(twin)  # `_relabel(twin, ...)`, inline: every op result comes here
    _word_at(_pointer_at(id(capsule) + _POINTER_OFFSET).value + _DEVICE_OFFSET).value = (
        _NEURON_0 + index * _NEURON_STEP)
    tensor = _from_dlpack(capsule)
    # `as_strided` places a view by its absolute storage offset, so the twin itself is a base for host aliases of
    # its dtype, whatever its own shape: no 1-d tensor needs making here (other dtypes get one, in `_view_of_twin`)
    setattr(tensor.untyped_storage(), _HOST, {twin.dtype: twin})
    return tensor


def adopt_untwinned(cpu_tensor: torch.Tensor, index: int) -> torch.Tensor:
    """`adopt` of a dense CPU tensor without the host twin, for memory nothing reads on the host until `give_twin`
    (adaptive eager's queued results: every host read passes the flush barrier, and the flush gives a twin to the
    results it leaves alive; most die unread, so making theirs at once was wasted)."""
    return _relabel(cpu_tensor, _NEURON_0 + index * _NEURON_STEP)


def give_twin(storage: torch.UntypedStorage, cpu_tensor: torch.Tensor) -> None:
    """Give `storage`, adopted without a twin from `cpu_tensor` (`adopt_untwinned`), the host twin `adopt` gives
    (nothing to do if it has one: it took other memory, `take_memory`, or got its twin already)."""
    if _HOST not in storage.__dict__:
        _set_twin(storage, cpu_tensor)


def take_memory(storage: torch.UntypedStorage, cpu_tensor: torch.Tensor) -> None:
    """Move the memory of the dense CPU tensor `cpu_tensor` (as many bytes) into the device storage `storage`, with
    its host twin: `swap_memory(storage, adopt(cpu_tensor, ...).untyped_storage())` minus the adopted storage's own
    twin. The storage keeps its identity; its old memory is freed with its last other user."""
    storage._swap_data_ptr_(_relabel(cpu_tensor, _NEURON_0 + storage.device.index * _NEURON_STEP).untyped_storage())
    _set_twin(storage, cpu_tensor)


def _set_twin(storage: torch.UntypedStorage, cpu_tensor: torch.Tensor) -> None:
    twin = _from_dlpack(_to_dlpack(cpu_tensor))  # the same memory in a fixed-size CPU storage of its own
    setattr(storage, _HOST, {twin.dtype: twin})


def _whole(storage: torch.UntypedStorage, dtype: torch.dtype) -> torch.Tensor:
    """A 1-d `dtype` tensor over all of a CPU storage: host aliases of that dtype are views of it."""
    return torch.empty(0, dtype=dtype).set_(storage, 0, (storage.nbytes() // dtype.itemsize,), (1,))


def swap_memory(storage: torch.UntypedStorage, other: torch.UntypedStorage) -> None:
    """`storage._swap_data_ptr_(other)`, moving each memory's host twin along with it."""
    storage._swap_data_ptr_(other)
    mine, theirs = storage.__dict__.pop(_HOST, None), other.__dict__.pop(_HOST, None)
    if theirs is not None:
        setattr(storage, _HOST, theirs)
    if mine is not None:
        setattr(other, _HOST, mine)


def replace_memory(storage: torch.UntypedStorage, fresh: torch.UntypedStorage) -> torch.UntypedStorage:
    """Move the memory of the adopted storage `fresh` into `storage`: the storage object stays the same, and every
    tensor and view of it sees the new memory. Returns the storage now holding the old memory (freed when it dies).
    `swap_memory` (`_swap_data_ptr_`) only swaps with an empty storage, hence the empty go-between."""
    holder = adopt(torch.empty(0, dtype=torch.uint8), storage.device.index).untyped_storage()
    swap_memory(storage, holder)  # storage: empty; holder: the old bytes
    swap_memory(storage, fresh)  # storage: the new bytes
    return holder


def host_alias(tensor: torch.Tensor) -> torch.Tensor:
    """Return a CPU tensor that aliases the memory of the `neuron` tensor `tensor` (same sizes, strides, offset)."""
    if isinstance(tensor, FakeTensor):
        return _relabel_fake(tensor, torch.device("cpu"))
    # every host read of device memory comes through here: adaptive eager's queued results are written first
    flush_barrier()
    twins = getattr(tensor.untyped_storage(), _HOST, None)
    if twins is None:
        return _alias_of_own_storage(tensor)
    return _view_of_twin(tensor, twins)


def kernel_input(tensor: torch.Tensor) -> torch.Tensor:
    """The host form of an input of one CPU kernel call that reads it or writes its data in place (the fast path;
    the caller called `flush_barrier()` for the op): the twin itself when `tensor` has its exact layout, as an op's
    result has, else a view of the twin (`host_alias`).

    Handing out the twin, not a fresh view, saves the `as_strided` of most inputs, the costliest step of an alias
    after a large kernel has evicted the host's caches. It is safe because such a call never changes its inputs'
    sizes, strides or storage; callers that may (an `out=` argument, `set_`) take `host_alias`, a view of their own.
    """
    twins = getattr(tensor.untyped_storage(), _HOST, None)
    if twins is None:
        return _alias_of_own_storage(tensor)
    twin = twins.get(tensor.dtype)
    if twin is None or tensor.is_neg() or tensor.is_conj():
        return _view_of_twin(tensor, twins)
    size, stride, offset = tensor.size(), tensor.stride(), tensor.storage_offset()
    if offset == twin.storage_offset() and size == twin.size() and stride == twin.stride():
        return twin
    return twin.as_strided(size, stride, offset)  # `_view_of_twin`, on the layout read above (a view's input)


def _view_of_twin(tensor: torch.Tensor, twins: dict[torch.dtype, torch.Tensor]) -> torch.Tensor:
    dtype = tensor.dtype
    base = twins.get(dtype)
    if base is None:
        base = twins[dtype] = _whole(next(iter(twins.values())).untyped_storage(), dtype)
    alias = base.as_strided(tensor.size(), tensor.stride(), tensor.storage_offset())
    if tensor.is_neg():
        alias = alias._neg_view()
    if tensor.is_conj():
        alias = alias.conj()
    return alias


def _alias_of_own_storage(tensor: torch.Tensor) -> torch.Tensor:
    """The host alias of a storage made outside `adopt` (no twin): an alias of its own, through DLPack."""
    conj, neg = tensor.is_conj(), tensor.is_neg()
    if not (conj or neg):
        return _relabel(tensor, _CPU)
    # Strip the lazy bits (metadata-only views), export the raw memory, then put the bits back on the alias.
    raw = tensor
    if conj:
        raw = raw.conj()
    if neg:
        raw = raw._neg_view()
    alias = _relabel(raw, _CPU)
    if neg:
        alias = alias._neg_view()
    if conj:
        alias = alias.conj()
    return alias


def host_aliases(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """`host_alias` of each tensor of a list."""
    return [host_alias(t) for t in tensors]
