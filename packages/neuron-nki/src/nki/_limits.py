"""Hardware limits, checked at run time with the documented messages (``reference/nki.md`` §1, §2.4).

Every check raises :class:`~nki._errors.NkiValidationError` naming the kernel source line. Limits:

* partition dimension ≤ 128 (``nl.tile_size.pmax``) for SBUF/PSUM tensors and instruction operands;
* a PSUM operand written by an instruction fits one 2 KiB bank per partition (512 fp32);
* ``nc_matmul``: contraction (partition) ≤ 128, stationary free ≤ 128, moving free ≤ 512 (4096 on trn3);
* SBUF and PSUM capacity per partition per target: one tensor in ``_alloc_checks``, all live ranges in
  ``_liveness``;
* memory types (e.g. matmul inputs in SBUF, output in PSUM; ``tensor_tensor`` inputs not both in PSUM;
  GpSimd cannot access PSUM; compute instructions cannot read HBM);
* out-of-bounds access (in ``_tensor.normalize_index``);
* simulator limits, so a kernel never runs (or hangs) on the impossible: a loop (``affine_range`` and the other
  ranges) runs at most ``MAX_TRIP_COUNT`` iterations and a launch grid has at most ``MAX_GRID_INSTANCES``
  instances, every grid dimension at least 1; checked before anything runs.
"""

from __future__ import annotations

import math

from ._alloc_checks import PMAX
from ._alloc_checks import fail as _fail
from ._errors import NkiValidationError, fmt_shape
from ._tensor import NkiTensor

PSUM_BANK_BYTES = 2048
GEMM_STATIONARY_FMAX = 128
BN_STATS_FMAX = 512
# Simulator limits (not hardware figures): far above any kernel of the library or the tutorials (their largest
# loop and grid have a few thousand iterations), far below what would run for hours in the simulator.
MAX_TRIP_COUNT = 1 << 20
MAX_GRID_INSTANCES = 1 << 16


def check_tensor(t, op: str, arg: str) -> None:
    """An operand that must be a tensor: a number (a float kernel argument passed where an array belongs) is
    refused by name instead of failing inside the simulator ("'float' object has no attribute 'ndim'")."""
    if not isinstance(t, NkiTensor):
        _fail(f"{op}: `{arg}` must be a tensor, got {type(t).__name__} {t!r}", "err_invalid_kernel_argument")


def check_onchip(t, op: str, arg: str, allowed: tuple[str, ...] = ("sbuf", "psum")) -> None:
    if not isinstance(t, NkiTensor):
        return
    b = t.buffer.name
    ok = b in allowed or (b in ("hbm", "shared_hbm", "private_hbm") and "hbm" in allowed)
    if not ok:
        _fail(f"Expected operand '{arg}' of '{op}' to be in address space '{'|'.join(allowed)}', but got a tile in "
              f"'{b}' instead.", "err_unsupported_memory")


def check_partition(t, op: str, arg: str, limit: int = PMAX) -> None:
    if isinstance(t, NkiTensor) and t.shape and t.shape[0] > limit:
        _fail(f"number of partitions {t.shape[0]} exceed architecture limitation of {limit}.",
              "err_num_partition_exceed_arch_limit")


def check_same_partitions(op: str, **named) -> None:
    items = [(k, v) for k, v in named.items() if isinstance(v, NkiTensor)]
    if len({v.shape[0] if v.shape else 1 for _, v in items}) > 1:
        params = ", ".join(f"{k}{fmt_shape(v.shape)}" for k, v in items)
        _fail(f"number of partitions (dimension 0 size of a tile) mismatch in parameters ({params}) of '{op}'",
              "err_num_partition_mismatch")


def check_free_size_match(op: str, **named) -> None:
    items = [(k, v) for k, v in named.items() if isinstance(v, NkiTensor)]
    if len({v.free_size for _, v in items}) > 1:
        params = ", ".join(f"{k}{fmt_shape(v.shape)}" for k, v in items)
        _fail(f"number of elements per partition mismatch in parameters ({params}) of '{op}'",
              "err_free_size_mismatch")


def check_psum_bank(t, op: str, arg: str) -> None:
    if isinstance(t, NkiTensor) and t.buffer.name == "psum":
        nbytes = t.free_size * t.itemsize
        if nbytes > PSUM_BANK_BYTES:
            _fail(f"PSUM tile '{arg}{fmt_shape(t.shape)}' of '{op}' uses {nbytes} bytes per partition, exceeding one "
                  f"PSUM bank of {PSUM_BANK_BYTES} bytes (512 float32 elements) per partition",
                  "err_psum_tile_exceed_bank")


def check_ndim(t, op: str, arg: str, maxdim: int) -> None:
    if isinstance(t, NkiTensor) and t.ndim > maxdim:
        _fail(f"parameter '{arg}{fmt_shape(t.shape)}' of '{op}' exceed max supported number of dimensions of "
              f"{maxdim}.", "err_exceed_max_supported_dimension")


def check_dim_size(t, op: str, arg: str, dim: int, limit: int, size: int | None = None) -> None:
    n = t.shape[dim] if size is None else size
    if n > limit:
        _fail(f"size of dimension {dim} in '{arg}{fmt_shape(t.shape)}' of '{op}' exceed architecture limitation "
              f"of {limit}.", "err_size_of_dimension_exceed_arch_limit")


def check_not_both_psum(op: str, a_name: str, a, b_name: str, b) -> None:
    if (isinstance(a, NkiTensor) and isinstance(b, NkiTensor) and a.buffer.name == "psum"
            and b.buffer.name == "psum"):
        _fail(f"'{op}' cannot read both '{a_name}' and '{b_name}' from PSUM; at most one input may be in PSUM.",
              "err_unsupported_memory")


def check_matmul(op: str, dst, stationary, moving, target, k_limit: int = PMAX, stat_limit: int = PMAX) -> None:
    check_onchip(stationary, op, "stationary", ("sbuf",))
    check_onchip(moving, op, "moving", ("sbuf",))
    check_onchip(dst, op, "dst", ("psum",))
    check_psum_bank(dst, op, "dst") if target.nc_version < 4 else None
    k_s, k_m = stationary.shape[0], moving.shape[0]
    if k_s != k_m:
        _fail(f"number of partitions (dimension 0 size of a tile) mismatch in parameters "
              f"(stationary{fmt_shape(stationary.shape)}, moving{fmt_shape(moving.shape)}) of '{op}'",
              "err_num_partition_mismatch")
    if k_s > k_limit:
        _fail(f"contraction (partition) dimension {k_s} of '{op}' exceed architecture limitation of {k_limit}.",
              "err_num_partition_exceed_arch_limit")
    if stationary.free_size > stat_limit:
        _fail(f"free size {stationary.free_size} of stationary{fmt_shape(stationary.shape)} of '{op}' exceed "
              f"architecture limitation of {stat_limit} (gemm_stationary_fmax).", "err_size_of_dimension_exceed_arch_limit")
    mov_limit = target.moving_fmax if dst.dtype.itemsize == 4 else target.moving_fmax * 2
    mov_limit = 512 if target.nc_version < 4 else mov_limit
    if moving.free_size > mov_limit:
        _fail(f"free size {moving.free_size} of moving{fmt_shape(moving.shape)} of '{op}' exceed architecture "
              f"limitation of {mov_limit} (gemm_moving_fmax).", "err_size_of_dimension_exceed_arch_limit")
    if dst.shape[0] != stationary.free_size or dst.free_size != moving.free_size:
        _fail(f"dst{fmt_shape(dst.shape)} of '{op}' must be [{stationary.free_size}, {moving.free_size}] for "
              f"stationary{fmt_shape(stationary.shape)} and moving{fmt_shape(moving.shape)}", "err_shape_mismatch")


def check_trip_count(api: str, count: int) -> None:
    if count > MAX_TRIP_COUNT:
        _fail(f"{api}: a loop of {count} iterations exceeds the simulator's limit of {MAX_TRIP_COUNT}; tile the "
              "work into fewer, larger iterations", "err_loop_trip_count_exceeds_limit")


def check_grid(grid: tuple[int, ...]) -> None:
    """A launch grid: every dimension at least 1 (an empty or negative grid runs nothing), and not too many."""
    if any(d < 1 for d in grid):
        raise NkiValidationError(f"launch grid {list(grid)}: every grid dimension must be at least 1",
                                 code="err_invalid_launch_grid")
    if math.prod(grid) > MAX_GRID_INSTANCES:
        raise NkiValidationError(f"launch grid {list(grid)} has {math.prod(grid)} instances, above the simulator's "
                                 f"limit of {MAX_GRID_INSTANCES}", code="err_invalid_launch_grid")
