"""The legacy (NKI 0.1) API as listed in ``reference/nki.md`` §2, and how much of it is implemented.

Why a table in code: the coverage figure we report is computed, not estimated. Each entry is a public name of
``neuronxcc.nki`` (module, attribute). An entry counts as implemented when it exists and is not an
``unimplemented(...)`` placeholder (those raise ``NotImplementedError`` naming themselves).
Counted: §2.1 top level (legacy rows) incl. ``nki.compiler`` entries, §2.2 legacy column (dtypes and buffers
included, constants ``tile_size``/``fp32``), §2.3 legacy instructions incl. the "others" row and the enums.
"""

from __future__ import annotations

import importlib

TOP_LEVEL = ["jit", "simulate_kernel", "baremetal", "benchmark", "profile"]
COMPILER = ["sbuf", "psum", "enable_stack_allocator", "skip_middle_end_transformations", "force_auto_alloc",
            "multi_buffer", "no_reorder", "allocation_scope"]
TYPING = ["tensor", "mutable_tensor"]
# The element-wise functions of the language: `neuronxcc.nki.language` makes one per name, from these lists.
BINARY = [
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "fmod", "mod", "equal", "not_equal",
    "less", "less_equal", "greater", "greater_equal", "logical_and", "logical_or", "logical_xor", "bitwise_and",
    "bitwise_or", "bitwise_xor", "left_shift", "right_shift",
]
UNARY = [  # incl. activations
    "exp", "log", "sqrt", "rsqrt", "reciprocal", "abs", "negative", "sign", "square", "sin", "cos", "tan",
    "arctan", "tanh", "ceil", "floor", "trunc", "invert", "logical_not", "sigmoid", "relu", "gelu", "gelu_dx",
    "gelu_apprx_tanh", "gelu_apprx_sigmoid", "silu", "silu_dx", "softplus", "mish", "erf", "erf_dx", "copy",
]
LANGUAGE = [
    # memory
    "ndarray", "zeros", "ones", "full", "rand", "empty_like", "zeros_like", "shared_constant",
    "shared_identity_matrix",
    # buffers
    "sbuf", "psum", "hbm", "private_hbm", "shared_hbm",
    # data movement
    "load", "store", "load_transpose2d", "atomic_rmw",
    # indexing
    "arange", "mgrid", "ds", "par_dim", "spmd_dim", "nc",
    # loops / SPMD
    "affine_range", "sequential_range", "static_range", "program_id", "num_programs", "program_ndim",
    *BINARY,
    *UNARY,
    # reductions
    "sum", "max", "min", "mean", "prod", "all", "var", "loop_reduce", "all_reduce",
    # misc
    "matmul", "transpose", "softmax", "rms_norm", "where", "dropout", "random_seed", "expand_dims",
    "broadcast_to", "gather_flattened", "device_print", "static_cast", "gemm_grid", "finfo",
    # dtypes and constants
    "bool_", "int8", "int16", "int32", "uint8", "uint16", "uint32", "float16", "float32", "bfloat16", "tfloat32",
    "float8_e4m3", "float8_e5m2", "fp32", "tile_size",
]
ISA = [
    "nc_matmul", "nc_transpose", "activation", "activation_reduce", "tensor_tensor", "tensor_scalar",
    "tensor_reduce", "tensor_partition_reduce", "tensor_copy", "memset", "iota", "affine_select", "dma_copy",
    "dma_transpose", "bn_stats", "bn_aggr", "reciprocal", "tensor_tensor_scan", "scalar_tensor_tensor",
    "tensor_scalar_reduce", "tensor_copy_predicated", "select_reduce", "range_select", "local_gather",
    "nc_stream_shuffle", "max8", "nc_find_index8", "nc_match_replace8", "dropout", "sequence_bounds",
    "get_nc_version", "nc_version", "engine", "reduce_cmd", "dge_mode", "oob_mode",
]

TABLES: dict[str, list[str]] = {
    "neuronxcc.nki": TOP_LEVEL,
    "neuronxcc.nki.compiler": COMPILER,
    "neuronxcc.nki.typing": TYPING,
    "neuronxcc.nki.language": LANGUAGE,
    "neuronxcc.nki.isa": ISA,
}


def status() -> dict[str, list[str]]:
    """``{"implemented": [...], "not_implemented": [...], "missing": [...]}`` of qualified names."""
    out: dict[str, list[str]] = {"implemented": [], "not_implemented": [], "missing": []}
    for mod_name, names in TABLES.items():
        mod = importlib.import_module(mod_name)
        for n in names:
            q = f"{mod_name}.{n}"
            if not hasattr(mod, n):
                out["missing"].append(q)
            elif getattr(getattr(mod, n), "_nki_unimplemented", False):
                out["not_implemented"].append(q)
            else:
                out["implemented"].append(q)
    return out


def coverage() -> tuple[int, int]:
    """(implemented, total) over the legacy tables."""
    s = status()
    return len(s["implemented"]), sum(len(v) for v in s.values())
