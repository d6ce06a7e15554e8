"""The legacy typed API on `torch.neuron`, as `torch.cuda` has it: `FloatTensor`, … and `FloatStorage`, ….

Libraries still check `isinstance(t, torch.cuda.FloatTensor)`-style types and `t.storage_type()`. torch builds
`torch.cuda`'s tensor types in C++ for CUDA only (`torch/csrc/tensor/python_tensor.cpp`), but its storage side is
generic over PrivateUse1: `TypedStorage._get_legacy_storage_class` looks `<Name>Storage` up on `torch.neuron`, and a
legacy storage class's isinstance check takes the device from the module the class names (`_get_device_from_module`),
so the storage classes are torch's `_LegacyStorage` subclasses in module `torch.neuron`, like `torch.cuda`'s. The
tensor types are Python classes whose isinstance check matches a strided `neuron` tensor of their dtype (as the C++
types match a CUDA tensor's backend and scalar type), and whose constructor is the legacy one: sizes give an
uninitialised tensor, a sequence gives its data, on the current `neuron` device.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._utils import classproperty
from torch.storage import _LegacyStorage, _warn_typed_storage_removal

_TENSOR_TYPES = {
    "DoubleTensor": torch.float64, "FloatTensor": torch.float32, "BFloat16Tensor": torch.bfloat16,
    "HalfTensor": torch.float16, "LongTensor": torch.int64, "IntTensor": torch.int32, "ShortTensor": torch.int16,
    "CharTensor": torch.int8, "ByteTensor": torch.uint8, "BoolTensor": torch.bool,
}
_STORAGE_TYPES = {
    **{name.replace("Tensor", "Storage"): dtype for name, dtype in _TENSOR_TYPES.items()},
    "ComplexFloatStorage": torch.complex64, "ComplexDoubleStorage": torch.complex128,
}

__all__ = sorted([*_TENSOR_TYPES, *_STORAGE_TYPES])


class _NeuronLegacyStorage(_LegacyStorage):
    """A `torch.neuron.<Name>Storage`: what `t.storage_type()` returns for a `neuron` tensor."""

    @classmethod
    def from_buffer(cls, *args: Any, **kwargs: Any) -> Any:
        _warn_typed_storage_removal()
        raise RuntimeError("from_buffer: Not available for neuron storage")

    @classmethod
    def _new_with_weak_ptr(cls, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("_new_with_weak_ptr: Not available for neuron storage")

    @classmethod
    def _new_shared_filename(cls, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("_new_shared_filename: Not available for neuron storage")


def _storage_class(name: str, dtype: torch.dtype) -> type:
    def dtype_property(cls: type) -> torch.dtype:
        _warn_typed_storage_removal()
        return dtype

    return type(name, (_NeuronLegacyStorage,), {
        "__module__": "torch.neuron",  # names the device to torch's `_get_device_from_module`
        "__qualname__": name,
        "dtype": classproperty(dtype_property),
        "_dtype": classproperty(lambda cls: dtype),
    })


class _TensorTypeMeta(type):
    dtype: torch.dtype

    def __instancecheck__(cls, instance: Any) -> bool:
        return (isinstance(instance, torch.Tensor) and instance.device.type == "neuron"
                and instance.layout == torch.strided and instance.dtype == cls.dtype)


class _NeuronTensorType(metaclass=_TensorTypeMeta):
    """A `torch.neuron.<Name>Tensor`: an isinstance check, and the legacy constructor."""

    dtype: torch.dtype
    is_cuda = False
    is_sparse = False

    def __new__(cls, *args: Any, device: Any = None) -> torch.Tensor:  # type: ignore[misc]
        target = torch.device("neuron", torch.neuron.current_device()) if device is None else torch.device(device)
        if target.type != "neuron":
            raise RuntimeError(f"legacy constructor expects device type: neuron but device type: {target.type} "
                               "was passed")
        if len(args) == 1 and not isinstance(args[0], (int, torch.SymInt)) and not isinstance(args[0], torch.Size):
            return torch.tensor(args[0], dtype=cls.dtype, device=target)
        return torch.empty(*args or (0,), dtype=cls.dtype, device=target)


def _tensor_class(name: str, dtype: torch.dtype) -> type:
    return _TensorTypeMeta(name, (_NeuronTensorType,), {"__module__": "torch.neuron", "__qualname__": name,
                                                        "dtype": dtype})


globals().update({name: _tensor_class(name, dtype) for name, dtype in _TENSOR_TYPES.items()})
globals().update({name: _storage_class(name, dtype) for name, dtype in _STORAGE_TYPES.items()})
