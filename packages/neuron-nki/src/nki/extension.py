"""What the legacy ``neuronxcc.nki`` layer (and any other front end over the ``nki`` simulator core) may use beyond
``nki``'s public API (`nki`, `nki.language`, `nki.isa`, `nki.envvars`): the core's kernel context, tensors and
buffers, dtype helpers, hardware checks, cost charging, error helpers and launcher. ``neuronxcc`` imports nothing
else of ``nki``'s private modules (``tests/test_layering.py`` checks it); to give it something new, export it here.
"""

from __future__ import annotations

from ._alloc_checks import check_alloc_onchip
from ._context import current as current_context
from ._context import require as require_context
from ._cost import MIN_II
from ._dtypes import (
    as_dtype,
    bfloat16,
    bool_,
    cast_for_store,
    float8_e4m3,
    float8_e5m2,
    float16,
    float32,
    int8,
    int16,
    int32,
    is_float,
    is_int,
    nki_name,
    precise_fp_default,
    storage_dtype,
    tfloat32,
    uint8,
    uint16,
    uint32,
    uninit_value,
)
from ._errors import (
    NkiError,
    NkiValidationError,
    fmt_shape,
    kernel_location,
    register_internal_dir,
    register_user_dir,
    unimplemented,
)
from ._errors import _is_internal as is_internal_file
from ._launch import Kernel, KernelRun, benchmark, run_kernel
from ._limits import check_dim_size, check_same_partitions
from ._ops import resolve
from ._targets import resolve_target
from ._tensor import (
    BUFFERS,
    Allocation,
    Buffer,
    DynSlice,
    NkiTensor,
    allocate,
    hbm,
    private_hbm,
    psum,
    sbuf,
    shared_hbm,
    wrap_array,
)
from ._tensor import _binary_operators as binary_operators  # a tensor class's ``__op__``/``__rop__`` pair
from .isa import _allocs as allocs
from .isa import _charge as charge
from .language import _binary_tile as binary_tile  # ``acc += x`` into ``acc`` (``out=``): no temporary tile

__all__ = [
    "BUFFERS",
    "MIN_II",
    "Allocation",
    "Buffer",
    "DynSlice",
    "Kernel",
    "KernelRun",
    "NkiError",
    "NkiTensor",
    "NkiValidationError",
    "allocate",
    "allocs",
    "as_dtype",
    "benchmark",
    "bfloat16",
    "binary_operators",
    "binary_tile",
    "bool_",
    "cast_for_store",
    "charge",
    "check_alloc_onchip",
    "check_dim_size",
    "check_same_partitions",
    "current_context",
    "float8_e4m3",
    "float8_e5m2",
    "float16",
    "float32",
    "fmt_shape",
    "hbm",
    "int8",
    "int16",
    "int32",
    "is_float",
    "is_int",
    "is_internal_file",
    "kernel_location",
    "nki_name",
    "precise_fp_default",
    "private_hbm",
    "psum",
    "register_internal_dir",
    "register_user_dir",
    "require_context",
    "resolve",
    "resolve_target",
    "run_kernel",
    "sbuf",
    "shared_hbm",
    "storage_dtype",
    "tfloat32",
    "uint8",
    "uint16",
    "uint32",
    "unimplemented",
    "uninit_value",
    "wrap_array",
]
