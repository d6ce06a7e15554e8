"""NKI data types as real NumPy dtypes, and the storage-precision policy.

``nl.bfloat16``/``nl.float8_*`` are ``ml_dtypes`` dtypes, so kernels and tests can build arrays with them.
``tfloat32`` and the x4-packed MX types have no NumPy scalar type: they are float32 / uint32 dtypes tagged with
NumPy dtype metadata (``{"nki": name}``), which keeps them real dtypes while letting the simulator tell them apart.

Storage policy (``NKI_PRECISE_FP``): when precise (default for the current API), on-chip and HBM tensors store
their exact dtype, so every write rounds to bf16/fp8 like the hardware. When imprecise (legacy default), narrow
float types are stored as float32 and only *report* their logical dtype.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from . import envvars

bool_ = np.dtype(np.bool_)
int8 = np.dtype(np.int8)
int16 = np.dtype(np.int16)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
uint8 = np.dtype(np.uint8)
uint16 = np.dtype(np.uint16)
uint32 = np.dtype(np.uint32)
uint64 = np.dtype(np.uint64)
float16 = np.dtype(np.float16)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
tfloat32 = np.dtype(np.float32, metadata={"nki": "tfloat32"})
float8_e4m3 = np.dtype(ml_dtypes.float8_e4m3)  # inf-carrying 1-4-3 (max 240), see reference/nki.md §2.2 note
float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)
float8_e8m0fnu = np.dtype(ml_dtypes.float8_e8m0fnu)
float4_e2m1fn = np.dtype(ml_dtypes.float4_e2m1fn)
float8_e5m2_x4 = np.dtype(np.uint32, metadata={"nki": "float8_e5m2_x4"})
float8_e4m3fn_x4 = np.dtype(np.uint32, metadata={"nki": "float8_e4m3fn_x4"})
float4_e2m1fn_x4 = np.dtype(np.uint32, metadata={"nki": "float4_e2m1fn_x4"})

_BY_NAME = {
    "bool": bool_, "bool_": bool_, "int8": int8, "int16": int16, "int32": int32, "int64": int64, "uint8": uint8,
    "uint16": uint16, "uint32": uint32, "uint64": uint64, "float16": float16, "float32": float32,
    "float64": float64, "bfloat16": bfloat16, "tfloat32": tfloat32, "float8_e4m3": float8_e4m3,
    "float8_e4m3fn": float8_e4m3fn, "float8_e5m2": float8_e5m2, "float8_e8m0fnu": float8_e8m0fnu,
    "float4_e2m1fn": float4_e2m1fn, "float8_e5m2_x4": float8_e5m2_x4, "float8_e4m3fn_x4": float8_e4m3fn_x4,
    "float4_e2m1fn_x4": float4_e2m1fn_x4,
}
_ML_FLOATS = {bfloat16, float8_e4m3, float8_e4m3fn, float8_e5m2, float8_e8m0fnu, float4_e2m1fn}


def as_dtype(dtype) -> np.dtype:
    """Normalise a dtype given as NumPy dtype, type, or NKI name (``"bfloat16"``) to ``np.dtype``."""
    if isinstance(dtype, np.dtype):
        return dtype
    if isinstance(dtype, str):
        if dtype in _BY_NAME:
            return _BY_NAME[dtype]
        return np.dtype(dtype)
    if dtype is bool:
        return bool_
    if dtype is float:
        return float32
    if dtype is int:
        return int32
    return np.dtype(dtype)


def nki_name(dtype: np.dtype) -> str:
    """Name used in messages (``bfloat16``, ``tfloat32``, ``float8_e4m3``)."""
    meta = dtype.metadata
    if meta and "nki" in meta:
        return meta["nki"]
    return dtype.name


def is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype in _ML_FLOATS or (dtype.kind == "V" and dtype in _ML_FLOATS)


def is_int(dtype: np.dtype) -> bool:
    return dtype.kind in "iu" and not (dtype.metadata and "nki" in dtype.metadata)


def is_packed(dtype: np.dtype) -> bool:
    return bool(dtype.metadata and dtype.metadata.get("nki", "").endswith("_x4"))


def precise_fp_default() -> bool:
    """``NKI_PRECISE_FP`` (default on, as in NKI 0.4+)."""
    return envvars.PRECISE_FP.read()


def storage_dtype(dtype: np.dtype, precise: bool) -> np.dtype:
    """NumPy dtype actually used to hold a tensor of logical ``dtype``."""
    if dtype.metadata and "nki" in dtype.metadata:
        return np.dtype(np.uint32) if is_packed(dtype) else float32
    if not precise and is_float(dtype) and dtype.itemsize < 4:
        return float32
    return dtype


def uninit_value(dtype: np.dtype):
    """Fill value of a fresh tensor: NaN for floats, 4 for integers (exposes uninitialised reads)."""
    if is_float(dtype) or dtype.metadata:
        if dtype.metadata and is_packed(dtype):
            return 4
        if dtype == float8_e8m0fnu:
            return np.nan
        return np.nan
    if dtype == bool_:
        return True
    return 4


def _round_tf32(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    finite = np.isfinite(x)
    rounded = ((bits + np.uint32(0xFFF) + ((bits >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000))
    out = np.where(finite, rounded, bits).view(np.float32)
    return out


def cast_for_store(values, logical: np.dtype, storage: np.dtype, precise: bool) -> np.ndarray:
    """Convert computed values (usually float32) to what a tensor of ``logical`` dtype stores.

    Float→int rounds to nearest and saturates (NaN → 0), the engines' fp32→int conversion; float→narrow-float
    rounds to nearest even (ml_dtypes); overflow gives inf where the format has one.
    """
    v = np.asarray(values)
    if v.dtype == storage and not (logical.metadata and precise and nki_name(logical) == "tfloat32"):
        return v
    if (storage.kind in "iu" and v.dtype.kind == "f") or (storage.kind in "iu" and v.dtype in _ML_FLOATS):
        info = np.iinfo(storage)
        with np.errstate(invalid="ignore"):
            f = np.asarray(v, dtype=np.float64)
            f = np.nan_to_num(np.rint(f), nan=0.0, posinf=info.max, neginf=info.min)
            return np.clip(f, info.min, info.max).astype(storage)
    if storage == bool_:
        return v != 0
    with np.errstate(over="ignore", invalid="ignore"):
        if precise and nki_name(logical) == "tfloat32":
            return _round_tf32(np.asarray(v, dtype=np.float32))
        if storage in _ML_FLOATS and v.dtype.kind in "iu":
            v = v.astype(np.float32)
        return v.astype(storage)
