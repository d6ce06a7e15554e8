"""``neuronxcc.nki.isa`` (legacy ``nisa``, NKI 0.1): tile-returning instructions on the shared simulator core.

Each legacy instruction allocates its result tile (SBUF, or PSUM for Tensor Engine outputs) and calls the
current API's dst-first instruction (``nki.isa``), which validates, computes and charges the documented cost.
``mask=`` leaves the result unwritten where the predicate is false; ``bn_stats`` applies it to its input (the
layer-norm tutorial masks the ragged last tile's columns). ``iota`` and ``affine_select`` take ``nl.arange``
expressions / predicates, as in NKI 0.1.
"""

from __future__ import annotations

import sys
import types
from enum import IntEnum

import numpy as np

import nki.isa as _c
import nki.language as _cl
from nki import extension as _ext
from nki.extension import NkiTensor, NkiValidationError, allocate, kernel_location, psum, sbuf
from nki.isa import (
    dge_mode,
    engine,
    gpsimd_engine,
    oob_mode,
    reduce_cmd,
    scalar_engine,
    tensor_engine,
    unknown_engine,
    vector_engine,
)

from ._index import IndexExpr, Predicate
from ._promotion import promote
from ._tile import (
    LegacyTile,
    check_access,
    check_matmul_operands,
    instruction_result,
    mask_array,
    masked_write,
    wrap,
)

__all__ = [
    "activation",
    "activation_reduce",
    "affine_select",
    "bn_aggr",
    "bn_stats",
    "constants",
    "dge_mode",
    "dma_copy",
    "dma_engine",
    "dma_transpose",
    "dropout",
    "engine",
    "get_nc_version",
    "gpsimd_engine",
    "iota",
    "local_gather",
    "max8",
    "memset",
    "nc_find_index8",
    "nc_match_replace8",
    "nc_matmul",
    "nc_stream_shuffle",
    "nc_transpose",
    "nc_version",
    "oob_mode",
    "range_select",
    "reciprocal",
    "reduce_cmd",
    "scalar_engine",
    "scalar_tensor_tensor",
    "select_reduce",
    "sequence_bounds",
    "tensor_copy",
    "tensor_copy_predicated",
    "tensor_engine",
    "tensor_partition_reduce",
    "tensor_reduce",
    "tensor_scalar",
    "tensor_scalar_cumulative",
    "tensor_scalar_reduce",
    "tensor_tensor",
    "tensor_tensor_scan",
    "unknown_engine",
    "vector_engine",
]

dma_engine = engine.dma



class nc_version(IntEnum):
    """NeuronCore generation; an ``IntEnum`` as in NKI 0.1, so kernels can write ``>= nc_version.gen3``."""

    gen2 = 2
    gen3 = 3
    gen4 = 4


# ``from neuronxcc.nki.isa.constants import oob_mode``: the legacy package keeps its enums in a submodule too.
constants = types.ModuleType(__name__ + ".constants", "Legacy ``nki.isa`` enums (``oob_mode``, ``dge_mode`` ...).")
for _enum in (dge_mode, engine, _c.matmul_perf_mode, nc_version, oob_mode, reduce_cmd):
    setattr(constants, _enum.__name__, _enum)
sys.modules[constants.__name__] = constants


def get_nc_version() -> nc_version:
    """NeuronCore version of the simulated target (trn1 → gen2, trn2 → gen3, trn3 → gen4)."""
    return nc_version(_c.get_nc_version().value)


def _new(shape, dtype, buffer=sbuf, api: str = "isa") -> LegacyTile:
    return wrap(allocate(tuple(int(s) for s in shape), dtype, buffer, api, api=api))


def _check(mask, *xs) -> None:
    for x in xs:
        if isinstance(x, NkiTensor):
            check_access(x, mask, kernel_location(3))


def _done(out: LegacyTile, mask, *operands) -> LegacyTile:
    like = next((o for o in operands if getattr(o, "ivars", None) and o.shape == out.shape), None)
    r = instruction_result(out, mask_array(mask, out.shape, "result", like=like))
    r.ivars = getattr(like, "ivars", None)
    return r


def _engine(e):
    return engine.unknown if e is None or isinstance(e, int) else e


# -- Tensor Engine ----------------------------------------------------------------------------------------------
_LEGACY_PERF_MODES = {None: "none", "none": "none", "double_row": "double_row", "double_row_gen3": "double_row"}


def nc_matmul(stationary: NkiTensor, moving: NkiTensor, *, is_stationary_onezero: bool = False,
              is_moving_onezero: bool = False, is_transpose: bool = False, tile_position=(), tile_size=(), mask=None,
              perf_mode=None, **kwargs) -> LegacyTile:
    """``stationary.T @ moving`` into a new fp32 PSUM tile ``[stationary free, moving free]``.

    An operand in PSUM (e.g. an ``nc_transpose`` result) is moved to SBUF first, as the legacy compiler does
    (charged as a ``tensor_copy``). ``perf_mode='double_row'``/``'double_row_gen3'`` is the FP8 double-row mode
    (``[K, 2, F]`` operands; NeuronCore-v3+)."""
    _check(mask, stationary, moving)
    mode = _perf_mode(perf_mode)
    double = mode is _c.matmul_perf_mode.double_row
    if not double:
        check_matmul_operands("nc_matmul", stationary, moving)
    stationary, moving = _in_sbuf(stationary), _in_sbuf(moving)
    free = (stationary.free_size // 2, moving.free_size // 2) if double else (stationary.free_size,
                                                                               moving.free_size)
    out = _new(free, stationary.dtype if is_transpose else _ext.float32, psum, "nc_matmul")
    _c.nc_matmul(out, stationary, moving, is_stationary_onezero=is_stationary_onezero,
                 is_moving_onezero=is_moving_onezero, is_transpose=is_transpose, accumulate=False,
                 tile_position=tile_position, tile_size=tile_size, perf_mode=mode)
    return _done(out, mask)


def _perf_mode(perf_mode):
    if isinstance(perf_mode, _c.matmul_perf_mode):
        return perf_mode
    if perf_mode not in _LEGACY_PERF_MODES:
        raise NkiValidationError(f"unknown nc_matmul perf_mode {perf_mode!r}; expected one of "
                                 f"{sorted(k for k in _LEGACY_PERF_MODES if k)}", code="err_unsupported_perf_mode",
                                 location=kernel_location(3))
    return _c.matmul_perf_mode[_LEGACY_PERF_MODES[perf_mode]]


def _in_sbuf(t: NkiTensor) -> NkiTensor:
    """A matmul operand in SBUF: a PSUM tile is copied to a new SBUF tile (one charged ``tensor_copy``)."""
    if t.buffer is not psum:
        return t
    tmp = _new(t.shape, t.dtype, sbuf, "nc_matmul_operand")
    _c.tensor_copy(tmp, t)
    return tmp


def nc_transpose(data: NkiTensor, *, mask=None, dtype=None, engine=None, **kwargs) -> LegacyTile:
    """Partition↔free transpose: Tensor Engine (≤128×128, result in PSUM) or Vector Engine (≤32×32, SBUF)."""
    _check(mask, data)
    e = _engine(engine)
    p, f = data.shape[0], data.free_size
    on_vector = e is _c.engine.vector or (e is _c.engine.unknown and p <= 32 and f <= 32)
    out = _new((f, p), dtype or data.dtype, sbuf if on_vector else psum, "nc_transpose")
    _c.nc_transpose(out, data, engine=_c.engine.vector if on_vector else _c.engine.tensor)
    return _done(out, mask)


# -- Scalar Engine ----------------------------------------------------------------------------------------------
def activation(op, data: NkiTensor, *, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
               reduce_cmd=reduce_cmd.idle, mask=None, dtype=None, **kwargs) -> LegacyTile:
    """``op(data * scale + bias)`` on the Scalar Engine (fp32 math); NumPy ufuncs work as ``op``."""
    _check(mask, data, bias, scale)
    out = _new(data.shape, dtype or data.dtype, sbuf, "activation")
    _c.activation(out, op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res,
                  reduce_cmd=reduce_cmd)
    return _done(out, mask, data)


def activation_reduce(op, data: NkiTensor, *, reduce_op, reduce_res: NkiTensor, bias=None, scale=1.0, mask=None,
                      dtype=None, **kwargs) -> LegacyTile:
    """``activation`` plus ``reduce_res[p] = reduce_op(result[p, :])`` in place."""
    _check(mask, data, bias, scale)
    out = _new(data.shape, dtype or data.dtype, sbuf, "activation_reduce")
    _c.activation_reduce(out, op, data, reduce_op=reduce_op, reduce_res=reduce_res, bias=bias, scale=scale)
    return _done(out, mask, data)


# -- Vector / GpSimd ---------------------------------------------------------------------------------------------
def tensor_tensor(data1: NkiTensor, data2: NkiTensor, op, *, dtype=None, mask=None, engine=None,
                  **kwargs) -> LegacyTile:
    """Element-wise ``data1 op data2`` (Vector Engine; ``power`` on GpSimd)."""
    _check(mask, data1, data2)
    _ext.check_same_partitions("tensor_tensor", data1=data1, data2=data2)  # the documented message
    out = _new(data1.shape, dtype or promote(data1, data2), sbuf, "tensor_tensor")
    _c.tensor_tensor(out, data1, data2, op, engine=_engine(engine))
    return _done(out, mask, data1)


def tensor_scalar(data: NkiTensor, op0, operand0, reverse0: bool = False, op1=None, operand1=None,
                  reverse1: bool = False, *, dtype=None, mask=None, engine=None, **kwargs) -> LegacyTile:
    """``(data op0 operand0) op1 operand1`` with scalar or ``[P, 1]`` operands."""
    _check(mask, data, operand0, operand1)
    out = _new(data.shape, dtype or data.dtype, sbuf, "tensor_scalar")
    _c.tensor_scalar(out, data, op0, operand0, reverse0, op1, operand1, reverse1, engine=_engine(engine))
    return _done(out, mask, data)


def scalar_tensor_tensor(*, data: NkiTensor, op0, operand0, op1, operand1: NkiTensor, reverse0: bool = False,
                         reverse1: bool = False, dtype=None, mask=None, **kwargs) -> LegacyTile:
    """``(data op0 operand0) op1 operand1`` with ``operand1`` a full tile."""
    _check(mask, data, operand0, operand1)
    out = _new(data.shape, dtype or promote(data, operand1), sbuf, "scalar_tensor_tensor")
    _c.scalar_tensor_tensor(out, data, op0, operand0, op1, operand1, reverse0=reverse0, reverse1=reverse1)
    return _done(out, mask, data)


def _reduced_shape(shape, axes, keepdims: bool) -> tuple[int, ...]:
    return tuple(1 if i in axes else s for i, s in enumerate(shape) if keepdims or i not in axes)


def tensor_reduce(op, data: NkiTensor, axis, *, negate: bool = False, keepdims: bool = False, dtype=None,
                  mask=None, **kwargs) -> LegacyTile:
    """Reduce trailing free axes with ``op`` (``nl.add``/``np.max``/…) on the Vector Engine."""
    _check(mask, data)
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    axes = tuple(int(a) % data.ndim for a in axes)
    out = _new(_reduced_shape(data.shape, axes, keepdims), dtype or data.dtype, sbuf, "tensor_reduce")
    _c.tensor_reduce(out, op, data, axes, negate=negate, keepdims=keepdims)
    return _done(out, mask)


def tensor_partition_reduce(op, data: NkiTensor, *, mask=None, dtype=None, **kwargs) -> LegacyTile:
    """Reduce across partitions (GpSimd) into a ``[1, ...]`` tile."""
    _check(mask, data)
    out = _new((1, *data.shape[1:]), dtype or data.dtype, sbuf, "tensor_partition_reduce")
    _c.tensor_partition_reduce(out, op, data)
    return _done(out, mask)


def tensor_scalar_reduce(*, data: NkiTensor, op0, operand0, reduce_op, reduce_res: NkiTensor,
                         reverse0: bool = False, dtype=None, mask=None, **kwargs) -> LegacyTile:
    """``data op0 operand0`` plus its free-axis reduction into ``reduce_res`` (in place)."""
    _check(mask, data, operand0)
    out = _new(data.shape, dtype or data.dtype, sbuf, "tensor_scalar_reduce")
    _c.tensor_scalar_reduce(out, data, op0, operand0, reduce_op, reduce_res, reverse0=reverse0)
    return _done(out, mask, data)


def tensor_scalar_cumulative(*, src: NkiTensor, dst: NkiTensor | None = None, op0, op1, imm0, imm1=None,
                             reduce_cmd=reduce_cmd.reset_reduce, mask=None, dtype=None, **kwargs) -> LegacyTile:
    """Running ``op1``-reduction of ``src op0 imm0`` along the free axis (Vector Engine), written to ``dst``
    (a new SBUF tile when omitted, as the other legacy instructions return)."""
    _check(mask, src, dst)
    if dst is not None and mask is not None:
        raise NkiValidationError("tensor_scalar_cumulative with both dst= and mask= is not supported by the "
                                 "simulator", code="err_unsupported_mask", location=kernel_location(2))
    out = _new(src.shape, dtype or src.dtype, sbuf, "tensor_scalar_cumulative") if dst is None else dst
    _c.tensor_scalar_cumulative(out, src, op0, op1, imm0, imm1=imm1, reduce_cmd=reduce_cmd)
    return _done(out, mask, src) if dst is None else dst


def tensor_tensor_scan(data0: NkiTensor, data1: NkiTensor, initial, op0, op1, reverse0: bool = False,
                       reverse1: bool = False, *, dtype=None, mask=None, **kwargs) -> LegacyTile:
    """Scan ``r[:, i] = (data0[:, i] op0 r[:, i-1]) op1 data1[:, i]`` with ``r[:, -1] = initial``."""
    _check(mask, data0, data1, initial)
    out = _new(data0.shape, dtype or promote(data0, data1), sbuf, "tensor_tensor_scan")
    _c.tensor_tensor_scan(out, data0, data1, initial, op0, op1, reverse0=reverse0, reverse1=reverse1)
    return _done(out, mask, data0)


def reciprocal(data: NkiTensor, *, dtype=None, mask=None, **kwargs) -> LegacyTile:
    """``1 / data`` on the Vector Engine."""
    _check(mask, data)
    out = _new(data.shape, dtype or data.dtype, sbuf, "reciprocal")
    _c.reciprocal(out, data)
    return _done(out, mask, data)


def tensor_copy(src: NkiTensor, *, mask=None, dtype=None, engine=None, **kwargs) -> LegacyTile:
    """Copy (and cast) a tile on-chip."""
    _check(mask, src)
    out = _new(src.shape, dtype or src.dtype, sbuf, "tensor_copy")
    _c.tensor_copy(out, src, engine=_engine(engine))
    return _done(out, mask, src)


def tensor_copy_predicated(*, src, dst: NkiTensor, predicate: NkiTensor, mask=None, reverse_pred: bool = False,
                           **kwargs) -> None:
    """Copy ``src`` into ``dst`` where ``predicate`` is true (in place)."""
    _check(mask, src, dst, predicate)
    _c.tensor_copy_predicated(dst, src, predicate, reverse_pred=reverse_pred)


def memset(shape, value, dtype, *, mask=None, engine=None, **kwargs) -> LegacyTile:
    """A new SBUF tile filled with ``value``."""
    out = _new(shape, dtype, sbuf, "memset")
    _c.memset(out, value, engine=_engine(engine))
    return _done(out, mask)


def _charge(api: str, eng: str, cycles: float, reads, writes) -> None:
    _ext.charge(_ext.require_context(api), eng, cycles, reads, writes, api)


def iota(expr, dtype, *, mask=None, **kwargs) -> LegacyTile:
    """A constant tile holding the values of an ``nl.arange`` expression (int32 math, GpSimd, ``150 + N``)."""
    if not isinstance(expr, IndexExpr):
        raise NkiValidationError("iota expects an nl.arange / nl.mgrid index expression", code="err_unsupported_expr",
                                 location=kernel_location(2))
    vals = expr.values if expr.ndim >= 2 else expr.values.reshape(1, -1)
    out = _new(vals.shape, dtype, sbuf, "iota")
    out.write(vals.astype(np.int32) if _ext.is_int(out.dtype) else vals.astype(np.float32))
    _charge("iota", "gpsimd", 150 + out.free_size, (), (out,))
    return _done(out, mask)


def affine_select(pred, on_true_tile: NkiTensor, on_false_value, *, mask=None, dtype=None, **kwargs) -> LegacyTile:
    """``where(pred, on_true_tile, on_false_value)`` with ``pred`` an index-expression predicate (GpSimd,
    ``150 + N``; causal masks)."""
    _check(mask, on_true_tile)
    if not isinstance(pred, Predicate):
        raise NkiValidationError("affine_select expects a predicate over nl.arange expressions, e.g. i_q >= i_k",
                                 code="err_unsupported_expr", location=kernel_location(2))
    out = _new(on_true_tile.shape, dtype or on_true_tile.dtype, sbuf, "affine_select")
    p = mask_array(pred, on_true_tile.shape, "on_true_tile", like=on_true_tile)
    out.write(np.where(p, on_true_tile.read_f32(), np.float32(on_false_value)))
    _charge("affine_select", "gpsimd", 150 + out.free_size, (on_true_tile,), (out,))
    return _done(out, mask, on_true_tile)


def range_select(*, on_true_tile: NkiTensor, comp_op0, comp_op1, bound0, bound1,
                 reduce_cmd=reduce_cmd.reset_reduce, reduce_res=None, reduce_op=np.max, range_start: int = 0,
                 on_false_value: float = float(np.finfo(np.float32).min), mask=None, dtype=None,
                 **kwargs) -> LegacyTile:
    """Keep elements whose free index lies within both bounds, else ``on_false_value``; max-reduce (v3+)."""
    _check(mask, on_true_tile, bound0, bound1)
    out = _new(on_true_tile.shape, dtype or on_true_tile.dtype, sbuf, "range_select")
    _c.range_select(out, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=reduce_cmd,
                    reduce_res=reduce_res, reduce_op=reduce_op, range_start=range_start,
                    on_false_value=on_false_value)
    return _done(out, mask, on_true_tile)


def select_reduce(*, dst: NkiTensor, predicate: NkiTensor, on_true: NkiTensor, on_false, reduce_res=None,
                  reduce_cmd=reduce_cmd.idle, reduce_op=np.max, reverse_pred: bool = False, mask=None, **kwargs):
    """``dst = where(predicate, on_true, on_false)`` with optional max-reduction (in place, as in NKI 0.1)."""
    _check(mask, predicate, on_true)
    _c.select_reduce(dst, predicate, on_true, on_false, reduce_res=reduce_res, reduce_cmd=reduce_cmd,
                     reduce_op=reduce_op, reverse_pred=reverse_pred)
    return dst


def dropout(data: NkiTensor, prob, *, mask=None, dtype=None, **kwargs) -> LegacyTile:
    """Zero elements with probability ``prob`` (scalar or ``[P, 1]``)."""
    _check(mask, data, prob)
    out = _new(data.shape, dtype or data.dtype, sbuf, "dropout")
    _c.dropout(out, data, prob)
    return _done(out, mask, data)


# -- statistics / search -----------------------------------------------------------------------------------------
def bn_stats(data: NkiTensor, *, mask=None, dtype=None, **kwargs) -> LegacyTile:
    """Per partition ``(count, mean, var*count)`` of even and odd elements (≤512 per partition). A ``mask`` over
    ``data`` excludes elements (ragged tiles); fully masked partitions stay unwritten."""
    _check(mask, data)
    out = _new((data.shape[0], 6), dtype or data.dtype, sbuf, "bn_stats")
    m = mask_array(mask, data.shape, "bn_stats data", like=data) if mask is not None else None
    if m is None or m.all():
        _c.bn_stats(out, data)
        return _done(out, None)
    rows = m.reshape(m.shape[0], -1).any(axis=1)
    x = data.read_f32().reshape(data.shape[0], -1)
    keep = m.reshape(m.shape[0], -1)
    width = int(keep.sum(axis=1).max())
    packed = np.zeros((data.shape[0], max(width, 1)), dtype=np.float32)
    for r in np.nonzero(rows)[0]:  # valid elements of each partition, in order
        v = x[r][keep[r]]
        packed[r, :v.size] = v
    if len(set(keep.sum(axis=1)[rows].tolist())) > 1:
        raise NkiValidationError("bn_stats mask must select the same number of elements in every selected partition",
                                 code="err_unsupported_mask", location=kernel_location(2))
    tmp = _new(packed.shape, _ext.float32, sbuf, "bn_stats")
    tmp.write(packed)
    _c.bn_stats(out, tmp)
    return _done(out, np.broadcast_to(rows[:, None], out.shape))


def bn_aggr(data: NkiTensor, *, mask=None, dtype=None, **kwargs) -> LegacyTile:
    """Aggregate ``bn_stats`` triples into ``(mean, variance)`` per partition."""
    _check(mask, data)
    out = _new((data.shape[0], 2), dtype or data.dtype, sbuf, "bn_aggr")
    _c.bn_aggr(out, data)
    return _done(out, mask)


def max8(*, src: NkiTensor, mask=None, dtype=None, **kwargs) -> LegacyTile:
    """The 8 largest values of each partition, descending."""
    _check(mask, src)
    out = _new((src.shape[0], 8), dtype or src.dtype, sbuf, "max8")
    _c.max8(out, src)
    return _done(out, mask)


def nc_find_index8(*, data: NkiTensor, vals: NkiTensor, mask=None, dtype=None, **kwargs) -> LegacyTile:
    """Index of the first occurrence of each of 8 values per partition (uint32)."""
    _check(mask, data, vals)
    out = _new((data.shape[0], 8), dtype or _ext.uint32, sbuf, "nc_find_index8")
    _c.nc_find_index8(out, data, vals)
    return _done(out, mask)


def nc_match_replace8(*, data: NkiTensor, vals: NkiTensor, imm: float, dst_idx=None, mask=None, dtype=None,
                      **kwargs) -> LegacyTile:
    """``data`` with the first occurrence of each of 8 values per partition replaced by ``imm``."""
    _check(mask, data, vals)
    out = _new(data.shape, dtype or data.dtype, sbuf, "nc_match_replace8")
    _c.nc_match_replace8(out, data, vals, imm, dst_idx=dst_idx)
    return _done(out, mask, data)


def sequence_bounds(*, segment_ids: NkiTensor, dtype=None, **kwargs) -> LegacyTile:
    """Per element ``[start, end)`` of its segment, shape ``[P, 2, N]``."""
    out = _new((segment_ids.shape[0], 2, segment_ids.free_size), dtype or segment_ids.dtype, sbuf,
               "sequence_bounds")
    _c.sequence_bounds(out, segment_ids)
    return _done(out, None)


def nc_stream_shuffle(src: NkiTensor, dst: NkiTensor, shuffle_mask, *, dtype=None, mask=None, **kwargs) -> None:
    """Cross-partition move within each 32-partition quadrant (in place into ``dst``)."""
    _check(mask, src, dst)
    _c.nc_stream_shuffle(dst, src, shuffle_mask)


def local_gather(src_buffer: NkiTensor, index: NkiTensor, num_elem_per_idx: int = 1, num_valid_indices=None, *,
                 mask=None, **kwargs) -> LegacyTile:
    """GpSimd gather within each 16-partition group (see ``nki.isa.local_gather``); returns
    ``[P, num_valid_indices, num_elem_per_idx]`` (``num_valid_indices`` defaults to all indices of a group)."""
    _check(mask, src_buffer, index)
    valid = 16 * index.free_size if num_valid_indices is None else int(num_valid_indices)
    out = _new((src_buffer.shape[0], valid, int(num_elem_per_idx)), src_buffer.dtype, sbuf, "local_gather")
    _c.local_gather(out, src_buffer, index, num_elem_per_idx, valid)
    return _done(out, mask)


# -- DMA -------------------------------------------------------------------------------------------------------------
def dma_copy(*, dst: NkiTensor, src: NkiTensor, mask=None, dst_rmw_op=None, oob_mode=oob_mode.error,
             dge_mode=dge_mode.unknown, **kwargs) -> None:
    """DMA copy (HBM↔SBUF); ``dst_rmw_op=np.add`` accumulates into ``dst``; ``mask`` selects elements;
    ``oob_mode=oob_mode.skip`` skips the elements whose source or destination index is out of bounds."""
    if getattr(oob_mode, "name", oob_mode) == "skip":
        inside = _inside(dst) & _inside(src).reshape(dst.shape)
        mask = inside if mask is None else mask_array(mask, dst.shape, "dma_copy dst", like=dst) & inside
    check_access(dst, mask, kernel_location(2))
    check_access(src, mask, kernel_location(2))
    if dst_rmw_op is not None:
        if mask is not None:
            raise NkiValidationError("dma_copy with both dst_rmw_op and mask is not supported by the simulator",
                                     code="err_unsupported_mask", location=kernel_location(2))
        _cl.atomic_rmw(dst, src, dst_rmw_op)  # both operands' accesses were checked above
        return
    m = mask_array(mask, dst.shape, "dma_copy dst", like=dst)
    if m is None:
        _c.dma_copy(dst, src, oob_mode=oob_mode, dge_mode=dge_mode)
        return
    masked_write(dst, np.reshape(src.read(), dst.shape), m)
    ctx = _ext.require_context("dma_copy")
    ctx.core.timeline.dma(int(m.sum()) * dst.itemsize, dst.shape[0] if dst.ndim else 1, _ext.allocs((src,)),
                          _ext.allocs((dst,)), "dma_copy", int(m.sum()) * dst.itemsize)


def _inside(t: NkiTensor) -> np.ndarray:
    """Elements of an access that lie inside its tensor (all of them unless it is partly out of bounds)."""
    oob = getattr(t, "oob", None)
    return np.ones(t.shape, dtype=bool) if oob is None else ~np.broadcast_to(oob[0], t.shape)


def dma_transpose(src: NkiTensor, *, axes=None, mask=None, dtype=None, **kwargs) -> LegacyTile:
    """Transpose on the DMA engines (2-D ``(1, 0)``, 3-D ``(2, 1, 0)``, 4-D ``(3, 1, 2, 0)``) into SBUF."""
    _check(mask, src)
    default = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}
    perm = tuple(axes) if axes is not None else default.get(src.ndim, tuple(range(src.ndim))[::-1])
    out = _new(tuple(src.shape[a] for a in perm), src.dtype, sbuf, "dma_transpose")
    _c.dma_transpose(out, src, axes=perm)
    if dtype is not None and _ext.as_dtype(dtype) != out.dtype:
        return _done(tensor_copy(out, dtype=dtype), mask)
    return _done(out, mask)
