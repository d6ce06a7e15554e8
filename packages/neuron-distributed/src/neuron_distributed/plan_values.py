"""Plan mode's read values: a read of a planned tensor's value (`.item()`, `.tolist()`, `float(t)`) is answered with
an unbacked symbol of PyTorch's symbolic shapes (`ShapeEnv.create_unbacked_symint` / `symfloat` / `symbool`, what
`FakeTensorMode` answers `.item()` with while Dynamo traces). The symbol flows through Python arithmetic and tensor
ops (`loss_sum / global_valid_tokens`: the op is charged as the real run's, whatever the value), and prints as its
name (`u0`, `zuf0`). Where the value would steer the run it is refused: a branch on it (`bool`, `if`, `int()`,
`float()`, indexing a Python container) raises `PlanValueError` naming the line that branches and the line that read
the value, and so does a tensor shape made from it (the charger refuses it, `plan_charger`). No value is made up, but for one stated assumption:

* All-to-all split sizes read from values (`all_to_all_single` with split sizes from `.tolist()`: an MoE's tokens
  per expert, exchanged for expert parallelism) are planned as a balanced router's: each rank sends an equal share
  of its rows to every peer and receives as many as it sends (`balanced_splits`). Every plan that assumes it says so
  in its report (`assumptions`).

The symbols' `ShapeEnv` (`PlannedValues`) is the plan's own: the plan's `FakeTensorMode` keeps static shapes, and
Dynamo compiles with its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy
import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, ShapeEnv
from torch.utils._pytree import tree_leaves

from .plan_state import PlanValueError, user_frame, value_read

__all__ = ["BALANCED_ALL_TO_ALL", "BranchPlanValueError", "PlannedValues", "balanced_splits", "planned_format", "planned_index", "planned_tensor",
           "planned_tensor_format"]


class BranchPlanValueError(PlanValueError, GuardOnDataDependentSymNode):
    """A branch on a value the plan answered with a symbol: a `PlanValueError` for the script, and torch's
    data-dependent guard error for torch code that catches that one to take a value-free path."""

    def __init__(self, cond: sympy.Basic, message: str) -> None:
        GuardOnDataDependentSymNode.__init__(self, cond, message)


class PlannedValues(ShapeEnv):
    """The symbols that stand for the values a plan's script read; a guard on one (a branch) is refused."""

    def read(self, tensor: torch.Tensor) -> torch.SymInt | torch.SymFloat | torch.SymBool:
        """A symbol for the value of one-element `tensor`, of its dtype's Python kind."""
        if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
            return self.create_unbacked_symfloat()
        if tensor.dtype is torch.bool:
            return self.create_unbacked_symbool()
        return self.create_unbacked_symint()

    def origins(self, expr: sympy.Basic) -> str:
        """Where the script read the values `expr` is made of: `name at file:line ('code')`, one for each."""
        found = []
        for symbol in sorted(expr.free_symbols, key=str):
            stack = self.var_to_stack.get(symbol)
            frame = user_frame(stack.summary()) if stack is not None else None
            where = f"{frame.filename}:{frame.lineno} ({(frame.line or '').strip()!r})" if frame else "the script"
            found.append(f"{symbol} read at {where}")
        return ", ".join(found)

    def _make_data_dependent_error(self, expr: sympy.Basic, unhinted_expr: sympy.Basic, *,
                                   expr_sym_node_id: int | None = None) -> GuardOnDataDependentSymNode:
        error = value_read(f"a branch on {unhinted_expr}, where {self.origins(unhinted_expr)}; plan mode answers a "
                           "read with a symbol that arithmetic and tensor ops take, but not a branch")
        return BranchPlanValueError(unhinted_expr, str(error))


def planned_format(format_: Callable[[Any, str], str]) -> Callable[[Any, str], str]:
    """`SymInt` / `SymFloat` / `SymBool.__format__` in plan mode: a read value formatted with a spec (a log line's
    `f"{loss:8.5f}"`) prints as its symbol, as it does without a spec; other symbols format as before."""

    def __format__(self: Any, spec: str) -> str:
        if spec and isinstance(self.node.shape_env, PlannedValues):
            return str(self)
        return format_(self, spec)

    return __format__


def _read(value: Any) -> bool:
    """`value` is a symbol the plan answered a read with."""
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)) and \
        isinstance(value.node.shape_env, PlannedValues)


def planned_tensor_format(format_: Callable[[Any, str], str]) -> Callable[[Any, str], str]:
    """`Tensor.__format__` in plan mode: a planned 0-d tensor formatted with a spec (`f"{loss:.3f}"`) prints as the
    symbol its read (`.item()`, charged as the real run's) is answered with; torch's formats only a plain `Tensor`'s
    value and raises `TypeError` for a fake's."""

    def __format__(self: torch.Tensor, spec: str) -> str:
        if spec and self.dim() == 0 and isinstance(self, torch._subclasses.fake_tensor.FakeTensor):
            return format(self.detach().item(), spec)
        return format_(self, spec)

    return __format__


def planned_index(index_: Callable[..., Any]) -> Callable[..., Any]:
    """`Tensor.__getitem__` / `__setitem__` in plan mode: an index made from a read value (`t[i]`, `t[:i]`, `i = x.item()`)
    picks the elements by the value, which the plan has none of: refused naming the line (torch's own error is an
    `IndexError` about the index's type)."""

    def indexed(self: torch.Tensor, index: Any, *rest: Any) -> Any:
        read = [leaf for leaf in tree_leaves(_sliced(index)) if _read(leaf)]
        if read:
            shape_env = read[0].node.shape_env
            where = shape_env.origins(sympy.Add(*(leaf.node.expr for leaf in read)))
            raise value_read(f"an index made from the values {where}")
        return index_(self, index, *rest)

    return indexed


def _sliced(index: Any) -> Any:
    """`index` with each slice made its bounds and step (`x[: sum(sizes)]`): `tree_leaves` takes a slice whole."""
    if isinstance(index, slice):
        return [index.start, index.stop, index.step]
    if isinstance(index, (tuple, list)):
        return [_sliced(part) for part in index]
    return index


def planned_tensor(tensor_: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`torch.tensor` in plan mode: a read value made a 0-d tensor again (`torch.tensor(loss.item(), device=...)`,
    to feed arithmetic or a collective) is a planned 0-d tensor of the value's dtype (`torch.full`, whose fill the
    fake mode takes as a symbol); torch's converts the value to a Python number, a branch on it. A list of read
    values is still refused so."""

    def tensor(data: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        if _read(data) and not args:
            requires_grad = kwargs.pop("requires_grad", False)
            kwargs.pop("pin_memory", None)
            return torch.full((), data, **kwargs).requires_grad_(requires_grad)
        return tensor_(data, *args, **kwargs)

    return tensor


BALANCED_ALL_TO_ALL = ("all-to-all split sizes read from values (an MoE's tokens per expert) planned as a balanced "
                       "router's: each rank sends an equal share of its rows to every peer and receives as many")
_ALL_TO_ALL = torch.ops._c10d_functional.all_to_all_single.default


def balanced_splits(func: Any, args: tuple) -> tuple[tuple, bool]:
    """`all_to_all_single`'s arguments with split sizes made from read values (`input_splits.tolist()`, tokens per
    expert) replaced by a balanced router's: the input's rows split evenly among the group's ranks (the first
    `rows % ranks` one more), and the same from each peer, so the output has the input's rows (a list of given
    sizes is kept). The output's size
    steers the rest of the step, and the values are the router's choices, which a plan has none of: this is the
    plan's one assumed value, returned as True to be reported. Any other call is returned as it is, with False."""
    if func is not _ALL_TO_ALL or not any(_read(size) for sizes in args[1:3] for size in sizes):
        return args, False
    rows, ranks = args[0].shape[0], len(args[1]) or len(args[2])
    balanced = [rows // ranks + (rank < rows % ranks) for rank in range(ranks)]
    output, input_ = (balanced if any(_read(size) for size in sizes) else sizes for sizes in args[1:3])
    return (args[0], output, input_, *args[3:]), True
