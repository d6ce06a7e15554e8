"""Device memory is host memory: adopt a CPU buffer as `neuron` storage, and alias `neuron` memory back as CPU.

The simulator keeps every `neuron` tensor in host RAM, so a `neuron` tensor is an ordinary TensorImpl with a real
`data_ptr`, strides, offset and storage whose dispatch key is PrivateUse1. Both directions are zero-copy and go
through DLPack: torch maps the DLPack device type `kDLExtDev` to PrivateUse1 and `kDLCPU` to CPU, and the capsule's
deleter keeps the original owner alive, so a storage is freed exactly when its last user dies.

We use the legacy (unversioned) DLPack capsule that `torch._C._to_dlpack` produces and relabel its `DLTensor.device`
in place; the struct is declared with ctypes rather than poked at byte offsets. DLPack has no conjugate or negative
bit, so those are stripped before export and re-applied on the alias.
"""

from __future__ import annotations

import ctypes

import torch

__all__ = ["adopt", "host_alias", "host_aliases"]

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


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

_to_dlpack = torch._C._to_dlpack
_from_dlpack = torch._C._from_dlpack


def _relabel(tensor: torch.Tensor, device_type: int, device_id: int) -> torch.Tensor:
    capsule = _to_dlpack(tensor)
    device = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor")).device
    device.device_type = device_type
    device.device_id = device_id
    return _from_dlpack(capsule)


def adopt(cpu_tensor: torch.Tensor, index: int) -> torch.Tensor:
    """Return a `neuron:index` tensor over the same host memory as `cpu_tensor` (which must be dense CPU).

    The new tensor's storage keeps `cpu_tensor`'s storage alive; nothing is copied.
    """
    if cpu_tensor.is_conj() or cpu_tensor.is_neg():
        cpu_tensor = cpu_tensor.resolve_conj().resolve_neg()
    return _relabel(cpu_tensor, _KDL_EXT_DEV, index)


# While adaptive eager has ops queued (`concatenation`), the callable that executes them: every host read of device
# memory comes through `host_alias`, so this is where queued results get written before anyone looks at them.
flush_pending = None


def host_alias(tensor: torch.Tensor) -> torch.Tensor:
    """Return a CPU tensor that aliases the memory of the `neuron` tensor `tensor` (same sizes, strides, offset)."""
    if flush_pending is not None:
        flush_pending()
    conj, neg = tensor.is_conj(), tensor.is_neg()
    if not (conj or neg):
        return _relabel(tensor, _KDL_CPU, 0)
    # Strip the lazy bits (metadata-only views), export the raw memory, then put the bits back on the alias.
    raw = tensor
    if conj:
        raw = raw.conj()
    if neg:
        raw = raw._neg_view()
    alias = _relabel(raw, _KDL_CPU, 0)
    if neg:
        alias = alias._neg_view()
    if conj:
        alias = alias.conj()
    return alias


def host_aliases(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """`host_alias` of each tensor of a list."""
    return [host_alias(t) for t in tensors]
