"""Direct `neuron` kernels for the hot functional ops: the boxed fallback's work, minus what these ops never need.

The boxed fallback (`fallback.run_on_host`) handles every op: `out=`, in-place results, generators, views of
inputs, mixed devices, 64-bit downcasting. Structured ops also reach it as their `.out` overload, after a separate
`empty` kernel call for the output. For the ops a model runs on every step (pointwise, reductions, softmax,
copies, embedding and indexing) the common call needs none of that: all tensor arguments are `neuron` tensors of
one device, and the result is a fresh tensor (or, in place, `self`). A kernel on the overload itself does exactly
that call, with a plan per overload computed at registration:

* the CPU kernel runs on zero-copy host aliases of the inputs (`storage.kernel_input`: the storage's host twin itself
  for an input laid out as it, as op results are), and its fresh result is adopted as device storage (an in-place op
  writes device memory through the alias and returns `self`);
* it is charged to the same signature cache of the op ledger (`simulation.ledger`) as the fallback (one dict lookup per call);
* anything outside the common call (a CPU tensor, two devices, 64-bit downcasting, a Python number where the
  schema has a Tensor) goes to `run_on_host` unchanged, so results and errors are the fallback's.

The kernels are installed last (after plugins) and only on overloads that have no direct kernel yet, so a plugin's
kernel (e.g. neuron-nki's softmax) keeps precedence.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import allocator
from .. import numerics as _numerics
from ..barrier import flush_barrier
from ..fallback import executed_ops, run_on_host, tensor_list
from ..simulation import ledger as _ledger
from ..storage import adopt, kernel_input
from . import registry
from .catalogue import op_info

__all__ = ["HOT_OPS", "Record", "install", "run_direct", "set_recorder"]

_Tensor = torch.Tensor
_NUMBERS = (bool, int, float, complex)

# Op packets of the hot path (issue 4): every functional overload of each gets a direct kernel.
HOT_OPS: tuple[str, ...] = (
    # pointwise
    "add", "sub", "rsub", "mul", "div", "pow", "neg", "exp", "log", "sqrt", "rsqrt", "reciprocal", "abs", "sigmoid",
    "tanh", "silu", "gelu", "relu", "erf", "sin", "cos", "maximum", "minimum", "clamp", "clamp_min", "clamp_max",
    "where", "masked_fill", "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "lerp", "addcmul", "addcdiv",
    "threshold_backward", "gelu_backward", "sigmoid_backward", "tanh_backward", "fill_", "zero_", "add_", "sub_",
    "mul_", "div_", "addcmul_", "addcdiv_", "lerp_", "sqrt_", "clamp_", "masked_fill_",
    # reductions
    "sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "prod", "var", "std", "var_mean",
    "linalg_vector_norm", "logsumexp", "cumsum", "all", "any",
    # softmax, norms, losses
    "_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data", "native_layer_norm_backward",
    "_fused_rms_norm", "nll_loss_forward", "nll_loss_backward", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    # copies, gather, embedding
    "clone", "cat", "index", "index_select", "gather", "embedding", "embedding_dense_backward", "tril", "triu",
)


def _is_tensor_type(type_: torch._C.JitType) -> bool:
    text = str(type_)
    return text in ("Tensor", "Optional[Tensor]", "List[Tensor]", "List[Optional[Tensor]]")


def _dropout_position(op: torch._ops.OpOverload) -> int | None:
    """Where a seeded op takes its `dropout_p` (attention): with `dropout_p == 0` it draws no random numbers."""
    names = [a.name for a in op._schema.arguments]
    return names.index("dropout_p") if "dropout_p" in names else None


def _fast_eligible(op: torch._ops.OpOverload) -> bool:
    """A functional overload (returns fresh tensors) or an in-place one (writes and returns only `self`), taking no
    generator or device and drawing no random numbers (or only through a `dropout_p` checked per call)."""
    schema = op._schema
    arguments, returns = schema.arguments, schema.returns
    if not returns or any(str(r.type) != "Tensor" for r in returns):
        return False
    in_place = arguments[0].alias_info is not None and arguments[0].alias_info.is_write
    if in_place:
        if len(returns) != 1 or returns[0].alias_info is None or any(a.alias_info is not None for a in arguments[1:]):
            return False
    elif any(a.alias_info is not None for a in arguments) or any(r.alias_info is not None for r in returns):
        return False
    if any(str(a.type) in ("Optional[Generator]", "Optional[Device]", "Device") for a in arguments):
        return False
    if torch.Tag.nondeterministic_seeded in op.tags and _dropout_position(op) is None:
        return False
    return any(_is_tensor_type(a.type) for a in arguments if not a.kwarg_only)


class _Plan:
    """What one call of a fast kernel needs, computed once per overload."""

    __slots__ = ("call", "dropout_position", "in_place", "info", "name", "op", "scalar_call", "scalar_op",
                 "tensor_positions")

    def __init__(self, op: torch._ops.OpOverload) -> None:
        schema = op._schema
        self.op = op
        self.call = op._op  # the C++ callable `OpOverload.__call__` forwards to, minus that Python frame
        first = schema.arguments[0].alias_info
        self.in_place = first is not None and first.is_write
        self.info = op_info(op)
        self.name = self.info.name
        seeded = torch.Tag.nondeterministic_seeded in op.tags
        self.dropout_position = _dropout_position(op) if seeded else None
        self.tensor_positions = tuple(
            i for i, a in enumerate(schema.arguments) if not a.kwarg_only and _is_tensor_type(a.type)
        )
        # `x + 0.5` reaches `add.Tensor` with a Python number as `other`: the `.Scalar` overload is what the CPU
        # runs for it (a wrapped-number tensor), so a number in position 1 calls that overload directly.
        packet = getattr(torch.ops.aten, schema.name.partition("::")[2])
        scalar = getattr(packet, "Scalar", None) if schema.overload_name == "Tensor" else None
        self.scalar_op = scalar if scalar is not None and self._same_arguments(scalar) else None
        self.scalar_call = None if self.scalar_op is None else self.scalar_op._op

    def _same_arguments(self, other: torch._ops.OpOverload) -> bool:
        ours, theirs = self.op._schema.arguments, other._schema.arguments
        return [a.name for a in ours] == [a.name for a in theirs] and str(theirs[1].type) in ("Scalar", "number")


def _adopt(result, host: list, args: tuple, positions: tuple[int, ...], index: int):
    """The `neuron` form of a host result: an input's own tensor if the kernel returned its alias (in-place ops
    return `self`), else the fresh result adopted as device storage."""
    if type(result) is tuple or type(result) is list:
        return type(result)(_adopt(r, host, args, positions, index) for r in result)
    if not isinstance(result, torch.Tensor):
        return result  # an optional output left undefined (None), or a number
    for position in positions:
        if position < len(host) and result is host[position]:
            return args[position]
    return allocator.adopt_tracked(result, index)


def _direct(plan: _Plan, args: tuple, kwargs: dict):
    """Run the common call of `plan.op` on host aliases; None if the call is not the common one."""
    if _numerics.downcast_64bit:
        return None
    dropout = plan.dropout_position
    if dropout is not None and (args[dropout] if dropout < len(args) else kwargs.get("dropout_p", 0.0)) != 0.0:
        return None  # draws random numbers: the fallback runs it on the device's generator
    if kwargs:
        for value in kwargs.values():
            if isinstance(value, _Tensor):
                return None
    index = -1
    host = list(args)  # becomes the host arguments: aliases in place of the `neuron` tensors
    call = plan.call
    count = len(args)
    for position in plan.tensor_positions:
        if position >= count:
            break
        value = args[position]
        if isinstance(value, _Tensor):
            device = value.get_device()  # `joined_device`, inline: -1 for CPU and meta tensors
            if device < 0 or (index >= 0 and device != index):
                return None
            index = device
            host[position] = kernel_input(value)
        elif type(value) is list or type(value) is tuple:
            walked = tensor_list(value, index, kernel_input)
            if walked is None:
                return None
            host[position], index = walked
        elif value is not None:
            if position != 1 or plan.scalar_call is None or not isinstance(value, _NUMBERS):
                return None
            call = plan.scalar_call
    if index < 0:
        return None
    executed_ops[plan.name] += 1
    result = call(*host, **kwargs)
    if type(result) is _Tensor and not plan.in_place:  # a functional op's one result is fresh: the common case
        tensor = adopt(result, index)
        _ledger.charge(plan.info, index, host, kwargs, result)
        return allocator.track(tensor, index)
    _ledger.charge(plan.info, index, host, kwargs, result)
    return _adopt(result, host, args, plan.tensor_positions, index)


Record = Callable[[_Plan, tuple, dict], Any]
_record: Record | None = None


def _recorded(plan: _Plan, args: tuple, kwargs: dict):
    """`_direct` behind adaptive eager's recorder: the op is queued, or run now when the recorder returns None (after
    the ops queued before it: only adaptive eager queues ops, so plain eager's `_direct` has no barrier to pass)."""
    result = _record(plan, args, kwargs)
    if result is not None:
        return result
    flush_barrier()
    return _direct(plan, args, kwargs)


_call = _direct  # what every fast kernel calls: `_direct`, or `_recorded` while adaptive eager is on


def set_recorder(record: Record | None) -> None:
    """Adaptive eager installs its `record` in front of the direct call of every fast kernel (None removes it), so
    plain eager's calls pay nothing for the feature."""
    global _call, _record
    _record = record
    _call = _direct if record is None else _recorded


def run_direct(op: torch._ops.OpOverload, *args, **kwargs):
    """`op` on `neuron` tensors: the direct call when it applies, else the boxed fallback."""
    plan = _plans.get(op) or _plan(op)
    if plan is not None:
        result = _call(plan, args, kwargs)
        if result is not None:
            return result
    return run_on_host(op, *args, **kwargs)


_plans: dict[torch._ops.OpOverload, _Plan | None] = {}


def _plan(op: torch._ops.OpOverload) -> _Plan | None:
    plan = _plans[op] = _Plan(op) if _fast_eligible(op) else None
    return plan


def _kernel(op: torch._ops.OpOverload) -> Callable:
    plan = _plan(op)

    def run(*args, **kwargs):
        result = _call(plan, args, kwargs)
        return run_on_host(op, *args, **kwargs) if result is None else result

    run.__name__ = f"{op._schema.name.partition('::')[2]}_fast"
    return run


def _differentiable_only_by_decomposition(op: torch._ops.OpOverload) -> bool:
    """A CompositeImplicitAutograd overload with no autograd formula (`min.other`, `where.ScalarOther`, `var.dim`):
    a backend kernel would replace the decomposition autograd differentiates, and silently cut the graph."""
    keys = torch._C.DispatchKey
    try:
        composite = op.has_kernel_for_dispatch_key(keys.CompositeImplicitAutograd)
    except RuntimeError:  # an overload only TorchScript knows (`index.Tensor_hacked_twin`)
        return False
    return composite and not op.has_kernel_for_dispatch_key(keys.Autograd)


def install() -> None:
    """Register the fast kernels on every eligible overload of `HOT_OPS` that has no direct kernel yet."""
    aten = torch.ops.aten
    for packet_name in HOT_OPS:
        packet = getattr(aten, packet_name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            name = op_info(op).name
            if name in registry.kernels or op_info(op).engine is None or not _fast_eligible(op):
                continue
            if _differentiable_only_by_decomposition(op):
                continue
            registry.register(name, _kernel(op))
            registry.builtin.add(name)
