"""``nki.isa`` (nisa): NeuronCore instructions, current (NKI 0.2+) dst-first API, executed eagerly on NumPy.

Each instruction: validates operands against the hardware limits (``_limits``), computes in the engine's
precision (float32 math; bitvec ops on integers), writes ``dst`` (rounding to its dtype) and charges its cost
on the engine's timeline (``_cost``). Tile-returning (legacy-style) wrappers can be built on top: allocate the
output with ``nki._tensor.allocate`` and call the dst-first instruction (see ``nki.language``).
"""

from __future__ import annotations

import enum
import math
import sys

import numpy as np

from . import _context, _limits
from . import _dtypes as dt
from ._cost import MIN_II, STRIDE_PENALTY_BYTES
from ._errors import NkiValidationError, fmt_shape, kernel_location
from ._liveness import tick
from ._ops import apply_binary, apply_unary, resolve
from ._tensor import NkiTensor

__all__ = [
    "activate2", "activation", "activation_reduce", "affine_select", "bn_aggr", "bn_stats", "core_barrier",
    "dge_mode", "dma_compute", "dma_copy", "dma_engine", "dma_transpose", "dropout", "engine", "exponential",
    "get_nc_version", "iota", "local_gather", "matmul_perf_mode", "max8", "memset", "nc_find_index8",
    "nc_match_replace8", "nc_matmul", "nc_matmul_mx", "nc_n_gather", "nc_stream_shuffle", "nc_transpose",
    "nc_version", "nonzero_with_count", "oob_mode", "quantize_mx", "rand2", "rand_get_state", "rand_set_state",
    "range_select", "reciprocal", "reduce_cmd", "register_alloc", "register_load", "register_move",
    "register_store", "rng", "scalar_tensor_tensor", "select_reduce", "sendrecv", "sequence_bounds",
    "set_rng_seed", "tensor_copy", "tensor_copy_predicated", "tensor_partition_reduce", "tensor_reduce",
    "tensor_scalar", "tensor_scalar_cumulative", "tensor_scalar_reduce", "tensor_tensor", "tensor_tensor_scan",
    "topk",
]


# -- enums ---------------------------------------------------------------------------------------------------
class engine(enum.Enum):
    """NeuronCore engines."""

    tensor = "tensor"
    vector = "vector"
    scalar = "scalar"
    gpsimd = "gpsimd"
    dma = "dma"
    sync = "sync"
    unknown = "unknown"


class reduce_cmd(enum.Enum):
    """Accumulator-register commands of Scalar/Vector engine reductions."""

    idle = "idle"
    reset = "reset"
    reduce = "reduce"
    reset_reduce = "reset_reduce"
    load_reduce = "load_reduce"


class dge_mode(enum.Enum):
    unknown = "unknown"
    swdge = "swdge"
    hwdge = "hwdge"
    none = "none"


class oob_mode(enum.Enum):
    error = "error"
    skip = "skip"


class matmul_perf_mode(enum.Enum):
    none = "none"
    double_row = "double_row"


class nc_version(enum.Enum):
    gen2 = 2
    gen3 = 3
    gen4 = 4


class dma_engine(enum.Enum):
    dma = "dma"
    gpsimd_dma = "gpsimd_dma"


tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown
NkiValidationError = NkiValidationError


# -- helpers -------------------------------------------------------------------------------------------------
def _ctx(api: str):
    return _context.require(api)


def _allocs(ts):
    """The operands' allocations, each marked as used now (their live ranges, ``_liveness``)."""
    out = []
    for t in ts:
        if isinstance(t, NkiTensor):
            a = t.alloc
            out.append(a)
            if a.span is not None:  # ``_liveness.touch``, inlined: every instruction passes here
                a.span.last = tick()
    return out


def _strided(ts) -> bool:
    """Whether an on-chip operand's minor dimension strides over 16 bytes (halves SBUF/PSUM bandwidth)."""
    for t in ts:
        if isinstance(t, NkiTensor) and t.key is None and t.base.ndim > 1 and t.base.shape[-1] > 1:
            if t.base.strides[-1] // t.base.itemsize * t.itemsize > STRIDE_PENALTY_BYTES:
                return True
    return False


def _where(t: NkiTensor):
    """Identity of the on-chip region a tile occupies (a new stationary tile needs a LoadStationary)."""
    return (t.alloc, t.base.__array_interface__["data"][0], t.base.shape) if t.key is None else t.alloc


def _charge(ctx, eng: str, cycles: float, reads, writes, name: str, flops: int = 0, repeat_key=None) -> None:
    ctx.core.timeline.compute(eng, cycles, _allocs(reads), _allocs(writes), name, flops,
                              _strided(reads) or _strided(writes), repeat_key)


def _repeat_key(eng: str, op: str, inputs) -> tuple | None:
    """What an instruction computes, for ``CoreTimeline.compute``'s repeat removal: engine, operation and each
    input's allocation, viewed region and last write; None when an input is indexed (a gather)."""
    parts = []
    for t in inputs:
        if not isinstance(t, NkiTensor):
            parts.append(("const", float(t)))
            continue
        if t.key is not None:
            return None
        a = t.alloc
        parts.append((id(a), t.base.__array_interface__["data"][0], t.base.shape, t.base.strides, a.ready))
    return (eng, op, *parts)


def _eng(e, default: str) -> str:
    if e is None:
        return default
    v = e.value if isinstance(e, engine) else str(e)
    return default if v == "unknown" else v


def _f32(x, op: str, arg: str, allowed=("sbuf", "psum")):
    """Operand as float32 array (tensors) or float32 scalar (constants)."""
    if isinstance(x, NkiTensor):
        _limits.check_onchip(x, op, arg, allowed)
        return x.read_f32()
    if isinstance(x, VirtualRegister):
        return np.float32(x.value)
    return np.float32(x)


def _raw(x, op: str, arg: str, allowed=("sbuf", "psum")):
    if isinstance(x, NkiTensor):
        _limits.check_onchip(x, op, arg, allowed)
        return np.asarray(x.read())
    return np.asarray(x)


def _fit(values, dst: NkiTensor, op: str):
    """Reshape a result with the same partition size and elements per partition onto ``dst``."""
    v = np.asarray(values)
    if v.shape == dst.shape:
        return v
    if v.size == dst.size:
        return v.reshape(dst.shape)
    try:
        return np.broadcast_to(v, dst.shape)
    except ValueError:
        raise NkiValidationError(f"result of '{op}' with shape {fmt_shape(v.shape)} does not fit "
                                 f"dst{fmt_shape(dst.shape)}", code="err_shape_mismatch",
                                 location=kernel_location(3)) from None


def _vec(x, p: int, op: str, arg: str):
    """Scalar or [P, 1] operand broadcast along the free dims (shape (P, 1))."""
    if isinstance(x, NkiTensor):
        _limits.check_onchip(x, op, arg)
        if x.shape[0] != p or x.free_size != 1:
            raise NkiValidationError(f"'{arg}{fmt_shape(x.shape)}' of '{op}' must be a scalar or a [{p}, 1] vector",
                                     code="err_shape_mismatch", location=kernel_location(3))
        return x.read_f32().reshape(p, 1)
    if isinstance(x, VirtualRegister):
        return np.float32(x.value)
    return np.float32(x)


def _flat2(a: np.ndarray) -> np.ndarray:
    return a.reshape(a.shape[0], -1) if a.ndim else a.reshape(1, 1)


def _common_checks(op: str, dst, **ins) -> None:
    _limits.check_onchip(dst, op, "dst")
    p = dst.shape[0] if dst.shape else 1
    if p <= _limits.PMAX and all(not isinstance(v, NkiTensor) or (v.shape[0] if v.shape else 1) == p
                                 for v in ins.values()):
        return  # the common case, checked once; otherwise the checks below name the offending operand
    _limits.check_partition(dst, op, "dst")
    for k, v in ins.items():
        _limits.check_partition(v, op, k)
    _limits.check_same_partitions(op, **ins)  # inputs first: the documented message names data1/data2
    _limits.check_same_partitions(op, dst=dst, **ins)


def _is_bf16ish(t) -> bool:
    return isinstance(t, NkiTensor) and t.dtype.itemsize == 2 and dt.is_float(t.dtype)


def _need_gpsimd_access(op: str, eng: str, *ts) -> None:
    if eng == "gpsimd":
        for t in ts:
            if isinstance(t, NkiTensor) and t.buffer.name == "psum":
                raise NkiValidationError(f"GpSimd Engine cannot access PSUM: operand {t.name}{fmt_shape(t.shape)} of "
                                         f"'{op}' is in PSUM", code="err_unsupported_memory",
                                         location=kernel_location(3))


def _acc_regs(ctx, eng: str) -> np.ndarray:
    key = ("acc", eng, ctx.core.index)
    regs = ctx.registers.get(key)
    if regs is None:
        regs = ctx.registers[key] = np.zeros((128, 1), dtype=np.float32)
    return regs


def _rng(ctx) -> np.random.Generator:
    if ctx.rng is None:
        ctx.rng = np.random.default_rng(0)
    return ctx.rng


# -- Tensor Engine -------------------------------------------------------------------------------------------
def _accumulate_into(dst: NkiTensor, res: np.ndarray, acc: bool | None) -> None:
    """Write a matmul result to PSUM: ``acc=None`` adds where ``dst`` was written before, ``True`` always adds."""
    if acc is None:
        w = dst.written_view()
        if w is not None and w.any():
            res = np.where(w, dst.read_f32() + res, res)
    elif acc:
        res = dst.read_f32() + res
    dst.write(res)


def nc_matmul(dst: NkiTensor, stationary: NkiTensor, moving: NkiTensor, is_stationary_onezero: bool = False,
              is_moving_onezero: bool = False, is_transpose: bool = False, accumulate: bool | None = None,
              tile_position=(), tile_size=(), perf_mode=matmul_perf_mode.none, name: str | None = None) -> None:
    """``dst = stationary.T @ moving`` on the Tensor Engine (float32 accumulation into PSUM).

    ``accumulate=None`` auto-detects: the first write to a PSUM location overwrites, later writes add.
    """
    ctx = _ctx("nc_matmul")
    tgt = ctx.target
    op = "nc_matmul"
    double = perf_mode in (matmul_perf_mode.double_row, "double_row")
    rows = cols = 128
    if tile_position or tile_size:
        if not (tile_position and tile_size):
            raise NkiValidationError("tile_position and tile_size must both be set to enable PE tiling",
                                     code="err_invalid_tile_position", location=kernel_location(2))
        rows, cols = (int(v) for v in tile_size)
        r0, c0 = (int(v) for v in tile_position)
        if rows not in tgt.pe_tile_rows or cols not in tgt.pe_tile_rows:
            raise NkiValidationError(f"tile_size {tuple(tile_size)} not supported on {tgt.name}; row/column sizes "
                                     f"must be one of {tgt.pe_tile_rows}", code="err_invalid_tile_position",
                                     location=kernel_location(2))
        if r0 % rows or c0 % cols or r0 + rows > 128 or c0 + cols > 128:
            raise NkiValidationError(f"tile_position {tuple(tile_position)} must be multiples of tile_size "
                                     f"{tuple(tile_size)} inside the 128x128 PE array",
                                     code="err_invalid_tile_position", location=kernel_location(2))
    k_limit = rows
    if double:
        if tgt.nc_version < 3:
            raise NkiValidationError("perf_mode=double_row is not supported on NeuronCore-v2",
                                     code="err_unsupported_perf_mode", location=kernel_location(2))
        if stationary.ndim != 3 or stationary.shape[1] != 2 or moving.ndim != 3 or moving.shape[1] != 2:
            raise NkiValidationError("double_row matmul needs [K, 2, M] stationary and [K, 2, N] moving tiles",
                                     code="err_shape_mismatch", location=kernel_location(2))
        for t, a in ((stationary, "stationary"), (moving, "moving")):
            if t.dtype not in (dt.float8_e4m3, dt.float8_e5m2, dt.float8_e4m3fn):
                raise NkiValidationError(f"double_row matmul needs fp8 inputs, got {a} {dt.nki_name(t.dtype)}",
                                         code="err_unsupported_dtype", location=kernel_location(2))
    _limits.check_matmul(op, dst, stationary if not double else _Shape2(stationary, 2),
                         moving if not double else _Shape2(moving, 2), tgt, k_limit=k_limit, stat_limit=cols)
    for t, a in ((stationary, "stationary"), (moving, "moving")):
        if not is_transpose and not (dt.is_float(t.dtype) and t.dtype.itemsize <= 4):
            raise NkiValidationError(f"nc_matmul: the Tensor Engine multiplies fp8, bf16, fp16, tf32 or fp32 "
                                     f"inputs, got {a} {dt.nki_name(t.dtype)}", code="err_unsupported_dtype",
                                     location=kernel_location(2))
    f32_in = [t.dtype.itemsize == 4 and dt.is_float(t.dtype) for t in (stationary, moving)]
    if f32_in[0] != f32_in[1] and not is_transpose:
        raise NkiValidationError("nc_matmul: if one input is float32/tfloat32 the other must be too "
                                 f"(stationary {dt.nki_name(stationary.dtype)}, moving {dt.nki_name(moving.dtype)})",
                                 code="err_unsupported_dtype", location=kernel_location(2))
    if dst.dtype != dt.float32 and not is_transpose and not (tgt.nc_version >= 4 and dst.dtype == dt.bfloat16):
        raise NkiValidationError(f"nc_matmul dst must be float32 on {tgt.name}, got {dt.nki_name(dst.dtype)}",
                                 code="err_unsupported_dtype", location=kernel_location(2))
    s = stationary.read_f32()
    m = moving.read_f32()
    if double:
        k2 = s.shape[0] * 2
        res = s.reshape(k2, -1).T @ m.reshape(k2, -1)
        K = k2
    elif is_transpose:
        res = np.asarray(stationary.read()).reshape(stationary.shape[0], -1).T
        K = s.shape[0]
    else:
        res = _flat2(s).T @ _flat2(m)
        K = s.shape[0]
    res = _fit(res, dst, op)
    acc = False if is_transpose else accumulate
    _accumulate_into(dst, res, acc)
    n_stat, n_mov = stationary.free_size, moving.free_size
    cycles = max(min(64, n_stat), n_mov)
    if any(f32_in) and not is_transpose:
        cycles *= 2 if (is_stationary_onezero or is_moving_onezero) else 4
    cycles *= (rows * cols) / (128 * 128)
    reads = _allocs((stationary, moving, dst if acc is not False else None))
    ctx.core.timeline.matmul(cycles, _where(stationary), reads, _allocs((dst,)), n_stat, 2 * K * n_stat * n_mov)


class _Shape2:
    """Shape adapter for double-row matmul checks: [K, 2, F] counts as contraction K with free size F."""

    def __init__(self, t: NkiTensor, k: int):
        self._t = t
        self.shape = (t.shape[0], *t.shape[2:])
        self.free_size = t.free_size // k
        self.buffer = t.buffer
        self.dtype = t.dtype
        self.name = t.name
        self.itemsize = t.itemsize

    def __getattr__(self, item):
        return getattr(self._t, item)


_limits.NkiTensor = (NkiTensor, _Shape2)  # let limit checks accept the adapter


# -- MX (OCP micro-scaling) formats, NeuronCore-v4+ ---------------------------------------------------------
# A group of 32 values shares one E8M0 scale: 8 partitions x the 4 values of one x4-packed element (byte i of
# the uint32 is value i). The scale of group (partition block g = p // 8, column j) sits at partition
# 32 * (g // 4) + g % 4 of the scale tile (the first 4 partitions of each 32-partition quadrant), column j.
_MX_ELEMENTS = {"float8_e4m3fn_x4": (dt.float8_e4m3fn, 8), "float8_e5m2_x4": (dt.float8_e5m2, 15)}  # (element, emax)


def _mx_checks(op: str, ctx, packed: dict[str, NkiTensor], scales: dict[str, NkiTensor]) -> None:
    if ctx.target.nc_version < 4:
        raise NkiValidationError(f"{op} is available only on NeuronCore-v4 and newer, not {ctx.target.name}",
                                 code="err_unsupported_target", location=kernel_location(3))
    for arg, t in (*packed.items(), *scales.items()):
        _limits.check_onchip(t, op, arg, ("sbuf",))
    for arg, t in packed.items():
        name = dt.nki_name(t.dtype)
        if name == "float4_e2m1fn_x4":
            raise NotImplementedError(f"{op} with {arg} float4_e2m1fn_x4 is not implemented in the NKI simulator "
                                      "(the nibble order of the packed MXFP4 type is not documented)")
        if name not in _MX_ELEMENTS:
            raise NkiValidationError(f"{op}: {arg} must be float8_e5m2_x4 or float8_e4m3fn_x4, got {name}",
                                     code="err_unsupported_dtype", location=kernel_location(3))
    for arg, t in scales.items():
        if t.dtype not in (dt.uint8, dt.float8_e8m0fnu):
            raise NkiValidationError(f"{op}: {arg} must be float8_e8m0fnu or uint8, got {dt.nki_name(t.dtype)}",
                                     code="err_unsupported_dtype", location=kernel_location(3))


def _mx_scale_rows(p: int) -> np.ndarray:
    """Scale-tile partition of each 8-partition group of a ``p``-partition MX tile."""
    g = np.arange(p // 8)
    return 32 * (g // 4) + g % 4


def _mx_check_scale_shape(op: str, data_p: int, data_f: int, scale: NkiTensor, arg: str) -> None:
    need = int(_mx_scale_rows(data_p)[-1]) + 1
    if scale.shape[0] < need or scale.free_size != data_f:
        raise NkiValidationError(f"{op}: {arg}{fmt_shape(scale.shape)} must have at least {need} partitions and "
                                 f"{data_f} elements per partition (one scale per 8 partitions x 4 values)",
                                 code="err_shape_mismatch", location=kernel_location(3))


def _mx_dequantize(data: NkiTensor, scale: NkiTensor) -> np.ndarray:
    """[P, F, 4] float32 values of an x4-packed MX tile, its scales applied."""
    p, f = data.shape[0], data.free_size
    elem, _ = _MX_ELEMENTS[dt.nki_name(data.dtype)]
    raw = np.ascontiguousarray(_flat2(np.asarray(data.read())), dtype="<u4")
    vals = raw.view(np.uint8).view(elem).astype(np.float32).reshape(p, f, 4)
    sc = _flat2(np.asarray(scale.read()))[_mx_scale_rows(p)]
    sc = np.exp2(sc.astype(np.float32) - 127.0) if scale.dtype == dt.uint8 else sc.astype(np.float32)
    return vals * np.repeat(sc, 8, axis=0)[:, :, None]


def nc_matmul_mx(dst: NkiTensor, stationary: NkiTensor, moving: NkiTensor, stationary_scale: NkiTensor,
                 moving_scale: NkiTensor, tile_position=None, tile_size=None, accumulate: bool | None = None,
                 name: str | None = None) -> None:
    """MXFP8 ``dst = stationary.T @ moving`` with integrated dequantization (Tensor Engine, NeuronCore-v4+).

    As AWS's ``nki.isa.nc_matmul_mx`` page and MXFP deep dive define it: each x4 element packs 4 consecutive
    values of the contraction dimension, so a ``[K, M]`` stationary contracts ``4K`` values; the scales are laid
    out as :func:`quantize_mx` writes them. Row tiling only: ``tile_size = (rows, 128)``, rows 128/64/32."""
    ctx = _ctx("nc_matmul_mx")
    op = "nc_matmul_mx"
    _mx_checks(op, ctx, {"stationary": stationary, "moving": moving},
               {"stationary_scale": stationary_scale, "moving_scale": moving_scale})
    _limits.check_onchip(dst, op, "dst", ("psum",))
    rows = 128
    if tile_size is not None or tile_position is not None:
        rows, cols = (int(v) for v in (tile_size or (128, 128)))
        r0, c0 = (int(v) for v in (tile_position or (0, 0)))
        if rows not in (128, 64, 32) or cols != 128 or r0 % rows or r0 + rows > 128 or c0:
            raise NkiValidationError(f"{op} supports row tiling only: tile_size (rows, 128) with rows 128, 64 or 32 "
                                     f"and tile_position (a multiple of rows, 0); got tile_size {tile_size}, "
                                     f"tile_position {tile_position}", code="err_invalid_tile_position",
                                     location=kernel_location(2))
    k, m, n = stationary.shape[0], stationary.free_size, moving.free_size
    if moving.shape[0] != k or k > rows or k % 32 or m > 128 or n > 512 or dst.shape[0] != m or dst.free_size != n:
        raise NkiValidationError(f"{op}: stationary{fmt_shape(stationary.shape)} and moving{fmt_shape(moving.shape)} "
                                 f"need one partition size (a multiple of 32, at most {rows}), at most 128 stationary "
                                 f"and 512 moving columns, and dst [{m}, {n}]; got dst{fmt_shape(dst.shape)}",
                                 code="err_shape_mismatch", location=kernel_location(2))
    if dst.dtype not in (dt.float32, dt.bfloat16):
        raise NkiValidationError(f"{op} dst must be float32 or bfloat16, got {dt.nki_name(dst.dtype)}",
                                 code="err_unsupported_dtype", location=kernel_location(2))
    _mx_check_scale_shape(op, k, m, stationary_scale, "stationary_scale")
    _mx_check_scale_shape(op, k, n, moving_scale, "moving_scale")
    s = _mx_dequantize(stationary, stationary_scale)
    mv = _mx_dequantize(moving, moving_scale)
    _accumulate_into(dst, _fit(np.einsum("kmi,kni->mn", s, mv), dst, op), accumulate)
    # Cost: the page gives 4x the bf16 throughput (4 values per PE per cycle), so an MX matmul of K packed rows
    # costs the bf16 nc_matmul formula of K rows: max(min(64, M), N) cycles, scaled to the row tile.
    cycles = max(min(64, m), n) * rows / 128
    reads = _allocs((stationary, moving, stationary_scale, moving_scale, dst if accumulate is not False else None))
    ctx.core.timeline.matmul(cycles, _where(stationary), reads, _allocs((dst,)), m, 2 * 4 * k * m * n, op)

def nc_transpose(dst: NkiTensor, data: NkiTensor, engine: engine = engine.unknown, name: str | None = None) -> None:
    """2-D partition↔free transpose on the Tensor Engine (≤128×128, to PSUM) or Vector Engine (≤32×32)."""
    ctx = _ctx("nc_transpose")
    op = "nc_transpose"
    p, f = data.shape[0], data.free_size
    eng = _eng(engine, "vector" if (p <= 32 and f <= 32 and dst.buffer.name != "psum") else "tensor")
    if eng == "tensor":
        _limits.check_onchip(data, op, "data", ("sbuf",))
        _limits.check_onchip(dst, op, "dst", ("psum",))
        _limits.check_dim_size(data, op, "data", 0, 128)
        _limits.check_dim_size(data, op, "data", 1, 128, size=f)
        _limits.check_psum_bank(dst, op, "dst")
        cycles = max(p, min(64, f))
    else:
        _limits.check_onchip(data, op, "data")
        _limits.check_onchip(dst, op, "dst")
        _limits.check_dim_size(data, op, "data", 0, 32)
        _limits.check_dim_size(data, op, "data", 1, 32, size=f)
        cycles = max(MIN_II, f)
    if dst.shape[0] != f or dst.free_size != p:
        raise NkiValidationError(f"dst{fmt_shape(dst.shape)} of 'nc_transpose' must be [{f}, {p}] for "
                                 f"data{fmt_shape(data.shape)}", code="err_shape_mismatch",
                                 location=kernel_location(2))
    res = np.asarray(data.read()).reshape(p, f).T
    dst.write(_fit(res, dst, op))
    if eng == "tensor":
        ctx.core.timeline.matmul(cycles, _where(data), _allocs((data,)), _allocs((dst,)), p, 0, "nc_transpose")
    else:
        _charge(ctx, eng, cycles, (data,), (dst,), "nc_transpose")


# -- Scalar Engine -------------------------------------------------------------------------------------------
def _activation_core(ctx, op_name, dst, op, data, bias, scale, reduce_op, reduce_res, cmd, pre=None):
    _common_checks(op_name, dst, data=data)
    _limits.check_free_size_match(op_name, dst=dst, data=data)
    p = data.shape[0]
    limit = 4096 if data.buffer.name == "psum" else 65536  # ScalarE free-size limits (arch guide)
    if data.free_size > limit:
        raise NkiValidationError(f"'{op_name}' reads {data.free_size} elements per partition from "
                                 f"{data.buffer.name.upper()}, exceeding the Scalar Engine limit of {limit}",
                                 code="err_size_of_dimension_exceed_arch_limit", location=kernel_location(3))
    if bias is not None and not isinstance(bias, NkiTensor) and ctx.target.nc_version < 3:
        raise NkiValidationError(f"'{op_name}' bias must be a [{p}, 1] vector on NeuronCore-v2 (scalar bias needs "
                                 "NeuronCore-v3+)", code="err_unsupported_target", location=kernel_location(3))
    x = _f32(data, op_name, "data")
    x2 = _flat2(x)
    if pre is not None:
        x2 = pre(x2)
    else:
        s = _vec(scale, p, op_name, "scale")
        b = _vec(bias, p, op_name, "bias") if bias is not None else np.float32(0)
        with np.errstate(all="ignore"):
            x2 = x2 * s + b
    spec = resolve(op)
    out = apply_unary(spec, x2) if not spec.binary else x2
    out = np.asarray(out, dtype=np.float32)
    dst.write(_fit(out, dst, op_name))
    cmd = reduce_cmd(cmd) if not isinstance(cmd, reduce_cmd) else cmd
    regs = _acc_regs(ctx, "scalar")[:p]
    if cmd in (reduce_cmd.reset, reduce_cmd.reset_reduce):
        regs[...] = 0.0
    if cmd in (reduce_cmd.reduce, reduce_cmd.reset_reduce):
        rspec = resolve(reduce_op if reduce_op is not None else "add")
        with np.errstate(all="ignore"):
            red = rspec.reduce(out, axis=1, keepdims=True)
            regs[...] = rspec.fn(regs, red)
    if reduce_res is not None:
        _limits.check_onchip(reduce_res, op_name, "reduce_res")
        reduce_res.write(_fit(regs.copy(), reduce_res, op_name))
    n = data.free_size
    _charge(ctx, "scalar", max(MIN_II, n) + (MIN_II if reduce_res is not None else 0),
            (data, scale, bias), (dst, reduce_res), op_name)


def activation(dst: NkiTensor, op, data: NkiTensor, bias=None, scale=1.0, reduce_op=None, reduce_res=None,
               reduce_cmd=reduce_cmd.idle, name: str | None = None) -> None:
    """``dst = op(data * scale + bias)`` on the Scalar Engine (fp32 math), with optional free-axis reduction.

    ``reduce_cmd`` drives the 128 accumulator registers: ``reset`` zeroes them, ``reduce`` adds the reduction of
    this instruction's output, ``reset_reduce`` does both; ``reduce_res`` receives the registers' final state.
    """
    ctx = _ctx("activation")
    _activation_core(ctx, "activation", dst, op, data, bias, scale, reduce_op, reduce_res, reduce_cmd)


def activation_reduce(dst: NkiTensor, op, data: NkiTensor, reduce_op, reduce_res: NkiTensor, bias=None,
                      scale=1.0, name: str | None = None) -> None:
    """``activation`` plus ``reduce_res = reduce_op(output, free axes)`` (= ``reduce_cmd.reset_reduce``)."""
    ctx = _ctx("activation_reduce")
    _activation_core(ctx, "activation_reduce", dst, op, data, bias, scale, reduce_op, reduce_res,
                     reduce_cmd.reset_reduce)


def activate2(dst: NkiTensor, op, data: NkiTensor, imm0, imm1, op0, op1, relu_param=0.0, reverse0=False,
              reverse1=False, reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd.idle,
              name: str | None = None) -> None:
    """``op((data op0 imm0) op1 imm1)`` on the Scalar Engine (NeuronCore-v4)."""
    ctx = _ctx("activate2")
    if ctx.target.nc_version < 4:
        raise NkiValidationError(f"nisa.activate2 is only available on NeuronCore-v4 (trn3), target is "
                                 f"{ctx.target.name}", code="err_unsupported_target", location=kernel_location(2))
    p = data.shape[0]

    def pre(x):
        for o, imm, rev in ((op0, imm0, reverse0), (op1, imm1, reverse1)):
            if o is None or resolve(o).name == "bypass":
                continue
            spec = resolve(o)
            v = _vec(imm, p, "activate2", "imm")
            x = apply_binary(spec, v, x) if rev else apply_binary(spec, x, v)
        return x

    _activation_core(ctx, "activate2", dst, op, data, None, 1.0, reduce_op, reduce_res, reduce_cmd, pre=pre)


# -- Vector / GpSimd arithmetic ------------------------------------------------------------------------------
def _binary(spec, a, b):
    return apply_binary(spec, a, b)


def _operand_values(x, spec, op, arg):
    if spec.kind in ("bitvec", "unary_bitvec"):
        v = _raw(x, op, arg)
        if isinstance(x, NkiTensor) and not dt.is_int(x.dtype):
            raise NkiValidationError(f"bitvec operator '{spec.name}' of '{op}' needs integer inputs, got "
                                     f"{arg} {dt.nki_name(x.dtype)}", code="err_unsupported_dtype",
                                     location=kernel_location(3))
        return v
    return _f32(x, op, arg)


def tensor_tensor(dst: NkiTensor, data1: NkiTensor, data2: NkiTensor, op, engine: engine = engine.unknown,
                  name: str | None = None) -> None:
    """Element-wise ``dst = data1 op data2`` on the Vector (or GpSimd) Engine; at most one input in PSUM."""
    ctx = _ctx("tensor_tensor")
    o = "tensor_tensor"
    spec = resolve(op)
    eng = _eng(engine, "gpsimd" if spec.name == "power" else "vector")
    _common_checks(o, dst, data1=data1, data2=data2)
    _limits.check_free_size_match(o, data1=data1, data2=data2)
    _limits.check_not_both_psum(o, "data1", data1, "data2", data2)
    _need_gpsimd_access(o, eng, dst, data1, data2)
    a = _operand_values(data1, spec, o, "data1")
    b = _operand_values(data2, spec, o, "data2")
    if a.shape != b.shape:
        b = b.reshape(a.shape)
    dst.write(_fit(_binary(spec, a, b), dst, o))
    n = data1.free_size
    fast = (data1.buffer.name == "psum" or data2.buffer.name == "psum"
            or (all(_is_bf16ish(t) for t in (data1, data2, dst)) and spec.name in ("add", "multiply", "subtract")))
    _charge(ctx, eng, max(MIN_II, n) if fast else 2 * n, (data1, data2), (dst,), o,
            repeat_key=_repeat_key(eng, f"{o}.{spec.name}.{dst.dtype}", (data1, data2)))


def tensor_scalar(dst: NkiTensor, data: NkiTensor, op0, operand0, reverse0: bool = False, op1=None, operand1=None,
                  reverse1: bool = False, engine: engine = engine.unknown, name: str | None = None) -> None:
    """``dst = (data op0 operand0) op1 operand1`` with scalar or [P,1] operands broadcast along the free dims."""
    ctx = _ctx("tensor_scalar")
    o = "tensor_scalar"
    eng = _eng(engine, "vector")
    _common_checks(o, dst, data=data)
    _limits.check_free_size_match(o, dst=dst, data=data)
    _need_gpsimd_access(o, eng, dst, data)
    p = data.shape[0]
    s0 = resolve(op0)
    if eng == "scalar" and ctx.target.nc_version == 3:
        combo = (s0.name, resolve(op1).name if op1 is not None else None)
        if combo not in (("multiply", "add"), ("multiply", None), ("add", None)):
            raise NkiValidationError(f"tensor_scalar on the Scalar Engine of trn2 supports (multiply, add), "
                                     f"(multiply, None) and (add, None); got {combo}", code="err_unsupported_engine",
                                     location=kernel_location(2))
    x = _flat2(_operand_values(data, s0, o, "data"))
    for spec_op, operand, rev in ((op0, operand0, reverse0), (op1, operand1, reverse1)):
        if spec_op is None:
            continue
        spec = resolve(spec_op)
        if not spec.binary:
            x = apply_unary(spec, x)
            continue
        v = _vec(operand, p, o, "operand") if spec.kind != "bitvec" else (
            np.asarray(operand.read()).reshape(p, 1) if isinstance(operand, NkiTensor) else np.int64(operand))
        x = _binary(spec, v, x) if rev else _binary(spec, x, v)
    dst.write(_fit(x, dst, o))
    _charge(ctx, eng, max(MIN_II, data.free_size), (data, operand0, operand1), (dst,), o)


def scalar_tensor_tensor(dst: NkiTensor, data: NkiTensor, op0, operand0, op1, operand1: NkiTensor,
                         reverse0: bool = False, reverse1: bool = False, name: str | None = None) -> None:
    """``dst = (data op0 operand0) op1 operand1`` (operand0 scalar/[P,1], operand1 a full tile) on Vector."""
    ctx = _ctx("scalar_tensor_tensor")
    o = "scalar_tensor_tensor"
    _common_checks(o, dst, data=data, operand1=operand1)
    _limits.check_free_size_match(o, dst=dst, data=data, operand1=operand1)
    _limits.check_not_both_psum(o, "data", data, "operand1", operand1)
    p = data.shape[0]
    x = _flat2(_f32(data, o, "data"))
    v0 = _vec(operand0, p, o, "operand0")
    s0, s1 = resolve(op0), resolve(op1)
    x = _binary(s0, v0, x) if reverse0 else _binary(s0, x, v0)
    y = _flat2(_f32(operand1, o, "operand1"))
    x = _binary(s1, y, x) if reverse1 else _binary(s1, x, y)
    dst.write(_fit(x, dst, o))
    _charge(ctx, "vector", max(MIN_II, data.free_size), (data, operand0, operand1), (dst,), o)


def _check_reduce_axes(op: str, data: NkiTensor, axis) -> tuple[int, ...]:
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    nd = data.ndim
    axes = tuple(sorted(int(a) % nd for a in axes))
    if 0 in axes:
        raise NkiValidationError(f"'{op}' cannot reduce the partition axis (axis 0); use nc_transpose or "
                                 f"nc_matmul with a ones vector", code="err_unsupported_axis",
                                 location=kernel_location(3))
    if axes != tuple(range(nd - len(axes), nd)):
        raise NkiValidationError(f"reduction axes {axes} of '{op}' must be the last contiguous free dimension(s)",
                                 code="err_unsupported_axis", location=kernel_location(3))
    return axes


def tensor_reduce(dst: NkiTensor, op, data: NkiTensor, axis, negate: bool = False, keepdims: bool = False,
                  name: str | None = None) -> None:
    """Reduce the trailing free axes of ``data`` with ``op`` on the Vector Engine (``negate`` multiplies by -1)."""
    ctx = _ctx("tensor_reduce")
    o = "tensor_reduce"
    axes = _check_reduce_axes(o, data, axis)
    _common_checks(o, dst, data=data)
    spec = resolve(op)
    if spec.reduce is None:
        raise NkiValidationError(f"operator '{spec.name}' cannot be used as a reduction", location=kernel_location(2))
    x = _operand_values(data, spec, o, "data")
    with np.errstate(all="ignore"):
        r = spec.reduce(x, axis=axes, keepdims=keepdims)
        if negate:
            r = -r
    dst.write(_fit(r, dst, o))
    n = data.free_size
    fast = _is_bf16ish(data) and spec.name in ("add", "maximum")
    _charge(ctx, "vector", max(MIN_II, n // 2 if fast else n), (data,), (dst,), o)


def tensor_partition_reduce(dst: NkiTensor, op, data: NkiTensor, name: str | None = None) -> None:
    """Reduce across partitions (GpSimd): ``dst[0, ...] = op-reduce(data, axis=0)``."""
    ctx = _ctx("tensor_partition_reduce")
    o = "tensor_partition_reduce"
    _limits.check_onchip(data, o, "data", ("sbuf",))
    _limits.check_onchip(dst, o, "dst", ("sbuf",))
    spec = resolve(op)
    x = _operand_values(data, spec, o, "data")
    r = spec.reduce(x, axis=0, keepdims=True)
    dst.write(_fit(r, dst, o))
    _charge(ctx, "gpsimd", max(MIN_II, data.free_size) * max(1, math.ceil(data.shape[0] / 16)), (data,), (dst,), o)


def _start_accumulation(regs: np.ndarray, command, identity: float, initial, o: str, initial_name: str):
    """Start a reduction in an engine's accumulation registers ``regs`` as ``command`` (a `reduce_cmd` or its
    value) says: ``reset_reduce`` sets them to the reduction's identity, ``load_reduce`` to ``initial``; the other
    commands leave them. Returns the command as a `reduce_cmd` (the instructions' parameter of that name hides the
    enum inside them)."""
    cmd = command if isinstance(command, reduce_cmd) else reduce_cmd(command)
    if cmd is reduce_cmd.reset_reduce:
        regs[...] = identity
    elif cmd is reduce_cmd.load_reduce:
        regs[...] = _vec(initial, regs.shape[0], o, initial_name)
    return cmd


_IDLE = reduce_cmd.idle  # for the instructions whose `reduce_cmd` parameter hides the enum


def tensor_scalar_reduce(dst: NkiTensor, data: NkiTensor, op0, operand0, reduce_op, reduce_res: NkiTensor,
                         reverse0: bool = False, reduce_cmd=reduce_cmd.reset_reduce, reduce_init=None,
                         name: str | None = None) -> None:
    """``dst = data op0 operand0`` and ``reduce_res = reduce_op(dst, free axes)`` on the Vector Engine."""
    ctx = _ctx("tensor_scalar_reduce")
    o = "tensor_scalar_reduce"
    _common_checks(o, dst, data=data, reduce_res=reduce_res)
    p = data.shape[0]
    x = _flat2(_f32(data, o, "data"))
    s0 = resolve(op0)
    v = _vec(operand0, p, o, "operand0")
    x = _binary(s0, v, x) if reverse0 else (_binary(s0, x, v) if s0.binary else apply_unary(s0, x))
    dst.write(_fit(x, dst, o))
    rspec = resolve(reduce_op)
    regs = _acc_regs(ctx, "vector")[:p]
    _start_accumulation(regs, reduce_cmd, rspec.identity if rspec.identity is not None else 0.0, reduce_init, o,
                        "reduce_init")
    with np.errstate(all="ignore"):
        regs[...] = rspec.fn(regs, rspec.reduce(x, axis=1, keepdims=True))
    reduce_res.write(_fit(regs.copy(), reduce_res, o))
    _charge(ctx, "vector", max(MIN_II, data.free_size) + MIN_II, (data, operand0), (dst, reduce_res), o)


def tensor_scalar_cumulative(dst: NkiTensor, src: NkiTensor, op0, op1, imm0, imm1=None,
                             reduce_cmd=reduce_cmd.reset_reduce, name: str | None = None) -> None:
    """Running (cumulative) ``op1``-reduction of ``src op0 imm0`` along the free axis, on the Vector Engine."""
    ctx = _ctx("tensor_scalar_cumulative")
    o = "tensor_scalar_cumulative"
    _common_checks(o, dst, src=src)
    p = src.shape[0]
    x = _flat2(_f32(src, o, "src"))
    s0, s1 = resolve(op0), resolve(op1)
    x = _binary(s0, x, _vec(imm0, p, o, "imm0"))
    regs = _acc_regs(ctx, "vector")[:p]
    _start_accumulation(regs, reduce_cmd, s1.identity if s1.identity is not None else 0.0, imm1, o, "imm1")
    acc_fn = {"add": np.add, "subtract": np.add, "multiply": np.multiply, "maximum": np.maximum,
              "minimum": np.minimum}.get(s1.name)
    if acc_fn is None:
        raise NkiValidationError(f"cumulative op1 must be add/subtract/multiply/max/min, got '{s1.name}'",
                                 location=kernel_location(2))
    with np.errstate(all="ignore"):
        if s1.name == "subtract":
            x = -x
        full = np.concatenate([regs, x], axis=1)
        out = acc_fn.accumulate(full, axis=1)[:, 1:]
    regs[...] = out[:, -1:]
    dst.write(_fit(out, dst, o))
    _charge(ctx, "vector", max(MIN_II, src.free_size), (src,), (dst,), o)


def tensor_tensor_scan(dst: NkiTensor, data0: NkiTensor, data1: NkiTensor, initial, op0, op1,
                       reverse0: bool = False, reverse1: bool = False, name: str | None = None) -> None:
    """Scan: ``r[:, i] = (data0[:, i] op0 r[:, i-1]) op1 data1[:, i]`` with ``r[:, -1] = initial``."""
    ctx = _ctx("tensor_tensor_scan")
    o = "tensor_tensor_scan"
    _common_checks(o, dst, data0=data0, data1=data1)
    _limits.check_free_size_match(o, data0=data0, data1=data1)
    _limits.check_not_both_psum(o, "data0", data0, "data1", data1)
    p = data0.shape[0]
    a = _flat2(_f32(data0, o, "data0"))
    b = _flat2(_f32(data1, o, "data1"))
    s0, s1 = resolve(op0), resolve(op1)
    prev = np.broadcast_to(_vec(initial, p, o, "initial"), (p, 1)).reshape(p).astype(np.float32)
    out = np.empty_like(a)
    with np.errstate(all="ignore"):
        if s0.name == "multiply" and s1.name == "add" and not reverse0 and not reverse1 and a.shape[1] > 0:
            # linear recurrence r_i = a_i * r_{i-1} + b_i, vectorised in float64 for accuracy
            for i in range(a.shape[1]):  # columns: O(F) NumPy ops over all partitions at once
                prev = a[:, i] * prev + b[:, i]
                out[:, i] = prev
        else:
            for i in range(a.shape[1]):
                t = s0.fn(prev, a[:, i]) if reverse0 else s0.fn(a[:, i], prev)
                prev = s1.fn(b[:, i], t) if reverse1 else s1.fn(t, b[:, i])
                out[:, i] = prev
    dst.write(_fit(out, dst, o))
    _charge(ctx, "vector", max(MIN_II, 2 * data0.free_size), (data0, data1, initial), (dst,), o)


def reciprocal(dst: NkiTensor, data: NkiTensor, name: str | None = None) -> None:
    """``dst = 1 / data`` on the Vector Engine (fp32 math)."""
    ctx = _ctx("reciprocal")
    _common_checks("reciprocal", dst, data=data)
    with np.errstate(divide="ignore"):
        r = np.float32(1.0) / _f32(data, "reciprocal", "data")
    dst.write(_fit(r, dst, "reciprocal"))
    _charge(ctx, "vector", max(MIN_II, 8 * data.free_size), (data,), (dst,), "reciprocal")


def exponential(dst: NkiTensor, src: NkiTensor, max_value=0.0, reduce_res=None, reduce_cmd=reduce_cmd.idle,
                reduce_init=0.0, name: str | None = None) -> None:
    """``dst = exp(src - max_value)`` on the Vector Engine (NeuronCore-v4), optional running sum."""
    ctx = _ctx("exponential")
    if ctx.target.nc_version < 4:
        raise NkiValidationError(f"nisa.exponential is only available on NeuronCore-v4 (trn3), target is "
                                 f"{ctx.target.name}", code="err_unsupported_target", location=kernel_location(2))
    o = "exponential"
    _common_checks(o, dst, src=src)
    p = src.shape[0]
    with np.errstate(all="ignore"):
        x = np.exp(_flat2(_f32(src, o, "src")) - _vec(max_value, p, o, "max_value"))
    dst.write(_fit(x, dst, o))
    regs = _acc_regs(ctx, "vector")[:p]
    if _start_accumulation(regs, reduce_cmd, 0, reduce_init, o, "reduce_init") is not _IDLE:
        regs[...] += x.sum(axis=1, keepdims=True)
    if reduce_res is not None:
        reduce_res.write(_fit(regs.copy(), reduce_res, o))
    _charge(ctx, "vector", max(MIN_II, src.free_size), (src,), (dst, reduce_res), o)


# -- copies / constants --------------------------------------------------------------------------------------
def _copy_like(dst: NkiTensor, src: NkiTensor, o: str, eng: str = "vector") -> None:
    ctx = _ctx(o)
    _common_checks(o, dst, src=src)
    _limits.check_free_size_match(o, dst=dst, src=src)
    _need_gpsimd_access(o, eng, dst, src)
    v = _raw(src, o, "src")
    if v.dtype != dst.alloc.data.dtype:
        v = np.asarray(v, dtype=np.float32) if not (dt.is_int(src.dtype) and dt.is_int(dst.dtype)) else v
    dst.write(_fit(v, dst, o))
    _charge(ctx, eng, max(MIN_II, src.free_size), (src,), (dst,), o)


def tensor_copy(dst: NkiTensor, src: NkiTensor, engine: engine = engine.unknown, name: str | None = None) -> None:
    """Copy (and cast) ``src`` to ``dst`` on-chip on the Vector / Scalar / GpSimd Engine."""
    eng = _eng(engine, "vector")
    if eng == "scalar" and _ctx("tensor_copy").target.nc_version < 3:
        raise NkiValidationError("tensor_copy on the Scalar Engine is not supported on NeuronCore-v2; use "
                                 "nisa.activation(op=nl.copy)", code="err_unsupported_engine",
                                 location=kernel_location(2))
    _copy_like(dst, src, "tensor_copy", eng)


def tensor_copy_predicated(dst: NkiTensor, src, predicate: NkiTensor, reverse_pred: bool = False,
                           name: str | None = None) -> None:
    """Copy ``src`` into ``dst`` where ``predicate`` is true (false with ``reverse_pred``) on Vector."""
    ctx = _ctx("tensor_copy_predicated")
    o = "tensor_copy_predicated"
    _common_checks(o, dst, src=src, predicate=predicate)
    _limits.check_not_both_psum(o, "src", src, "predicate", predicate)
    pred = _raw(predicate, o, "predicate").reshape(dst.shape) != 0
    if reverse_pred:
        pred = ~pred
    val = _raw(src, o, "src").reshape(dst.shape) if isinstance(src, NkiTensor) else src
    old = np.asarray(dst.read())
    new = np.where(pred, cast_like(val, dst), old)
    dst.write(new)
    _charge(ctx, "vector", max(MIN_II, dst.free_size), (src, predicate, dst), (dst,), o)


def cast_like(v, dst: NkiTensor):
    return dt.cast_for_store(np.asarray(v, dtype=np.float32) if not dt.is_int(dst.dtype) else np.asarray(v),
                             dst.alloc.dtype, dst.alloc.data.dtype, dst.alloc.precise)


def memset(dst: NkiTensor, value, engine: engine = engine.unknown, name: str | None = None) -> None:
    """Fill ``dst`` with a constant on the Vector (or GpSimd) Engine."""
    ctx = _ctx("memset")
    eng = _eng(engine, "vector")
    _limits.check_onchip(dst, "memset", "dst")
    _limits.check_partition(dst, "memset", "dst")
    _need_gpsimd_access("memset", eng, dst)
    dst.write(np.asarray(value, dtype=np.float32) if not dt.is_int(dst.dtype) else np.asarray(value))
    n = dst.free_size
    cycles = max(MIN_II, n // 2) if (value == 0 and dst.dtype.itemsize == 2) else max(MIN_II, n)
    _charge(ctx, eng, cycles, (), (dst,), "memset")


def _pattern_values(pattern, p: int, offset: int, channel_multiplier: int) -> np.ndarray:
    pat = [list(x) for x in pattern]
    counts = [int(c) for _, c in pat]
    vals = np.full([p, *counts], int(offset), dtype=np.int64)
    vals += (np.arange(p, dtype=np.int64) * int(channel_multiplier)).reshape([p] + [1] * len(counts))
    for d, (s, c) in enumerate(pat):
        shp = [1] * (len(counts) + 1)
        shp[d + 1] = int(c)
        vals += (np.arange(int(c), dtype=np.int64) * int(s)).reshape(shp)
    return vals.reshape(p, -1)


def iota(dst: NkiTensor, pattern, offset: int = 0, channel_multiplier: int = 0, name: str | None = None) -> None:
    """``dst[c, i...] = offset + c*channel_multiplier + Σ i_k*step_k`` (int32 math) on GpSimd, into SBUF."""
    ctx = _ctx("iota")
    _limits.check_onchip(dst, "iota", "dst", ("sbuf",))
    _limits.check_partition(dst, "iota", "dst")
    vals = _pattern_values(pattern, dst.shape[0], offset, channel_multiplier)
    if vals.shape[1] != dst.free_size:
        raise NkiValidationError(f"iota pattern has {vals.shape[1]} elements per partition, dst{fmt_shape(dst.shape)} "
                                 f"has {dst.free_size}", code="err_shape_mismatch", location=kernel_location(2))
    vals = vals.astype(np.int32)
    dst.write(_fit(vals if dt.is_int(dst.dtype) else vals.astype(np.float32), dst, "iota"))
    _charge(ctx, "gpsimd", 150 + dst.free_size, (), (dst,), "iota")


def affine_select(dst: NkiTensor, pattern, channel_multiplier: int, on_true_tile: NkiTensor, on_false_value,
                  cmp_op=None, offset: int = 0, name: str | None = None) -> None:
    """``dst = where(cmp_op(affine(c, i), 0), on_true_tile, on_false_value)`` on GpSimd (causal masks)."""
    ctx = _ctx("affine_select")
    o = "affine_select"
    _limits.check_onchip(dst, o, "dst", ("sbuf",))
    _limits.check_onchip(on_true_tile, o, "on_true_tile", ("sbuf",))
    _common_checks(o, dst, on_true_tile=on_true_tile)
    vals = _pattern_values(pattern, dst.shape[0], offset, channel_multiplier).astype(np.float32)
    spec = resolve(cmp_op if cmp_op is not None else "equal")
    pred = spec.fn(vals, np.float32(0)) != 0
    x = _flat2(_f32(on_true_tile, o, "on_true_tile"))
    if pred.shape != x.shape:
        raise NkiValidationError(f"affine_select pattern has {pred.shape[1]} elements per partition, on_true_tile "
                                 f"has {x.shape[1]}", code="err_shape_mismatch", location=kernel_location(2))
    dst.write(_fit(np.where(pred, x, np.float32(on_false_value)), dst, o))
    _charge(ctx, "gpsimd", 150 + dst.free_size, (on_true_tile,), (dst,), o)


def _max_reduce_into_registers(ctx, out: np.ndarray, command, reduce_res, o: str) -> None:
    """The Vector engine's accumulation registers after a select: reset and/or max-reduce `out`'s rows into them as
    `command` (a `reduce_cmd`) says, and write them to `reduce_res` if given."""
    regs = _acc_regs(ctx, "vector")[:out.shape[0]]
    cmd = command if isinstance(command, reduce_cmd) else reduce_cmd(command)
    if cmd is reduce_cmd.reset_reduce:
        regs[...] = -np.inf
    if cmd in (reduce_cmd.reset_reduce, reduce_cmd.reduce):
        regs[...] = np.maximum(regs, out.max(axis=1, keepdims=True))
    if reduce_res is not None:
        reduce_res.write(_fit(regs.copy(), reduce_res, o))


def range_select(dst: NkiTensor, on_true_tile: NkiTensor, comp_op0, comp_op1, bound0: NkiTensor,
                 bound1: NkiTensor, reduce_cmd=reduce_cmd.reset_reduce, reduce_res=None, reduce_op=None,
                 range_start: int = 0, on_false_value: float = float(np.finfo(np.float32).min),
                 name: str | None = None) -> None:
    """Keep elements whose free index + range_start satisfies both bound comparisons; max-reduce (Vector, v3+)."""
    ctx = _ctx("range_select")
    o = "range_select"
    if ctx.target.nc_version < 3:
        raise NkiValidationError("nisa.range_select needs NeuronCore-v3 or newer", code="err_unsupported_target",
                                 location=kernel_location(2))
    _common_checks(o, dst, on_true_tile=on_true_tile, bound0=bound0, bound1=bound1)
    p = on_true_tile.shape[0]
    x = _flat2(_f32(on_true_tile, o, "on_true_tile"))
    idx = (np.arange(x.shape[1], dtype=np.float32) + np.float32(range_start))[None, :]
    m = (resolve(comp_op0).fn(idx, _vec(bound0, p, o, "bound0")) != 0) & \
        (resolve(comp_op1).fn(idx, _vec(bound1, p, o, "bound1")) != 0)
    out = np.where(m, x, np.float32(on_false_value))
    dst.write(_fit(out, dst, o))
    _max_reduce_into_registers(ctx, out, reduce_cmd, reduce_res, o)
    _charge(ctx, "vector", max(MIN_II, on_true_tile.free_size), (on_true_tile, bound0, bound1), (dst, reduce_res), o)


def select_reduce(dst: NkiTensor, predicate: NkiTensor, on_true: NkiTensor, on_false, reduce_res=None,
                  reduce_cmd=reduce_cmd.idle, reduce_op=None, reverse_pred: bool = False,
                  name: str | None = None) -> None:
    """``dst = where(predicate, on_true, on_false)`` with optional max-reduction into ``reduce_res`` (Vector)."""
    ctx = _ctx("select_reduce")
    o = "select_reduce"
    _common_checks(o, dst, predicate=predicate, on_true=on_true)
    _limits.check_not_both_psum(o, "on_true", on_true, "predicate", predicate)
    p = on_true.shape[0]
    pred = _flat2(_raw(predicate, o, "predicate")) != 0
    if reverse_pred:
        pred = ~pred
    x = _flat2(_f32(on_true, o, "on_true"))
    out = np.where(pred, x, _vec(on_false, p, o, "on_false"))
    dst.write(_fit(out, dst, o))
    _max_reduce_into_registers(ctx, out, reduce_cmd, reduce_res, o)
    _charge(ctx, "vector", max(MIN_II, on_true.free_size), (predicate, on_true), (dst, reduce_res), o)


# -- statistics / search -------------------------------------------------------------------------------------
def bn_stats(dst: NkiTensor, data: NkiTensor, name: str | None = None) -> None:
    """Per partition (count, mean, var*count) of even and odd elements → 6 values (Vector, ≤512 elements)."""
    ctx = _ctx("bn_stats")
    o = "bn_stats"
    _common_checks(o, dst, data=data)
    if data.free_size > _limits.BN_STATS_FMAX:
        _limits.check_dim_size(data, o, "data", 1, _limits.BN_STATS_FMAX, size=data.free_size)
    x = _flat2(_f32(data, o, "data")).astype(np.float64)
    out = np.zeros((x.shape[0], 6), dtype=np.float64)
    for j, part in enumerate((x[:, 0::2], x[:, 1::2])):
        c = part.shape[1]
        mean = part.mean(axis=1) if c else np.zeros(x.shape[0])
        out[:, 3 * j] = c
        out[:, 3 * j + 1] = mean
        out[:, 3 * j + 2] = ((part - mean[:, None]) ** 2).sum(axis=1) if c else 0.0
    dst.write(_fit(out.astype(np.float32), dst, o))
    _charge(ctx, "vector", max(MIN_II, data.free_size), (data,), (dst,), o)


def bn_aggr(dst: NkiTensor, data: NkiTensor, name: str | None = None) -> None:
    """Aggregate (count, mean, var*count) triples from ``bn_stats`` into (mean, variance) per partition."""
    ctx = _ctx("bn_aggr")
    o = "bn_aggr"
    _common_checks(o, dst, data=data)
    x = _flat2(_f32(data, o, "data")).astype(np.float64)
    if x.shape[1] % 3:
        raise NkiValidationError(f"bn_aggr input must hold (count, mean, var*count) triples; got {x.shape[1]} "
                                 "elements per partition", code="err_shape_mismatch", location=kernel_location(2))
    t = x.reshape(x.shape[0], -1, 3)
    cnt, mean, m2 = t[..., 0], t[..., 1], t[..., 2]
    n = cnt.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mu = (cnt * mean).sum(axis=1) / n
        var = (m2 + cnt * (mean - mu[:, None]) ** 2).sum(axis=1) / n
    dst.write(_fit(np.stack([mu, var], axis=1).astype(np.float32), dst, o))
    _charge(ctx, "vector", max(MIN_II, data.free_size), (data,), (dst,), o)


def max8(dst: NkiTensor, src: NkiTensor, name: str | None = None) -> None:
    """The 8 largest values of each partition, descending (Vector)."""
    ctx = _ctx("max8")
    _common_checks("max8", dst, src=src)
    x = _flat2(_f32(src, "max8", "src"))
    if not 8 <= x.shape[1] <= 16384:
        raise NkiValidationError("max8 needs 8..16384 elements per partition", location=kernel_location(2))
    top = -np.sort(-x, axis=1)[:, :8]
    dst.write(_fit(top, dst, "max8"))
    _charge(ctx, "vector", max(MIN_II, src.free_size), (src,), (dst,), "max8")


def nc_find_index8(dst: NkiTensor, data: NkiTensor, vals: NkiTensor, name: str | None = None) -> None:
    """Index of the first occurrence of each of 8 values per partition (Vector)."""
    ctx = _ctx("nc_find_index8")
    _common_checks("nc_find_index8", dst, data=data, vals=vals)
    x = _flat2(_f32(data, "nc_find_index8", "data"))
    v = _flat2(_f32(vals, "nc_find_index8", "vals"))[:, :8]
    eq = x[:, None, :] == v[:, :, None]
    idx = np.where(eq.any(axis=2), eq.argmax(axis=2), 0)
    dst.write(_fit(idx.astype(np.uint32), dst, "nc_find_index8"))
    _charge(ctx, "vector", max(MIN_II, data.free_size), (data, vals), (dst,), "nc_find_index8")


def nc_match_replace8(dst: NkiTensor, data: NkiTensor, vals: NkiTensor, imm: float, dst_idx=None,
                      name: str | None = None) -> None:
    """Replace the first occurrence of each of 8 values per partition by ``imm`` (Vector)."""
    ctx = _ctx("nc_match_replace8")
    _common_checks("nc_match_replace8", dst, data=data, vals=vals)
    x = _flat2(_f32(data, "nc_match_replace8", "data")).copy()
    v = _flat2(_f32(vals, "nc_match_replace8", "vals"))[:, :8]
    idx = np.zeros(v.shape, dtype=np.int64)
    for j in range(v.shape[1]):
        eq = x == v[:, j:j + 1]
        found = eq.any(axis=1)
        i = eq.argmax(axis=1)
        rows = np.nonzero(found)[0]
        x[rows, i[rows]] = np.float32(imm)
        idx[:, j] = i
    dst.write(_fit(x, dst, "nc_match_replace8"))
    if dst_idx is not None:
        dst_idx.write(_fit(idx, dst_idx, "nc_match_replace8"))
    _charge(ctx, "vector", max(MIN_II, data.free_size), (data, vals), (dst, dst_idx), "nc_match_replace8")


def nonzero_with_count(dst: NkiTensor, src: NkiTensor, index_offset: int = 0, padding_val: int = -1,
                       name: str | None = None) -> None:
    """Indices of nonzeros (+offset), padding, then the count; on partitions 0,16,…,112 only (GpSimd)."""
    ctx = _ctx("nonzero_with_count")
    o = "nonzero_with_count"
    _limits.check_onchip(src, o, "src", ("sbuf",))
    _limits.check_onchip(dst, o, "dst", ("sbuf",))
    x = _flat2(_raw(src, o, "src"))
    if dst.free_size != x.shape[1] + 1:
        raise NkiValidationError("nonzero_with_count: dst needs one more element per partition than src",
                                 code="err_shape_mismatch", location=kernel_location(2))
    cur = np.asarray(dst.read()).reshape(dst.shape[0], -1).copy()
    for pidx in range(0, x.shape[0], 16):
        nz = np.nonzero(x[pidx])[0]
        row = np.full(x.shape[1] + 1, padding_val, dtype=np.int64)
        row[:nz.size] = nz + index_offset
        row[-1] = nz.size
        cur[pidx] = row
    dst.write(cur.reshape(dst.shape))
    _charge(ctx, "gpsimd", 150 + src.free_size, (src,), (dst,), o)


def sequence_bounds(dst: NkiTensor, segment_ids: NkiTensor, name: str | None = None) -> None:
    """Per element [start, end) of its segment; padding (id 0) gets [n, -1] (GpSimd)."""
    ctx = _ctx("sequence_bounds")
    o = "sequence_bounds"
    ids = _flat2(_raw(segment_ids, o, "segment_ids")).astype(np.int64)
    p, n = ids.shape
    out = np.empty((p, 2, n), dtype=np.int64)
    for r in range(p):
        row = ids[r]
        starts = np.full(n, n, dtype=np.int64)
        ends = np.full(n, -1, dtype=np.int64)
        for sid in np.unique(row[row != 0]):
            pos = np.nonzero(row == sid)[0]
            starts[pos] = pos.min()
            ends[pos] = pos.max() + 1
        out[r, 0], out[r, 1] = starts, ends
    dst.write(_fit(out, dst, o))
    _charge(ctx, "gpsimd", 150 + n, (segment_ids,), (dst,), o)


# -- gathers / shuffles --------------------------------------------------------------------------------------
def nc_n_gather(dst: NkiTensor, data: NkiTensor, indices: NkiTensor, name: str | None = None) -> None:
    """Per-partition gather of flattened free elements (GpSimd, SBUF only)."""
    ctx = _ctx("nc_n_gather")
    o = "nc_n_gather"
    for t, a in ((dst, "dst"), (data, "data"), (indices, "indices")):
        _limits.check_onchip(t, o, a, ("sbuf",))
    _common_checks(o, dst, data=data, indices=indices)
    x = _flat2(_raw(data, o, "data"))
    idx = _flat2(_raw(indices, o, "indices")).astype(np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= x.shape[1]):
        raise NkiValidationError(f"nc_n_gather index out of range [0, {x.shape[1]})",
                                 code="err_tensor_access_out_of_bound", location=kernel_location(2))
    dst.write(_fit(np.take_along_axis(x, idx, axis=1), dst, o))
    _charge(ctx, "gpsimd", max(MIN_II, idx.shape[1]) * max(1, math.ceil(x.shape[1] / 512)), (data, indices), (dst,), o)


def local_gather(dst: NkiTensor, src_buffer: NkiTensor, index: NkiTensor, num_elem_per_idx: int = 1,
                 num_valid_indices: int | None = None, name: str | None = None) -> None:
    """GpSimd gather: each core (16 partitions) flattens its index slice column-major and, in every one of its
    partitions, copies ``num_elem_per_idx`` contiguous elements starting at each index (an element offset into
    the partition's flattened free dims)."""
    ctx = _ctx("local_gather")
    o = "local_gather"
    for t, a in ((dst, "dst"), (src_buffer, "src_buffer"), (index, "index")):
        _limits.check_onchip(t, o, a, ("sbuf",))
    x = _flat2(_raw(src_buffer, o, "src_buffer"))
    idx = _flat2(_raw(index, o, "index")).astype(np.int64)
    p, k = x.shape[0], int(num_elem_per_idx)
    if p % 16 or idx.shape[0] != p:
        raise NkiValidationError(f"local_gather: src_buffer{fmt_shape(src_buffer.shape)} and index"
                                 f"{fmt_shape(index.shape)} need the same partition count, a multiple of 16",
                                 code="err_num_partition_mismatch", location=kernel_location(2))
    if k not in (1, 2, 4, 8, 16, 32):
        raise NkiValidationError("local_gather: num_elem_per_idx must be one of 1, 2, 4, 8, 16, 32",
                                 location=kernel_location(2))
    if dst.dtype != src_buffer.dtype:
        raise NkiValidationError("local_gather does not cast: dst.dtype must equal src_buffer.dtype",
                                 code="err_unsupported_dtype", location=kernel_location(2))
    nv = 16 * idx.shape[1] if num_valid_indices is None else int(num_valid_indices)
    if nv > 16 * idx.shape[1] or nv > 4096:
        raise NkiValidationError(f"local_gather: num_valid_indices {nv} exceeds the indices per core "
                                 f"({min(16 * idx.shape[1], 4096)})", location=kernel_location(2))
    out = np.empty((p, nv * k), dtype=x.dtype)
    for g in range(p // 16):
        ids = idx[16 * g:16 * g + 16].flatten(order="F")[:nv]
        cols = (ids[:, None] + np.arange(k)[None, :]).reshape(-1)
        if cols.size and (cols.min() < 0 or cols.max() >= x.shape[1]):
            raise NkiValidationError(f"local_gather index out of range [0, {x.shape[1]})",
                                     code="err_tensor_access_out_of_bound", location=kernel_location(2))
        out[16 * g:16 * g + 16] = x[16 * g:16 * g + 16][:, cols]
    dst.write(_fit(out, dst, o))
    _charge(ctx, "gpsimd", 150 + nv * k, (src_buffer, index), (dst,), o)

def nc_stream_shuffle(dst: NkiTensor, src: NkiTensor, shuffle_mask, name: str | None = None) -> None:
    """Cross-partition move within each 32-partition quadrant: ``dst[q*32+i] = src[q*32+mask[i]]`` (255 = keep)."""
    ctx = _ctx("nc_stream_shuffle")
    o = "nc_stream_shuffle"
    mask = [int(m) for m in shuffle_mask]
    if len(mask) != 32:
        raise NkiValidationError("shuffle_mask must have 32 entries", location=kernel_location(2))
    x = _flat2(_raw(src, o, "src"))
    out = np.asarray(dst.read()).reshape(dst.shape[0], -1).copy()
    for q0 in range(0, dst.shape[0], 32):
        for i, m in enumerate(mask):
            if m == 255 or q0 + i >= out.shape[0]:
                continue
            out[q0 + i] = x[q0 + m]
    dst.write(out.reshape(dst.shape))
    _charge(ctx, "vector", max(MIN_II, src.free_size), (src,), (dst,), o)


# -- random --------------------------------------------------------------------------------------------------
def rng(dst: NkiTensor, engine: engine = engine.unknown, name: str | None = None) -> None:
    """32 random bits per element, truncated to ``dst``'s integer type."""
    ctx = _ctx("rng")
    if not dt.is_int(dst.dtype):
        raise NkiValidationError("rng dst must be an integer type", code="err_unsupported_dtype",
                                 location=kernel_location(2))
    bits = _rng(ctx).integers(0, 2 ** 32, size=dst.shape, dtype=np.uint64)
    udt = np.dtype(f"u{dst.itemsize}")
    dst.write((bits & np.uint64(2 ** (8 * dst.itemsize) - 1)).astype(udt).view(dst.dtype))
    _charge(ctx, _eng(engine, "vector"), max(MIN_II, dst.free_size), (), (dst,), "rng")


def rand2(dst: NkiTensor, min, max, name: str | None = None) -> None:
    """Uniform random values in [min, max] (Vector, NeuronCore-v4)."""
    ctx = _ctx("rand2")
    if ctx.target.nc_version < 4:
        raise NkiValidationError("nisa.rand2 is only available on NeuronCore-v4 (trn3)",
                                 code="err_unsupported_target", location=kernel_location(2))
    p = dst.shape[0]
    lo, hi = _vec(min, p, "rand2", "min"), _vec(max, p, "rand2", "max")
    u = _rng(ctx).random(size=(p, dst.free_size), dtype=np.float32)
    dst.write(_fit(lo + u * (hi - lo), dst, "rand2"))
    _charge(ctx, "vector", MIN_II if dst.free_size < MIN_II else dst.free_size, (), (dst,), "rand2")


def dropout(dst: NkiTensor, data: NkiTensor, prob, name: str | None = None) -> None:
    """Zero each element with probability ``prob`` (scalar or [P,1]) on the Vector Engine."""
    ctx = _ctx("dropout")
    _common_checks("dropout", dst, data=data)
    p = data.shape[0]
    x = _flat2(_f32(data, "dropout", "data"))
    keep = _rng(ctx).random(size=x.shape, dtype=np.float32) >= _vec(prob, p, "dropout", "prob")
    dst.write(_fit(np.where(keep, x, np.float32(0)), dst, "dropout"))
    _charge(ctx, "vector", max(MIN_II, data.free_size), (data,), (dst,), "dropout")


def set_rng_seed(src_seeds: NkiTensor, name: str | None = None) -> None:
    """Seed the Vector Engine PRNG from a [1,1] 32-bit tensor."""
    ctx = _ctx("set_rng_seed")
    seed = int(np.asarray(src_seeds.read()).reshape(-1)[0])
    ctx.rng = np.random.default_rng(seed & 0xFFFFFFFF)
    _charge(ctx, "vector", MIN_II, (src_seeds,), (), "set_rng_seed")


def rand_set_state(src_seeds: NkiTensor, engine: engine = engine.unknown, name: str | None = None) -> None:
    """Seed the PRNG from per-lane uint32 seeds (NeuronCore-v3+)."""
    ctx = _ctx("rand_set_state")
    seeds = np.asarray(src_seeds.read()).astype(np.uint64).reshape(-1)
    ctx.rng = np.random.default_rng([int(s) for s in seeds])
    ctx.extra["rng_state"] = np.asarray(src_seeds.read()).copy()
    _charge(ctx, _eng(engine, "gpsimd"), MIN_II, (src_seeds,), (), "rand_set_state")


def rand_get_state(dst: NkiTensor, engine: engine = engine.unknown, name: str | None = None) -> None:
    """Store the PRNG state (the seeds last set; a fresh draw if never seeded)."""
    ctx = _ctx("rand_get_state")
    st = ctx.extra.get("rng_state")
    if st is None or st.size != dst.size:
        st = _rng(ctx).integers(0, 2 ** 32, size=dst.shape, dtype=np.uint64).astype(np.uint32)
    dst.write(np.asarray(st).reshape(dst.shape))
    _charge(ctx, _eng(engine, "gpsimd"), MIN_II, (), (dst,), "rand_get_state")


# -- DMA -----------------------------------------------------------------------------------------------------
def _dma_rows(t: NkiTensor) -> int:
    return t.shape[0] if t.ndim else 1


def dma_copy(dst: NkiTensor, src: NkiTensor, priority=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown,
             engine: engine = engine.unknown, name: str | None = None) -> None:
    """Copy between HBM and SBUF (or HBM↔HBM / SBUF↔SBUF) on the DMA engines; casts via float32."""
    ctx = _ctx("dma_copy")
    o = "dma_copy"
    if src.buffer.name == "psum":
        raise NkiValidationError("dma_copy cannot read from PSUM; copy to SBUF first (nisa.tensor_copy)",
                                 code="err_unsupported_memory", location=kernel_location(2))
    if dst.buffer.name == "psum":
        raise NkiValidationError("dma_copy cannot write to PSUM", code="err_unsupported_memory",
                                 location=kernel_location(2))
    if src.size != dst.size:
        raise NkiValidationError(f"dma_copy element count mismatch: dst{fmt_shape(dst.shape)} vs "
                                 f"src{fmt_shape(src.shape)}", code="err_shape_mismatch", location=kernel_location(2))
    _limits.check_partition(dst, o, "dst") if dst.buffer.on_chip else None
    _limits.check_partition(src, o, "src") if src.buffer.on_chip else None
    v = np.asarray(src.read())
    if v.dtype != dst.alloc.data.dtype and not (v.dtype.kind in "iu" and dst.alloc.data.dtype.kind in "iu"):
        v = v.astype(np.float32)
    dst.write(_fit(v, dst, o))
    nbytes = dst.size * max(dst.itemsize, 1)
    hbm_bytes = (src.size * src.itemsize if not src.buffer.on_chip else 0) + (
        dst.size * dst.itemsize if not dst.buffer.on_chip else 0)
    rows = _dma_rows(dst if dst.buffer.on_chip else src)
    ctx.core.timeline.dma(nbytes, rows, _allocs((src,)), _allocs((dst,)), o, hbm_bytes)


def dma_transpose(dst: NkiTensor, src: NkiTensor, axes=None, priority=None, dge_mode=dge_mode.unknown,
                  oob_mode=oob_mode.error, name: str | None = None) -> None:
    """Transpose on the DMA engines: 2-D (1,0), 3-D (2,1,0), 4-D (3,1,2,0) permutations (trn2+)."""
    ctx = _ctx("dma_transpose")
    o = "dma_transpose"
    if ctx.target.nc_version < 3:
        raise NkiValidationError("dma_transpose needs NeuronCore-v3 (trn2) or newer", code="err_unsupported_target",
                                 location=kernel_location(2))
    _limits.check_onchip(dst, o, "dst", ("sbuf",))
    default = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}
    axes = tuple(axes) if axes is not None else default.get(src.ndim)
    if axes not in default.values() or len(axes) != src.ndim:
        raise NkiValidationError(f"dma_transpose axes {axes} not supported for a {src.ndim}-D source; use (1, 0), "
                                 "(2, 1, 0) or (3, 1, 2, 0)", code="err_unsupported_axis", location=kernel_location(2))
    if src.dtype != dst.dtype:
        raise NkiValidationError("dma_transpose needs src.dtype == dst.dtype", code="err_unsupported_dtype",
                                 location=kernel_location(2))
    v = np.transpose(np.asarray(src.read()), axes)
    dst.write(_fit(v, dst, o))
    ctx.core.timeline.dma(dst.size * dst.itemsize * 2, _dma_rows(dst), _allocs((src,)), _allocs((dst,)), o,
                          src.size * src.itemsize if not src.buffer.on_chip else 0)


def dma_compute(dst: NkiTensor, srcs, reduce_op, scales=None, unique_indices: bool = True, oob_mode=oob_mode.error,
                name: str | None = None) -> None:
    """``dst = srcs[0]*scales[0] + srcs[1]*scales[1] + …`` computed inside the DMA engines (float32)."""
    ctx = _ctx("dma_compute")
    o = "dma_compute"
    spec = resolve(reduce_op)
    if spec.name != "add":
        raise NkiValidationError("dma_compute supports only reduce_op=nl.add", location=kernel_location(2))
    if len(srcs) > 16:
        raise NkiValidationError("dma_compute takes at most 16 sources", location=kernel_location(2))
    scales = scales or [1.0] * len(srcs)
    acc = None
    for s, k in zip(srcs, scales):
        if s.size != dst.size:
            raise NkiValidationError("dma_compute element counts must match", code="err_shape_mismatch",
                                     location=kernel_location(2))
        v = np.asarray(s.read(), dtype=np.float32).reshape(dst.shape) * np.float32(k)
        acc = v if acc is None else acc + v
    dst.write(acc)
    nbytes = dst.size * dst.itemsize * (len(srcs) + 1)
    ctx.core.timeline.dma(nbytes, _dma_rows(dst), _allocs(srcs), _allocs((dst,)), o,
                          sum(s.size * s.itemsize for s in srcs if not s.buffer.on_chip))


def quantize_mx(dst: NkiTensor, src: NkiTensor, dst_scale: NkiTensor, name: str | None = None) -> None:
    """Quantize bf16/fp16 ``src`` to MXFP8: x4-packed ``dst`` and E8M0 ``dst_scale`` (Vector, NeuronCore-v4+).

    As AWS's ``nki.isa.quantize_mx`` page defines it: one scale per 32 values (8 partitions x 4 consecutive
    elements, which become one x4 element of ``dst``), the block scale two times the OCP sample algorithm's
    (``2 ** (floor(log2(amax)) - emax + 1)``, so the largest values round without saturating), values divided
    by it and rounded to the FP8 type; scales land in the first 4 partitions of each 32-partition quadrant."""
    ctx = _ctx("quantize_mx")
    op = "quantize_mx"
    _mx_checks(op, ctx, {"dst": dst}, {"dst_scale": dst_scale})
    _limits.check_onchip(src, op, "src", ("sbuf",))
    if src.dtype not in (dt.float16, dt.bfloat16):
        raise NkiValidationError(f"{op}: src must be float16 or bfloat16, got {dt.nki_name(src.dtype)}",
                                 code="err_unsupported_dtype", location=kernel_location(2))
    p, f4 = src.shape[0], src.free_size
    if p % 32 or p > _limits.PMAX or f4 % 4 or dst.shape[0] != p or dst.free_size * 4 != f4:
        raise NkiValidationError(f"{op}: src{fmt_shape(src.shape)} needs a partition size that is a multiple of 32 "
                                 f"(at most {_limits.PMAX}) and a free size that is a multiple of 4, with dst "
                                 f"[{p}, {f4 // 4}] x4 elements; got dst{fmt_shape(dst.shape)}",
                                 code="err_shape_mismatch", location=kernel_location(2))
    _mx_check_scale_shape(op, p, f4 // 4, dst_scale, "dst_scale")
    elem, emax = _MX_ELEMENTS[dt.nki_name(dst.dtype)]
    x = _flat2(src.read_f32()).reshape(p // 8, 8, f4 // 4, 4)
    amax = np.abs(x).max(axis=(1, 3))
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(amax)) - emax + 1, -127.0)
    e = np.clip(e, -127.0, 127.0)
    q = (x / np.exp2(e)[:, None, :, None]).reshape(p, f4).astype(elem)
    dst.write(np.ascontiguousarray(q).view(np.uint8).reshape(p, f4 // 4, 4).view("<u4").reshape(dst.shape))
    scales = np.zeros((dst_scale.shape[0], f4 // 4), dtype=np.float64)
    scales[_mx_scale_rows(p)] = e + 127.0 if dst_scale.dtype == dt.uint8 else np.exp2(e)
    mask = np.zeros(scales.shape, dtype=bool)
    mask[_mx_scale_rows(p)] = True
    dst_scale.write_masked(scales.astype(np.uint8 if dst_scale.dtype == dt.uint8 else np.float32)
                           .reshape(dst_scale.shape), mask.reshape(dst_scale.shape))
    # Cost: by analogy with the Vector Engine's streaming instructions (tensor_copy / tensor_scalar), one element
    # of src per cycle: max(MIN_II, free size) cycles (the page gives no figure).
    _charge(ctx, "vector", max(MIN_II, f4), (src,), (dst, dst_scale), op)


def topk(val_dst: NkiTensor, idx_dst: NkiTensor, src: NkiTensor, n: int, sorted: bool = False,
         name: str | None = None) -> None:
    """The ``k`` largest of ``n`` bf16 values per 16-partition group, and their indices (GpSimd).

    As AWS's ``nki.isa.topk`` page defines it: each group of 16 partitions holds one problem in a snake layout
    (element ``e`` at partition ``e % 16``, free position ``e // 16``); ``k`` is the free size of ``val_dst``;
    result ``j`` of a group is written in the same snake layout (partition ``j % 16``, position ``j // 16``),
    values in ascending order (the order the page documents, which is also sorted, so ``sorted`` changes nothing
    here) and ``idx_dst`` holding indices 0..n-1 into the group's snake. Slots past the ``k`` results are left
    as they were (the page does not say what the hardware writes there)."""
    ctx = _ctx("topk")
    for t, arg in ((val_dst, "val_dst"), (idx_dst, "idx_dst"), (src, "src")):
        _limits.check_onchip(t, "topk", arg, ("sbuf",))
    if src.dtype != dt.bfloat16 or val_dst.dtype != dt.bfloat16 or idx_dst.dtype != dt.uint32:
        raise NkiValidationError(f"topk needs a bfloat16 src and val_dst and a uint32 idx_dst, got src {src.dtype}, "
                                 f"val_dst {val_dst.dtype}, idx_dst {idx_dst.dtype}", code="err_unsupported_dtype",
                                 location=kernel_location(2))
    p = src.shape[0]
    k = val_dst.free_size
    cols = -(-k // 16)
    n = int(n)
    if p % 16 or p > _limits.PMAX or val_dst.shape[0] != p or idx_dst.shape != val_dst.shape:
        raise NkiValidationError(f"topk: the partition dimension ({p}) must be a multiple of 16 and at most "
                                 f"{_limits.PMAX}, with val_dst and idx_dst of one shape [{p}, k]; got val_dst"
                                 f"{fmt_shape(val_dst.shape)}, idx_dst{fmt_shape(idx_dst.shape)}",
                                 code="err_shape_mismatch", location=kernel_location(2))
    if not 8 <= n < 65536 or not 1 <= k < 32768 or k > n or src.free_size < -(-n // 16):
        raise NkiValidationError(f"topk needs 8 <= n < 65536, 1 <= k < 32768, k <= n and a src free size of at "
                                 f"least ceil(n / 16); got n={n}, k={k}, src free size {src.free_size}",
                                 code="err_shape_mismatch", location=kernel_location(2))
    groups = p // 16
    # snake of each group: element e at (partition e % 16, position e // 16)
    snake = _flat2(src.read_f32()).reshape(groups, 16, -1).transpose(0, 2, 1).reshape(groups, -1)[:, :n]
    order = np.argsort(-snake, axis=1, kind="stable")[:, :k][:, ::-1]  # the k largest, ascending
    vals = np.take_along_axis(snake, order, axis=1)

    # result j of a group at (partition j % 16, position j // 16); the other slots keep their values
    keep = np.zeros((16, k), dtype=bool)
    keep[:, :cols] = (np.arange(16).reshape(16, 1) + 16 * np.arange(cols)) < k
    mask = np.tile(keep, (groups, 1)).reshape(val_dst.shape)
    for res, t in ((vals, val_dst), (order, idx_dst)):
        laid = np.zeros((groups, 16, k), dtype=np.float64)
        laid[:, :, :cols] = np.pad(res, ((0, 0), (0, cols * 16 - k))).reshape(groups, cols, 16).transpose(0, 2, 1)
        t.write_masked(laid.reshape(t.shape).astype(t.dtype if t is idx_dst else np.float32), mask)
    # the page's estimated cost: 4 * n + k GpSimd cycles
    _charge(ctx, "gpsimd", 4 * n + k, (src,), (val_dst, idx_dst), "topk")


# -- multi-core / registers ----------------------------------------------------------------------------------
def core_barrier(data: NkiTensor, cores=(0, 1), engine: engine = engine.gpsimd, name: str | None = None) -> None:
    """Barrier between the cores of an LNC2 launch (cores run as lock-step threads; a no-op with one core)."""
    ctx = _ctx("core_barrier")
    barrier = ctx.extra.get("core_barrier")
    if barrier is not None:
        barrier()
    _charge(ctx, _eng(engine, "gpsimd"), MIN_II, (data,), (), "core_barrier")


def sendrecv(src: NkiTensor, dst: NkiTensor, send_to_rank: int, recv_from_rank: int, pipe_id: int,
             dma_engine=dma_engine.dma, name: str | None = None) -> None:
    """Send ``src`` to core ``send_to_rank`` and receive ``dst`` from ``recv_from_rank`` (LNC2, SBUF↔SBUF)."""
    ctx = _ctx("sendrecv")
    o = "sendrecv"
    _limits.check_onchip(src, o, "src", ("sbuf",))
    _limits.check_onchip(dst, o, "dst", ("sbuf",))
    if src.dtype != dst.dtype or src.shape[0] != dst.shape[0] or src.free_size != dst.free_size:
        raise NkiValidationError(f"sendrecv src{fmt_shape(src.shape)} {dt.nki_name(src.dtype)} and "
                                 f"dst{fmt_shape(dst.shape)} {dt.nki_name(dst.dtype)} must match",
                                 code="err_shape_mismatch", location=kernel_location(2))
    sched = ctx.extra.get("lnc_sched")
    me = ctx.extra.get("lnc_core", 0)
    if sched is None:
        if send_to_rank == recv_from_rank == me:
            dst.write(np.asarray(src.read()).reshape(dst.shape))
        else:
            raise NkiValidationError("sendrecv between cores needs an LNC2 launch (kernel[2] with "
                                     "NEURON_LOGICAL_NC_CONFIG=2)", code="err_unsupported_target",
                                     location=kernel_location(2))
    else:
        for r in (send_to_rank, recv_from_rank):
            if not 0 <= int(r) < sched.n:
                raise NkiValidationError(f"sendrecv rank {r} out of range for {sched.n} cores",
                                         location=kernel_location(2))
        sched.mailbox.setdefault((pipe_id, me, int(send_to_rank)), []).append(np.array(src.read()))
        key = (pipe_id, int(recv_from_rank), me)
        sched.wait_until(me, lambda: bool(sched.mailbox.get(key)))
        dst.write(sched.mailbox[key].pop(0).reshape(dst.shape))
    ctx.core.timeline.dma(src.size * src.itemsize, src.shape[0], _allocs((src,)), _allocs((dst,)), o)

class VirtualRegister:
    """An engine register holding a 32-bit integer (loop bounds, dynamic offsets)."""

    __slots__ = ("value",)

    def __init__(self, value: int | None = None):
        self.value = 4 if value is None else int(value)  # uninitialised registers read as 4, like tensors

    def __int__(self) -> int:
        return self.value

    __index__ = __int__

    def __bool__(self) -> bool:
        return self.value != 0

    def __repr__(self) -> str:
        return f"VirtualRegister({self.value})"


def register_alloc(x: int | None = None) -> VirtualRegister:
    """Allocate a virtual register, optionally initialised."""
    _ctx("register_alloc")
    return VirtualRegister(x)


def register_move(dst: VirtualRegister, src) -> None:
    """``dst = src`` (an int or another register)."""
    _ctx("register_move")
    dst.value = int(src)


def register_load(dst: VirtualRegister, src: NkiTensor) -> None:
    """Load the single element of ``src`` (HBM/SBUF) into a register."""
    _ctx("register_load")
    if src.size != 1:
        raise NkiValidationError("register_load needs a tensor with exactly one element", location=kernel_location(2))
    dst.value = int(np.asarray(src.read(), dtype=np.float64).reshape(-1)[0])


def register_store(dst: NkiTensor, src: VirtualRegister) -> None:
    """Store a register into a single-element tensor."""
    _ctx("register_store")
    if dst.size != 1:
        raise NkiValidationError("register_store needs a tensor with exactly one element", location=kernel_location(2))
    dst.write(np.full(dst.shape, src.value))


def get_nc_version() -> nc_version:
    """NeuronCore version of the current target (gen2 = trn1, gen3 = trn2, gen4 = trn3)."""
    ctx = _context.current()
    from ._targets import current_target

    t = ctx.target if ctx else current_target()
    return nc_version(t.nc_version)


NkiTensor._isa = sys.modules[__name__]  # `t[...] = v` on every tensor runs this module's copy
