"""Plan mode's read values: a read of a planned tensor's value (`.item()`, `.tolist()`, `float(t)`) is answered with
an unbacked symbol of PyTorch's symbolic shapes (`ShapeEnv.create_unbacked_symint` / `symfloat` / `symbool`, what
`FakeTensorMode` answers `.item()` with while Dynamo traces). The symbol flows through Python arithmetic and tensor
ops (`loss_sum / global_valid_tokens`: the op is charged as the real run's, whatever the value), and prints as its
name (`u0`, `zuf0`). Where the value would steer the run it is refused: a branch on it (`bool`, `if`, `int()`,
`float()`, indexing a Python container) raises `PlanValueError` naming the line that branches and the line that read
the value, and so does a tensor shape made from it (the charger refuses it, `plan_charger`). No value is made up,
but for stated assumptions (`plan_hops.ONE_DOCUMENT` for a flex-attention document mask, and):

* A **balanced router**: a histogram of planned values (`torch.histc`: an MoE router's tokens per expert) is
  uniform, and the same on every rank (`AssumedValues`). Its value, and the values computed from it (the split sizes
  of expert parallelism's all-to-all, the tokens each local expert gets), are computed on the host, so reading them
  is exact under the assumption. Every plan that assumes it says so in its report (`assumptions`).

The symbols' `ShapeEnv` (`PlannedValues`) is the plan's own: the plan's `FakeTensorMode` keeps static shapes, and
Dynamo compiles with its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy
import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, ShapeEnv
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.weak import WeakIdKeyDictionary

from .plan_state import PlanValueError, user_frame, value_read

__all__ = ["BALANCED_ROUTER", "AssumedValues", "BranchPlanValueError", "PlannedValues", "planned_format",
           "planned_index", "planned_tensor", "planned_tensor_format"]


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
    """`Tensor.__getitem__` / `__setitem__` in plan mode: an index made from a read value (`t[i]`, `t[:i]`,
    `i = x.item()`) picks the elements by the value, which the plan has none of: refused naming the line (torch's
    own error is an `IndexError` about the index's type)."""

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



BALANCED_ROUTER = ("a balanced router: a histogram of planned values (torch.histc, an MoE router's tokens per expert) "
                   "is uniform and the same on every rank; values computed from it (all-to-all split sizes, tokens "
                   "per local expert) are computed from it")
_ops = torch.ops
_HISTOGRAM = _ops.aten.histc.default
_WAIT = _ops._c10d_functional.wait_tensor.default
_ALL_TO_ALL = _ops._c10d_functional.all_to_all_single.default


class AssumedValues:
    """The values the plan assumes for planned tensors, on the host, by planned tensor: a histogram's (`histc`), and
    those of ops run on tensors whose values are all assumed (computed for real on the host values). An op that
    writes a tensor from ones without a value leaves it without one. A balanced router routes as evenly from every
    rank, so an all-to-all of an assumed value receives from each peer what the rank sends itself."""

    def __init__(self) -> None:
        self._values = WeakIdKeyDictionary()
        self.assumed = False  # a histogram was assumed uniform: the plan reports `BALANCED_ROUTER`
        self.stated: set[str] = set()  # the other assumptions made (`plan_hops.ONE_DOCUMENT`)

    def reported(self) -> list[str]:
        """What the plan assumed, for its report."""
        return ([BALANCED_ROUTER] if self.assumed else []) + sorted(self.stated)

    def holds_values(self) -> bool:
        """Some planned tensor has an assumed value (ops on it compute values the plan reads later)."""
        return bool(self._values)

    def state(self, assumption: str) -> None:
        """The plan made `assumption` (a sentence for its report) where values it has none of steer the charges."""
        self.stated.add(assumption)

    def get(self, tensor: Any) -> torch.Tensor | None:
        """The assumed host value of `tensor`, or None."""
        return self._values.get(tensor) if isinstance(tensor, torch.Tensor) else None

    def ran(self, func: Any, args: tuple, kwargs: dict, result: Any) -> None:
        """Op `func` ran on the planned tensors `args` / `kwargs`, giving `result`: record the values it assumes or
        computes, and forget those of tensors it wrote from values the plan has none of."""
        if func is _HISTOGRAM and self.get(args[0]) is None:
            self._values[result] = _uniform(args[0].numel(), result)
            self.assumed = True
            return
        if not self._values:
            return
        known = [self.get(leaf) for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]
        if all(value is None for value in known):
            return
        values = self.computed(func, args, kwargs)
        outputs = [leaf for leaf in tree_leaves(result) if isinstance(leaf, torch.Tensor)]
        written = [arg for arg, argument in zip(args, func._schema.arguments, strict=False)
                   if argument.alias_info is not None and argument.alias_info.is_write]
        for tensor in (*outputs, *written):
            self._values.pop(tensor, None)
        if values is not None:
            for tensor, value in zip(outputs, [v for v in tree_leaves(values) if isinstance(v, torch.Tensor)],
                                     strict=False):
                self._values[tensor] = value

    def computed(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """`func` run on the host values of its tensors (a read, `.item()`, returns the value); None where one has no
        assumed value or the plan cannot say what it computes (a collective other than an evenly split
        all-to-all)."""
        tensors = [leaf for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]
        if not tensors or any(self.get(leaf) is None for leaf in tensors):
            return None
        if func is _WAIT:
            return self.get(args[0])
        if func is _ALL_TO_ALL:
            return self._all_to_all(*args)
        if func.namespace not in ("aten", "prims"):
            return None

        def host(leaf: Any) -> Any:
            if isinstance(leaf, torch.Tensor):
                return self.get(leaf)
            return torch.device("cpu") if isinstance(leaf, torch.device) and leaf.type == "neuron" else leaf

        kwargs = {k: "cpu" if k == "device" and v is not None else v for k, v in kwargs.items()}
        with _disable_current_modes():
            return func(*tree_map(host, args), **tree_map(host, kwargs))

    def _all_to_all(self, tensor: torch.Tensor, output_splits: list, input_splits: list, group_name: str) -> Any:
        """An all-to-all of an assumed value: every rank holds the same value (a balanced router's), so each peer
        sends this rank the chunk this rank sends itself."""
        group = torch.distributed.distributed_c10d._resolve_process_group(group_name)
        if any(_read(size) for size in (*output_splits, *input_splits)) or len(set(input_splits)) > 1 \
                or list(output_splits) != list(input_splits):
            return None
        with _disable_current_modes():
            own = self.get(tensor).split(list(input_splits))[group.rank()]
            return torch.cat([own] * group.size())


def _uniform(count: int, histogram: torch.Tensor) -> torch.Tensor:
    """`count` values spread evenly over the bins of `histogram` (the first `count % bins` one more)."""
    bins = histogram.numel()
    with _disable_current_modes():
        spread = torch.full((bins,), count // bins, dtype=torch.int64) + (torch.arange(bins) < count % bins)
        return spread.to(histogram.dtype).reshape(histogram.shape)
