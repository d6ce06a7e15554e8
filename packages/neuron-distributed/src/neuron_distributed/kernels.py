"""`neuron` kernels of the `c10d::*` ops, for the C++ callers that bypass the Python process group.

Methods that `PyProcessGroup` does not trampoline (`_allgather_base`, `_reduce_scatter_base`, `reduce`, `gather`,
`scatter`, `alltoall`, ... when called from C++: the DDP reducer, DTensor's C++ ops) dispatch the `c10d::*` op on
the tensors' device. The built-in PrivateUse1 kernel would hand `neuron` tensors to Gloo, which rejects them
("unsupported device type"). These kernels call the same op again on the host aliases, so it reaches the CPU kernel
and the group's CPU backend (Gloo), and charge the interconnect time.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from . import costs
from .hostmap import flat_tensors, to_host

__all__ = ["OPS", "charge_c10d", "register_kernels"]

# c10d op -> the collective kind of the cost model. The first argument of each op is its output (or in-place) tensors.
OPS: dict[str, str] = {
    "allreduce_": "allreduce",
    "allreduce_coalesced_": "allreduce_coalesced",
    "broadcast_": "broadcast",
    "allgather_": "allgather",
    "_allgather_base_": "all_gather_single",
    "allgather_coalesced_": "allgather_coalesced",
    "allgather_into_tensor_coalesced_": "allgather_into_tensor_coalesced",
    "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter_single",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter_tensor_coalesced",
    "alltoall_": "alltoall",
    "alltoall_base_": "alltoall_base",
    "reduce_": "reduce",
    "gather_": "gather",
    "scatter_": "scatter",
    "send": "send",
    "recv_": "recv",
    "recv_any_source_": "recv",
    "barrier": "barrier",
    "monitored_barrier_": "barrier",
}


def _group(args: tuple[Any, ...]) -> torch.distributed.ProcessGroup | None:
    """The op's process group: the boxed ProcessGroup (a ScriptObject) of a `c10d::*` op's arguments."""
    for arg in args:
        if isinstance(arg, torch.distributed.ProcessGroup):
            return arg
        if isinstance(arg, torch.ScriptObject):
            try:
                return torch.distributed.ProcessGroup.unbox(arg)
            except RuntimeError:  # another custom class (a ReduceOp, Work)
                continue
    return None


def group_ranks(group: torch.distributed.ProcessGroup) -> list[int] | None:
    """The group's global ranks, or None for a group this process did not register (no placement known)."""
    try:
        return torch.distributed.get_process_group_ranks(group)
    except (KeyError, ValueError, RuntimeError):
        return None


def charge_c10d(kind: str, args: tuple[Any, ...]) -> None:
    """Charge one `c10d::*` call of collective `kind` (its first argument is the output or in-place tensors)."""
    second = flat_tensors(args[1]) if len(args) > 1 else []
    group = _group(args)
    size = int(group.size()) if group is not None else 1
    costs.charge(kind, second, flat_tensors(args[0]), size, group_ranks(group) if group is not None else None)


def _kernel(op_name: str, kind: str) -> Callable[..., Any]:
    op = getattr(torch.ops.c10d, op_name).default

    def on_host(*args: Any, **kwargs: Any) -> Any:
        result = op(*to_host(args), **to_host(kwargs))
        charge_c10d(kind, args)
        if isinstance(
            result, tuple
        ):  # (outputs, Work): hand back the caller's neuron outputs, not the aliases
            return (args[0], result[1])
        return result

    on_host.__name__ = f"c10d_{op_name}_neuron"
    return on_host


def register_kernels(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register the kernels through neuron-device's registry (the `neuron_register` plugin hook)."""
    with warnings.catch_warnings():
        # torch warns that a kernel for PrivateUse1 (its own, which cannot work here) is being overridden.
        warnings.filterwarnings("ignore", message="Warning only once for all operators")
        for op_name, kind in OPS.items():
            register(f"c10d::{op_name}", _kernel(op_name, kind))
