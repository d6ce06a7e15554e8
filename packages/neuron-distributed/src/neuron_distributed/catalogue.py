"""The catalogue of collectives: every op that communicates, the cost model's kind of each, and where its tensors and
process group are among its arguments (in the style of `torch.distributed._tools.fake_collectives`).

Two families reach a device kernel or a plan's dispatch mode:

* `c10d::*` ops (`C10D`): what `ProcessGroup` methods called from C++ dispatch (the DDP reducer, DTensor's C++
  ops). Their first argument is the output (or in-place) tensors, their second the inputs, the group is boxed among
  the arguments. A real run reaches them through `kernels`; a plan sees them in its charger.
* `_c10d_functional::*` ops (`FUNCTIONAL`): DTensor's, FSDP2's and async TP's functional collectives. Their tensors
  are the inputs, the result the output, and the last argument names the group. (`_c10d_functional_autograd::*` has
  only a composite kernel on `neuron`, which calls these.)

Every collective is charged by `costs.charge`, for the group's size and its ranks' placement, in a real run and in a
plan alike.
"""

from __future__ import annotations

from typing import Any

import torch

from . import costs
from .hostmap import flat_tensors

__all__ = ["C10D", "FUNCTIONAL", "boxed_group", "charge", "charge_c10d", "group_ranks", "kind_of"]

# c10d op -> the collective kind of the cost model.
C10D: dict[str, str] = {
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
# _c10d_functional op -> the collective kind of the cost model.
FUNCTIONAL: dict[str, str] = {
    "all_reduce": "allreduce", "all_reduce_": "allreduce", "all_reduce_coalesced": "allreduce_coalesced",
    "all_gather_into_tensor": "all_gather_single", "all_gather_into_tensor_out": "all_gather_single",
    "all_gather_into_tensor_coalesced": "allgather_into_tensor_coalesced",
    "reduce_scatter_tensor": "reduce_scatter_single",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "all_to_all_single": "alltoall_base", "broadcast": "broadcast", "broadcast_": "broadcast",
}
_BY_NAMESPACE = {"c10d": C10D, "_c10d_functional": FUNCTIONAL}


def kind_of(op: torch._ops.OpOverload) -> str | None:
    """The cost model's kind of collective `op`, or None when `op` does not communicate."""
    table = _BY_NAMESPACE.get(op.namespace)
    return table.get(op._opname) if table is not None else None


def boxed_group(args: tuple[Any, ...]) -> torch.distributed.ProcessGroup | None:
    """The boxed ProcessGroup (a ScriptObject) among a `c10d::*` op's arguments."""
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


# kind -> (the tensor that is `size` times the other: 0 the output, 1 the input), for the single-tensor collectives
_SIZED = {"all_gather_single": 0, "reduce_scatter_single": 1}


def _check_sizes(kind: str, output: torch.Tensor, input: torch.Tensor, size: int) -> None:
    """Refuse an all-gather / reduce-scatter into a tensor of the wrong size, as the real run's process group does
    (Gloo: "outputShape[0] * worldSize == inputShape[0]"); on fakes the plan would go on and price it."""
    whole, part = (output, input) if _SIZED[kind] == 0 else (input, output)
    if whole.numel() != part.numel() * size:
        name = "output" if _SIZED[kind] == 0 else "input"
        raise ValueError(f"{kind}: the {name} tensor must have world size ({size}) times the other's elements, got "
                         f"{tuple(output.shape)} output and {tuple(input.shape)} input")


def charge_c10d(kind: str, args: tuple[Any, ...]) -> None:
    """Charge one `c10d::*` call of collective `kind` (its first argument is the output or in-place tensors)."""
    second = flat_tensors(args[1]) if len(args) > 1 else []
    group = boxed_group(args)
    size = int(group.size()) if group is not None else 1
    if kind in _SIZED:
        _check_sizes(kind, args[0], args[1], size)
    costs.charge(kind, second, flat_tensors(args[0]), size, group_ranks(group) if group is not None else None)


def charge(op: torch._ops.OpOverload, args: tuple[Any, ...], result: Any) -> None:
    """Charge one call of collective `op` (one `kind_of` knows) that returned `result`."""
    kind = kind_of(op)
    if op.namespace == "c10d":
        charge_c10d(kind, args)
        return
    group = torch.distributed.distributed_c10d._resolve_process_group(args[-1])
    inputs = [t for t in args if isinstance(t, torch.Tensor)] or list(args[0])
    outputs = [result] if isinstance(result, torch.Tensor) else list(result)
    costs.charge(kind, inputs, outputs, group.size(), group_ranks(group))
