"""Plan mode's charger: the dispatch mode under which every op of a planned rank runs on fake tensors.

Each op runs its fake (meta) kernel and is then charged as the real run's kernel charges it
(`services.account_planned_op`: the same op catalogue, cost model, streams and allocator model), every collective
of the catalogue (`catalogue`) through `costs.charge` as the real process group charges it, and its FLOPs are
counted with PyTorch's `FlopCounterMode` formulas (`flop_registry`; no `FlopCounterMode` mode or module hooks: its
`ModuleTracker` keeps checkpointed layers' tensors alive, pytorch/pytorch#139214, and its mode would stop Dynamo
compiling). A read of a tensor's value (`.item()`) is answered with a symbol that refuses a branch on it
(`plan_values`); an output shape made from one, `bool(t)` and the other reads that return a branch's answer are
refused (`PlanValueError`, naming the script's line), but for the values the plan assumes (a balanced router's
histogram) and those computed from them (`plan_values.AssumedValues`), read exactly.
"""

from __future__ import annotations

import functools
from typing import Any

import sympy
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from neuron_device import services

from . import catalogue, plan_hops
from .plan_state import UNANSWERED, Planner, value_read

__all__ = ["VALUE_READS", "Charger", "tensor_leaves"]

_aten = torch.ops.aten
# Ops that read a tensor's values into Python: a fake tensor has none. `_local_scalar_dense` (`.item()`) is answered
# with a symbol (`plan_values`); the others answer a branch (`bool(t)`, `torch.equal`), refused.
VALUE_READS = frozenset({_aten._local_scalar_dense.default, _aten.is_nonzero.default, _aten.equal.default,
                          _aten.allclose.default})
_FakeTensor = torch._subclasses.fake_tensor.FakeTensor
# the composite kernels a backend with no kernel of its own runs, in the dispatcher's order of preference
_COMPOSITES = (torch._C.DispatchKey.CompositeExplicitAutogradNonFunctional,
               torch._C.DispatchKey.CompositeExplicitAutograd, torch._C.DispatchKey.CompositeImplicitAutograd)
_DEVICE = torch._C.DispatchKey.PrivateUse1
# the tensor types of an op the charger charges itself (any other, a DTensor's, goes on to its subclass)
_PLAIN = frozenset({_FakeTensor, torch.Tensor})
# leaves `tensor_leaves` knows hold no tensor (an op's other arguments)
_NOT_TENSORS = frozenset({int, float, bool, complex, str, type(None), torch.dtype, torch.device, torch.layout,
                          torch.memory_format, torch.SymInt, torch.SymFloat, torch.SymBool})


def tensor_leaves(tree: Any) -> list[torch.Tensor]:
    """The tensors among `tree_leaves(tree)`, in its order. An op's arguments and results are tensors, numbers and
    lists, tuples and dicts of them, walked here without pytree's per-node type dispatch (the charger's `tree_leaves`
    calls were 5 % of a 70B torchtitan rank's plan); any other type is left to pytree (a namedtuple, a registered
    class, a subclass of list, tuple or dict). A loop, not a recursive closure: a closure that calls itself is a
    reference cycle, which would keep the op's tensors alive, and their planned memory allocated, until Python's
    cycle collector runs."""
    found: list[torch.Tensor] = []
    pending = [tree]
    while pending:
        node = pending.pop()
        kind = type(node)
        if kind is list or kind is tuple:
            pending.extend(reversed(node))
        elif kind is dict:
            pending.extend(reversed(node.values()))
        elif isinstance(node, torch.Tensor):
            found.append(node)
        elif kind not in _NOT_TENSORS:
            found.extend(leaf for leaf in tree_leaves(node) if isinstance(leaf, torch.Tensor))
    return found


# Views whose schema does not say so: their composite kernel aliases its input below Python, which on the plan's
# fakes would hand a real meta tensor to the fake mode (a Llama's attention reshape under DDP failed so).
_UNANNOTATED_VIEWS = frozenset({_aten._unsafe_view.default})


@functools.cache
def _kernel_run_whole(op: torch._ops.OpOverload) -> torch._C.DispatchKey | None:
    """The dispatch key of the kernel a real run on `neuron` runs for `op` when that kernel is made of other ops,
    which the plan then runs too (its ops come back to the charger, each charged as the real run's), else None:

    * an ATen op the device registers no kernel for, with a CompositeExplicitAutogradNonFunctional,
      CompositeExplicitAutograd or CompositeImplicitAutograd kernel (the dispatcher prefers each, in that order, to
      the device's fallback): `randn` is an allocation and `normal_`, `zeros_like` one and `zero_`,
      `select_backward` one, `zero_` and a copy; `softmax.int` is `_softmax`, `result_type.Scalar` no kernel at all.
      An implicit one comes here whole where autograd does not decompose it first (under `inference_mode`, or
      called by a kernel run whole): it was charged as a CPU fallback, with a false "fell back to CPU" warning;
    * an op of another library whose own `PrivateUse1` kernel (not the device's) is written in ATen ops: FSDP2's
      `fsdp::all_gather_copy_in`, `split_with_sizes_copy`, `chunk_cat`;
    * an ATen op whose `neuron` kernel is one of the device's made of other ops (`services.composite_kernels`):
      SDPA's fused op, which runs the flash kernel.

    The fake mode sees such an op whole. Views are left whole (they charge nothing either way), and so are the
    catalogue's collectives."""
    name = op.name()
    if op.is_view or op in _UNANNOTATED_VIEWS or catalogue.kind_of(op) is not None:
        return None
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if op.namespace == "aten":
        if has(name, "PrivateUse1"):
            return _DEVICE if name in services.composite_kernels else None
        return next((key for key in _COMPOSITES if has(name, key.name)), None)
    own = name in services.registered_kernels or f"{name}.{op._overloadname}" in services.registered_kernels
    return _DEVICE if op.namespace != "prim" and not own and has(name, "PrivateUse1") else None


def _rewrapped(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """`args` / `kwargs` with each Python number a `Tensor` argument of `func` holds made a 0-d tensor again. A
    composite kernel run whole wraps a Scalar overload's number (`remainder.Scalar` calls `remainder.Tensor` with
    `wrapped_scalar_tensor(3)`); Python dispatch hands the wrapped number to the charger as a plain `int`, which the
    op's Python binding refuses for most ops (all but `add` / `mul`'s kind). The tensor has the dtype the wrapped
    number promotes to with the op's first tensor, so the result's dtype is the real run's."""
    first = next(iter(tensor_leaves((args, kwargs))), None)

    def tensor(value: Any, argument: Any) -> Any:
        if not isinstance(argument.type, torch.TensorType) or type(value) not in (bool, int, float, complex):
            return value
        dtype = torch.result_type(first, value) if first is not None else None
        return torch.scalar_tensor(value, dtype=dtype)

    schema = func._schema.arguments
    args = tuple(tensor(value, argument) for value, argument in zip(args, schema, strict=False))
    named = {argument.name: argument for argument in schema}
    return args, {name: tensor(value, named[name]) if name in named else value for name, value in kwargs.items()}


@functools.cache
def _rng_wrappers() -> tuple[Any, Any]:
    from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

    return run_and_save_rng_state, run_with_rng_state


def _lifted_as_is(func: torch._ops.OpOverload, args: tuple, mode: Any) -> Any:
    """`torch.tensor(data, device="neuron")` lifts the real tensor it made (copied from the host, charged as the real
    run's copy) into the fake mode, which keeps a small one as its constant by cloning it: a `neuron` kernel the real
    run never runs (a tiny Llama's KV-cache set-up charged one a layer). The tensor is `torch.tensor`'s own, so it is
    the constant itself: the fake the mode would make, without the clone. None for any other op."""
    if func is not _aten.lift_fresh.default or type(args[0]) is not torch.Tensor or args[0].device.type != "neuron":
        return None
    return mode.fake_tensor_converter.from_real_tensor(mode, args[0], make_constant=mode.may_turn_const(args[0]))


def _on_neuron(args: tuple, kwargs: dict) -> bool:
    """The op runs on `neuron` (its `device=` or its first tensor's): only there does a real run take its composite
    kernel; a CPU op inside a compiled graph (a `scalar_tensor` constant) stays whole on the plan's fakes, as before."""
    device = kwargs.get("device")
    if device is None:
        device = next((leaf.device for leaf in tensor_leaves(args)), None)
    return device is not None and torch.device(device).type == "neuron"


def _known(args: tuple) -> bool:
    """Every tensor argument is a fake whose value the fake mode tracks (a CPU scalar built from Python numbers,
    such as an optimizer's step count): reading it is exact."""
    return all(getattr(t, "constant", None) is not None for t in args if isinstance(t, torch.Tensor))


def _constants(args: tuple) -> bool:
    """The op has tensor arguments and every one is a fake whose value the fake mode tracks (`_known`)."""
    return any(isinstance(t, torch.Tensor) for t in args) and _known(args)


def _traced(result: Any, mode: Any) -> bool:
    """The op ran on a compiler's fakes (Dynamo tracing a graph inside a DDP forward, where it leaves the plan's
    modes on), not on the script's: it is compile time, which no device time or FLOP is charged for."""
    first = result[0] if isinstance(result, (tuple, list)) and result else result
    return isinstance(first, _FakeTensor) and first.fake_mode is not mode


class Charger(TorchDispatchMode):
    """Charges each op on fake tensors as the real kernel would, and every collective as the process group would."""

    def __init__(self, planner: Planner) -> None:
        super().__init__()
        self.planner = planner
        self.outer: list[Any] = []  # the ops run whole whose kernels run now: FLOPs and an OOM are the outermost's

    # higher-order ops come here whole: AOTAutograd's RNG wrappers run their op (`_rng_wrapped`), the others are
    # charged by `plan_hops`' rules
    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Dynamo compiles a frame only when no dispatch mode on the stack asks to see each eager op (otherwise it
        runs the frame eagerly, silently). A compiled graph is charged as the backend planned it, as in a real run:
        so Dynamo compiles with the plan's modes off, and the compiled code runs with them on."""
        return True

    def _rng_wrapped(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """A compiled graph's RNG wrappers. Activation checkpointing inside a compiled block: AOTAutograd wraps
        each random op the backward recomputes (`run_and_save_rng_state` in the forward, `run_with_rng_state` in the
        backward) so both draw the same numbers. The op runs and is charged as the real run's; the generator's state
        is a planned (valueless) one of its shape, and restoring it changes nothing (a plan draws no numbers)."""
        save, _restore = _rng_wrappers()
        if func is save:
            op, *rest = args
            with self:
                result = op(*rest, **kwargs)
            device = next((t.device for t in tensor_leaves(rest)), None)
            state = torch.neuron.get_rng_state() if device is not None and device.type == "neuron" else \
                torch.get_rng_state()
            return self.planner.fake_mode.from_tensor(state), result
        _, op, *rest = args
        with self:
            return op(*rest, **kwargs)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _rng_wrappers():
            return self._rng_wrapped(func, args, kwargs)
        if not _PLAIN.issuperset(types):
            # a DTensor's op (global shapes): it runs ops on its local shards, which come back here to be charged
            return NotImplemented
        if func in VALUE_READS and not _known(args):
            assumed = self.planner.assumed.computed(func, args, kwargs)
            if assumed is not None:  # a value the plan assumes (`plan_values.AssumedValues`), read as the real run's
                services.account_planned_op(func, args, kwargs, assumed)
                return assumed
            answer = self.planner.answers[-1]() if self.planner.answers else UNANSWERED
            if answer is not UNANSWERED:  # charged as the real run's copy of the value to the host
                services.account_planned_op(_aten._local_scalar_dense.default, args[:1], {}, answer)
                return answer
            if func is _aten._local_scalar_dense.default:  # charged as the real run's copy to the host
                value = self.planner.values.read(args[0])
                services.account_planned_op(func, args, kwargs, value)
                return value
            raise value_read(f"{func.__name__} of a tensor, a branch on its value")
        if any(_traced(leaf, self.planner.fake_mode) for leaf in tensor_leaves((args, kwargs))):
            # compile time (a compiler's fakes): run as is, charged nothing; never through a composite kernel of the
            # plan's, which would mix the compiler's fakes with the plan's (Dynamo's fake SDPA with dropout failed)
            return func(*args, **kwargs)
        lifted = _lifted_as_is(func, args, self.planner.fake_mode)
        if lifted is not None:
            return lifted
        if catalogue.kind_of(func) is not None:
            self._forget_constants((args, kwargs))
        hop = isinstance(func, torch._ops.HigherOrderOperator)
        charged = len(self.planner.charges)
        # (an op on tracked constants alone stays whole: the fake mode computes its value, which a later read takes,
        # as `generate`'s `torch.isin(eos, pad).any()`; a composite's `out=` kernel would leave it without one)
        whole = _kernel_run_whole(func) if not hop and _on_neuron(args, kwargs) and not _constants(args) else None
        composite = whole is not None
        # inside a kernel run whole, its wrapped numbers are Python numbers here
        call_args, call_kwargs = _rewrapped(func, args, kwargs) if self.outer and not hop else (args, kwargs)
        try:
            if composite:  # the ops its kernel calls come back here, each charged as the real run's
                self.outer.append(func)
                with self:
                    result = func._op_dk(whole, *call_args, **call_kwargs)
            else:
                result = func(*call_args, **call_kwargs)
        except torch._subclasses.fake_tensor.DynamicOutputShapeException as error:
            raise value_read(f"{func}, whose output shape depends on the values") from error
        finally:
            if composite:
                self.outer.pop()
        if _traced(result, self.planner.fake_mode):
            return result
        self._refuse_read_shapes(result)
        if not hop:
            self.planner.assumed.ran(func, args, kwargs, result)
        formula = flop_registry.get(getattr(func, "_overloadpacket", func))
        if formula is not None and not self.outer:  # as FlopCounterMode counts: the op the script called
            self.planner.flops += formula(*args, **kwargs, out_val=result)
        if composite:
            return result
        if hop:
            self.planner.allocated(func, plan_hops.charge(func, args, kwargs, result))
        elif catalogue.kind_of(func) is not None:
            catalogue.charge(func, args, result)
        elif len(self.planner.charges) == charged:
            # (else charged inside: the fake mode ran the op for real on its inputs' tracked constants, constant
            # propagation, and a constant on `neuron` (`torch.tensor(data, device="neuron")`, `_lifted_as_is`) ran the
            # device's kernel, which charged it as the real run's: `generate`'s `(eos < 0).any()` and its read were
            # charged twice)
            storages = services.account_planned_op(func, args, kwargs, result)
            self.planner.allocated(self.outer[0] if self.outer else func, storages)
        return result

    def _forget_constants(self, tree: Any) -> None:
        """A collective's inputs are not tracked constants any more (`torch.tensor(n_tokens, device=...)` handed to
        an all-reduce): their values after it come from the peers, which the plan has none of, and the fake mode
        would otherwise run the collective for real on the constants (on the host, with no process group there)."""
        converter = self.planner.fake_mode.fake_tensor_converter
        for leaf in tensor_leaves(tree):
            if isinstance(leaf, _FakeTensor) and leaf.constant is not None:
                converter.invalidate_constant_aliases(leaf.constant)

    def _refuse_read_shapes(self, result: Any) -> None:
        """A tensor whose shape is made from a read value (`torch.empty(n.item())`): its size steers what runs."""
        for leaf in tensor_leaves(result):
            sizes = [size for size in leaf.shape if isinstance(size, torch.SymInt)]
            if sizes:
                where = self.planner.values.origins(sympy.Add(*(size.node.expr for size in sizes)))
                raise value_read(f"a tensor of shape {tuple(leaf.shape)} made from the values {where}")
