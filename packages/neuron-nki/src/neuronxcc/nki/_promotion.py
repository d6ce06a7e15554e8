"""Dtype promotion under the legacy NKI 0.1 rules (`promote`), shared by `language` and `isa`: a leaf, so the
instruction module needs no import of the language module."""

from __future__ import annotations

import numpy as np

from nki import extension as _ext
from nki.extension import NkiTensor, bfloat16, bool_, float32, int16, int32, uint8

__all__ = ["promote"]


def _dtype_of(x) -> np.dtype:
    """Operand dtype; weak Python scalars count as the widest hardware type (bool→uint8, int→int32, float→fp32)."""
    if isinstance(x, NkiTensor):
        return x.dtype
    if isinstance(x, (bool, np.bool_)):
        return uint8
    if isinstance(x, np.generic):
        return x.dtype
    if isinstance(x, int):
        return int32
    return float32


def _promote2(a: np.dtype, b: np.dtype) -> np.dtype:
    if a == b:
        return a
    a = uint8 if a == bool_ else a
    b = uint8 if b == bool_ else b
    fa, fb = _ext.is_float(a), _ext.is_float(b)
    if fa != fb:
        return a if fa else b
    if fa:
        pair = {_ext.nki_name(a), _ext.nki_name(b)}
        if pair == {"float16", "bfloat16"}:
            return float32
        if pair == {"float8_e4m3", "float8_e5m2"}:
            return bfloat16
        if "tfloat32" in pair and "float32" in pair:
            return float32
        return a if a.itemsize >= b.itemsize else b
    if (a.kind == "i") == (b.kind == "i"):
        return a if a.itemsize >= b.itemsize else b
    s, u = (a, b) if a.kind == "i" else (b, a)
    if s.itemsize > u.itemsize:
        return s
    return {1: int16, 2: int32}.get(u.itemsize, float32)


def promote(*xs) -> np.dtype:
    """Result dtype of an arithmetic operation on ``xs`` under the NKI 0.1 promotion rules."""
    out = _dtype_of(xs[0])
    for x in xs[1:]:
        out = _promote2(out, _dtype_of(x))
    return out
