"""``neuronxcc.nki.typing`` (``nt``): parameter annotations of legacy kernels, and input placeholders.

``nt.mutable_tensor`` marks an HBM parameter the kernel may modify; the legacy compiler requires such a
parameter to be returned (``err_mutable_parameter_not_returned``), and so does our launcher. ``nt.tensor`` is the
plain tensor annotation. Subscripted, ``nt.tensor[[8192, 4096], nl.bfloat16]`` is a :class:`TensorType` carrying
its shape and dtype: an annotation, or a placeholder argument to ``nki.benchmark`` (the tutorials' ``__main__``
blocks pass these instead of arrays; the simulator generates inputs of that shape and dtype).
"""

from __future__ import annotations

import numpy as np

from nki._dtypes import as_dtype, is_float

__all__ = ["TensorType", "mutable_tensor", "scalar", "tensor"]


class TensorType:
    """``nt.tensor[shape, dtype]``: a tensor's type. As a kernel argument it stands for an input of that type."""

    __slots__ = ("dtype", "mutable", "shape")

    def __init__(self, shape: tuple[int, ...] | None, dtype, mutable: bool = False):
        self.shape = shape
        self.dtype = None if dtype is None else as_dtype(dtype)
        self.mutable = mutable

    def __repr__(self) -> str:
        kind = "mutable_tensor" if self.mutable else "tensor"
        return f"nt.{kind}[{list(self.shape) if self.shape is not None else '?'}, {self.dtype}]"

    def __nki_placeholder__(self, rng: np.random.Generator) -> np.ndarray:
        """An input of this type: standard-normal values (small integers for integer dtypes)."""
        if self.shape is None or self.dtype is None:
            raise TypeError(f"{self!r} needs both a shape and a dtype to stand for an input, e.g. "
                            "nt.tensor[[128, 512], nl.float32]")
        if is_float(self.dtype):
            return rng.standard_normal(self.shape, dtype=np.float32).astype(self.dtype)
        return rng.integers(0, 8, self.shape).astype(self.dtype)


def _parse(item) -> tuple[tuple[int, ...] | None, object]:
    """``[shape, dtype]``, ``[d0, d1, ...]`` (shape only) or ``[dtype]``."""
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], (list, tuple)):
        return tuple(int(s) for s in item[0]), item[1]
    if isinstance(item, (list, tuple)) and all(isinstance(s, (int, np.integer)) for s in item):
        return tuple(int(s) for s in item), None
    if isinstance(item, (int, np.integer)):
        return (int(item),), None
    return None, item


class _Annotation:
    """A marker type; subscripting it gives a :class:`TensorType`."""

    _mutable = False

    def __class_getitem__(cls, item):
        shape, dtype = _parse(item)
        return TensorType(shape, dtype, cls._mutable)


class tensor(_Annotation):
    """An NKI tensor parameter (read-only unless annotated :class:`mutable_tensor`)."""


class mutable_tensor(tensor):
    """An HBM tensor parameter the kernel writes to; it must be returned by the kernel."""

    _mutable = True


class scalar:
    """A compile-time scalar parameter."""

    def __class_getitem__(cls, item):
        return cls
