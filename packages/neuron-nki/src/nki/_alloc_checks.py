"""The checks of one allocation, made before its tensor exists (partition dimension, one tensor's SBUF/PSUM bytes
per partition, integer shape) and the label naming it in capacity errors. A leaf under ``_tensor`` and ``_liveness``:
the operand checks of instructions, which need the tensor type, are ``_limits``'s."""

from __future__ import annotations

import math

import numpy as np

from ._dtypes import nki_name
from ._errors import NkiValidationError, fmt_shape, kernel_location

__all__ = ["PMAX", "alloc_label", "check_alloc_onchip", "check_shape", "fail"]

PMAX = 128


def fail(msg: str, code: str):
    raise NkiValidationError(msg, code=code, location=kernel_location(3))


def check_alloc_onchip(ctx, shape, dtype, buffer, name: str) -> None:
    if not shape:
        return
    if shape[0] > PMAX:
        fail(f"Size of partition dimension {shape[0]} exceeds architecture limitation of {PMAX}.",
             "err_num_partition_exceed_arch_limit")
    tgt = ctx.target
    pbytes = math.prod(shape[1:]) * dtype.itemsize
    kind = "PSUM" if buffer.name == "psum" else "SBUF"
    cap = tgt.psum_partition_bytes if kind == "PSUM" else tgt.sbuf_partition_bytes
    if pbytes > cap:
        fail(f"{kind} tensor {alloc_label(shape, dtype, name)} needs {pbytes} bytes per partition, exceeding the "
             f"{kind} partition size of {cap} bytes on {tgt.name}", "err_out_of_memory")


def alloc_label(shape, dtype, name: str) -> str:
    return f"`{name or 'tensor'}` {fmt_shape(shape)} {nki_name(dtype)}"


def check_shape(shape: tuple, api: str) -> None:
    """A tensor shape is integers: a float dimension was truncated (4.5 made 4)."""
    for s in shape:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            fail(f"{api}: shape {shape!r} must be integers, got {type(s).__name__} {s!r}", "err_invalid_kernel_argument")
