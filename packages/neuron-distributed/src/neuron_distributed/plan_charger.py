"""Plan mode's charger: the dispatch mode under which every op of a planned rank runs on fake tensors.

Each op runs its fake (meta) kernel and is then charged as the real run's kernel charges it
(`services.account_planned_op`: the same op catalogue, cost model, streams and allocator model), every collective
of the catalogue (`catalogue`) through `costs.charge` as the real process group charges it, and its FLOPs are
counted with PyTorch's `FlopCounterMode` formulas (`flop_registry`; no `FlopCounterMode` mode or module hooks: its
`ModuleTracker` keeps checkpointed layers' tensors alive, pytorch/pytorch#139214, and its mode would stop Dynamo
compiling). A read of a tensor's value is refused (`PlanValueError`, naming the script's line).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from neuron_device import services

from . import catalogue
from .plan_state import Planner, value_read

__all__ = ["Charger"]

_aten = torch.ops.aten
# Ops that read a tensor's values into Python: a fake tensor has none.
_VALUE_READS = frozenset({_aten._local_scalar_dense.default, _aten.is_nonzero.default, _aten.equal.default,
                          _aten.allclose.default})
_FakeTensor = torch._subclasses.fake_tensor.FakeTensor
_COMPOSITE = torch._C.DispatchKey.CompositeExplicitAutograd
_DEVICE = torch._C.DispatchKey.PrivateUse1


# Views whose schema does not say so: their composite kernel aliases its input below Python, which on the plan's
# fakes would hand a real meta tensor to the fake mode (a Llama's attention reshape under DDP failed so).
_UNANNOTATED_VIEWS = frozenset({_aten._unsafe_view.default})


@functools.cache
def _kernel_run_whole(op: torch._ops.OpOverload) -> torch._C.DispatchKey | None:
    """The dispatch key of the kernel a real run on `neuron` runs for `op` when that kernel is made of other ops,
    which the plan then runs too (its ops come back to the charger, each charged as the real run's), else None:

    * an ATen op the device registers no kernel for, with a CompositeExplicitAutograd kernel (the dispatcher prefers
      it to the device's fallback): `randn` is an allocation and `normal_`, `zeros_like` one and `zero_`;
    * an op of another library whose own `PrivateUse1` kernel (not the device's) is written in ATen ops: FSDP2's
      `fsdp::all_gather_copy_in`, `split_with_sizes_copy`, `chunk_cat`.

    The fake mode sees such an op whole. Views are left whole (they charge nothing either way), and so are the
    catalogue's collectives."""
    name = op.name()
    if op.is_view or op in _UNANNOTATED_VIEWS or catalogue.kind_of(op) is not None:
        return None
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if op.namespace == "aten":
        return _COMPOSITE if not has(name, "PrivateUse1") and has(name, "CompositeExplicitAutograd") else None
    own = name in services.registered_kernels or f"{name}.{op._overloadname}" in services.registered_kernels
    return _DEVICE if op.namespace != "prim" and not own and has(name, "PrivateUse1") else None


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
        device = next((leaf.device for leaf in tree_leaves(args) if isinstance(leaf, torch.Tensor)), None)
    return device is not None and torch.device(device).type == "neuron"


def _known(args: tuple) -> bool:
    """Every tensor argument is a fake whose value the fake mode tracks (a CPU scalar built from Python numbers,
    such as an optimizer's step count): reading it is exact."""
    return all(getattr(t, "constant", None) is not None for t in args if isinstance(t, torch.Tensor))


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

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Dynamo compiles a frame only when no dispatch mode on the stack asks to see each eager op (otherwise it
        runs the frame eagerly, silently). A compiled graph is charged as the backend planned it, as in a real run:
        so Dynamo compiles with the plan's modes off, and the compiled code runs with them on."""
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(t is not _FakeTensor and t is not torch.Tensor for t in types):
            # a DTensor's op (global shapes): it runs ops on its local shards, which come back here to be charged
            return NotImplemented
        if func in _VALUE_READS and not _known(args):
            if self.planner.answers:
                return next(self.planner.answers[-1])
            raise value_read(f"{func.__name__} of a tensor")
        if any(_traced(leaf, self.planner.fake_mode) for leaf in tree_leaves((args, kwargs))):
            # compile time (a compiler's fakes): run as is, charged nothing; never through a composite kernel of the
            # plan's, which would mix the compiler's fakes with the plan's (Dynamo's fake SDPA with dropout failed)
            return func(*args, **kwargs)
        lifted = _lifted_as_is(func, args, self.planner.fake_mode)
        if lifted is not None:
            return lifted
        whole = _kernel_run_whole(func) if _on_neuron(args, kwargs) else None
        composite = whole is not None
        try:
            if composite:  # the ops its kernel calls come back here, each charged as the real run's
                self.outer.append(func)
                with self:
                    result = func._op_dk(whole, *args, **kwargs)
            else:
                result = func(*args, **kwargs)
        except torch._subclasses.fake_tensor.DynamicOutputShapeException as error:
            raise value_read(f"{func}, whose output shape depends on the values") from error
        finally:
            if composite:
                self.outer.pop()
        if _traced(result, self.planner.fake_mode):
            return result
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None and not self.outer:  # as FlopCounterMode counts: the op the script called
            self.planner.flops += formula(*args, **kwargs, out_val=result)
        if composite:
            return result
        if catalogue.kind_of(func) is not None:
            catalogue.charge(func, args, result)
        else:
            storages = services.account_planned_op(func, args, kwargs, result)
            self.planner.allocated(self.outer[0] if self.outer else func, storages)
        return result
