"""Mismatched collectives fail with a clear error on every rank, instead of crashing one.

Gloo does not survive ranks that disagree on a collective's sizes: the receiving rank's IO thread throws
`gloo::EnforceNotMet` ("Received data size doesn't match expected size") and the process aborts. So before each
collective whose tensors must agree across ranks, the ranks exchange a fixed-size signature (collective, dtype,
shape) in one small all-gather and raise `ValueError` naming every rank's view if they differ. All-to-all
(`verify_exchange`) also exchanges every rank's send and receive counts: what rank r sends to rank s must be what s
expects from r. A point-to-point transfer (`send` / `recv`, see `backend`) is preceded by a header giving its dtype
and size, and answered by the receiver's verdict, so both ends raise and nothing is read from memory nobody wrote.
`NEURON_DISTRIBUTED_CHECK_COLLECTIVES=0` skips these exchanges (one small extra message per collective).
"""

from __future__ import annotations

import zlib

import torch
from torch._C._distributed_c10d import ProcessGroupGloo

from . import envvars, gloo_refs

__all__ = ["CHECK_ENV", "dtype_code", "dtype_name", "enabled", "verify_exchange", "verify_same"]

CHECK_ENV = envvars.CHECK_COLLECTIVES.name
_KINDS = (
    "allreduce",
    "allreduce_coalesced",
    "broadcast",
    "reduce",
    "allgather",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_single",
    "gather",
    "scatter",
    "alltoall_base",
    "alltoall",
)
_DTYPES = [getattr(torch, name) for name in dir(torch) if isinstance(getattr(torch, name), torch.dtype)]
_DTYPE_CODES = {dtype: code for code, dtype in enumerate(dict.fromkeys(_DTYPES))}
_SHOWN_DIMS = 4
_LENGTH = 5 + _SHOWN_DIMS  # kind, tensor count, dtype, ndim, crc of everything, the first dims


def enabled() -> bool:
    return envvars.CHECK_COLLECTIVES.read()


def _signature(kind: str, tensors: list[torch.Tensor]) -> torch.Tensor:
    first = tensors[0] if tensors else torch.empty(0)
    described = repr([(str(t.dtype), tuple(t.shape)) for t in tensors]).encode()
    dims = [*first.shape[:_SHOWN_DIMS], *[-1] * (_SHOWN_DIMS - first.dim())]
    return torch.tensor(
        [
            _KINDS.index(kind),
            len(tensors),
            _DTYPE_CODES[first.dtype],
            first.dim(),
            zlib.crc32(described),
            *dims,
        ],
        dtype=torch.int64,
    )


def dtype_code(dtype: torch.dtype) -> int:
    return _DTYPE_CODES[dtype]


def dtype_name(code: int) -> str:
    return str(next(d for d, c in _DTYPE_CODES.items() if c == code)).removeprefix("torch.")


def _describe(row: list[int]) -> str:
    kind, count, dtype, ndim, _, *dims = row
    shape = ", ".join(str(d) for d in dims[: min(ndim, _SHOWN_DIMS)]) + (
        ", ..." if ndim > _SHOWN_DIMS else ""
    )
    more = f" (+{count - 1} more tensors)" if count > 1 else ""
    return f"{_KINDS[kind]} on {dtype_name(dtype)}[{shape}]{more}"


def verify_same(gloo: ProcessGroupGloo, kind: str, tensors: list[torch.Tensor]) -> None:
    """Raise ValueError on every rank if the ranks disagree on `kind` or on `tensors`' dtypes and shapes."""
    if not enabled() or gloo.size() == 1:
        return
    mine = _signature(kind, tensors)
    everyone = torch.empty(gloo.size() * _LENGTH, dtype=torch.int64)
    gloo_refs.issue(gloo, gloo._allgather_base, everyone, mine).wait()
    rows = everyone.view(gloo.size(), _LENGTH)
    if bool((rows == mine).all()):
        return
    views = "; ".join(f"rank {rank}: {_describe(row)}" for rank, row in enumerate(rows.tolist()))
    raise ValueError(
        f"mismatched collective across ranks (every rank must call the same one on tensors of the same "
        f"dtype and shape): {views}"
    )


def verify_exchange(
    gloo: ProcessGroupGloo, kind: str, dtype: torch.dtype, send_counts: list[int], recv_counts: list[int]
) -> None:
    """Raise ValueError on every rank unless all ranks run all-to-all `kind` on `dtype` and what each rank sends to
    each other rank (`send_counts[peer]`, in elements; -1: not computable) is what that peer expects from it."""
    if not enabled() or gloo.size() == 1:
        return
    verify_same(gloo, kind, [torch.empty(0, dtype=dtype)])  # first the same collective and dtype everywhere
    size = gloo.size()
    mine = torch.tensor([*_padded(send_counts, size), *_padded(recv_counts, size)], dtype=torch.int64)
    everyone = torch.empty(size * 2 * size, dtype=torch.int64)
    gloo_refs.issue(gloo, gloo._allgather_base, everyone, mine).wait()
    rows = everyone.view(size, 2, size)
    sends, receives = rows[:, 0], rows[:, 1]
    wrong = [
        f"rank {source} sends {int(sends[source, target])} elements to rank {target}, which expects "
        f"{int(receives[target, source])}"
        for source in range(size)
        for target in range(size)
        if sends[source, target] != receives[target, source] or sends[source, target] < 0
    ]
    if wrong:
        raise ValueError(f"mismatched {kind} across ranks (split sizes must agree): " + "; ".join(wrong))


def _padded(counts: list[int], size: int) -> list[int]:
    """`counts` as one count per rank; a list of the wrong length cannot be matched (-1 everywhere)."""
    return list(counts) if len(counts) == size else [-1] * size
