"""Plan mode: a compiled graph's host code called again on inputs laid out as an earlier call's replays that call's
effects on the plan instead of running its ops on fakes again.

A static-cache decode runs one compiled graph every token on inputs of the same layouts (only the cache position's
value differs, and a plan has no values): the host code's ops give outputs of the same layouts and charge the same
each time. Running them on fakes was most of a planned decode token's CPU (0.6 s a token for 16 layers of a 70B
TP 32 decode). The first call with a layout runs under a recorder (`_Recorder`), which sorts the ops it sees:

* pure: on host fakes (no `neuron` tensor, no tracked constant), no collective, no value read, and it charged
  nothing (the planner's charges unchanged): its one effect on the plan is the FLOPs the charger counted;
* charged: a collective (`catalogue.kind_of`) on host fakes, as the graph's traced all-reduces (charged to the
  device the host code runs for, `services.running_host_code`): run again in each replay, on fakes of the recorded
  layouts, so it is charged as the first call's was, at the replay's time;
* anything else (a `neuron` op, a value read, a constant, ...): the layout is never replayed, every call runs whole.

A replay runs the charged ops in their order, adds the pure ops' FLOPs and returns outputs of the recorded layouts:
an input or a view of one's storage, a charged op's result or a view of its storage, or fresh host fakes that share
storages as the first call's did (the host code's caller then adopts those on the device, as after a run). Nothing
else differs, so every figure of the plan is the full run's (`test_plan_replay.py` compares whole plans).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from . import catalogue, plan_state
from .plan_charger import VALUE_READS, tensor_leaves

__all__ = ["replaying"]

_Layout = tuple  # (device, dtype, sizes, strides, storage offset, storage bytes)


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


def _layout(tensor: torch.Tensor) -> _Layout:
    return (tensor.device, tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset(),
            tensor.untyped_storage().nbytes())


def _plain(tensor: Any) -> bool:
    """A host fake of static layout whose value the fake mode does not track, needing no gradient."""
    return (type(tensor) is FakeTensor and tensor.device.type != "neuron" and tensor.constant is None
            and not tensor.requires_grad and all(type(n) is int for n in (*tensor.shape, *tensor.stride())))


def _key(args: Sequence[Any]) -> tuple | None:
    """What a call's effects depend on: each input's layout and which inputs share a storage, each other input's
    value (an opaque object, as a DTensor's `DeviceMesh`: its identity; the recorded call keeps it alive), and the grad
    mode; None when a call on these inputs is not replayed (a symbol, a tracked constant, a tensor needing grad)."""
    key: list[Any] = [torch.is_grad_enabled()]
    storages: dict[int, int] = {}
    for arg in args:
        if isinstance(arg, torch.Tensor):
            if not _plain(arg):
                return None
            key.append((_layout(arg), storages.setdefault(_storage(arg), len(storages))))
        elif arg is None or type(arg) in (bool, int, float, str):
            key.append((type(arg), arg))
        elif isinstance(arg, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return None
        else:  # an opaque object the graph takes (a DTensor's `DeviceMesh`): the same one
            key.append(("object", id(arg)))
    return tuple(key)


class _Ref:
    """Where a tensor of a replay comes from: ("input", i), ("result", op, k) (the k-th tensor of a charged op's
    result) or ("fresh", layout)."""

    __slots__ = ("where",)

    def __init__(self, *where: Any) -> None:
        self.where = where


class _Recorder(TorchDispatchMode):
    """Sees each op of a host code's first call with a layout, before the planner's charger (`_Recorder`'s rules in
    the module's doc)."""

    # a higher-order op (a checkpointed graph's RNG wrappers) comes here whole, and on to the charger's rules; it
    # makes the layout never replayed
    supports_higher_order_operators = True

    def __init__(self, planner: Any) -> None:
        super().__init__()
        self.planner = planner
        self.charged: list[tuple[Any, tuple, dict, Any]] = []
        self.flops = 0
        self.replayable = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        charges, flops = len(self.planner.charges), self.planner.flops
        result = func(*args, **kwargs)
        plain = isinstance(func, torch._ops.OpOverload) and func not in VALUE_READS and all(
            _plain(leaf) for leaf in tensor_leaves((args, kwargs, result)))
        if plain and catalogue.kind_of(func) is not None:
            self.charged.append((func, args, kwargs, result))
        elif plain and len(self.planner.charges) == charges:
            self.flops += self.planner.flops - flops
        else:
            self.replayable = False
        return result


class _Replay:
    """A recorded call: its charged ops with where their tensors come from, the pure ops' FLOPs, its outputs."""

    def __init__(self, recorder: _Recorder, args: Sequence[Any], outputs: Any) -> None:
        inputs = {id(arg): i for i, arg in enumerate(args) if isinstance(arg, torch.Tensor)}
        input_storages: dict[int, int] = {}
        for arg, i in ((arg, i) for i, arg in enumerate(args) if isinstance(arg, torch.Tensor)):
            input_storages.setdefault(_storage(arg), i)
        produced: dict[int, tuple[int, int]] = {}
        produced_storages: dict[int, tuple[int, int]] = {}

        def ref(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            if id(value) in inputs:
                return _Ref("input", inputs[id(value)])
            if id(value) in produced:
                return _Ref("result", *produced[id(value)])
            return _Ref("fresh", _layout(value))

        self.steps: list[tuple[Any, Any]] = []
        for op, (func, op_args, op_kwargs, result) in enumerate(recorder.charged):
            self.steps.append((func, tree_map(ref, (op_args, op_kwargs))))
            for k, tensor in enumerate(tensor_leaves(result)):
                produced.setdefault(id(tensor), (op, k))
                produced_storages.setdefault(_storage(tensor), (op, k))
        self.flops = recorder.flops
        self.container = type(outputs)
        self.fresh: list[tuple[torch.device, int]] = []  # the fresh outputs' storages: device, bytes
        fresh: dict[int, int] = {}
        self.outputs: list[tuple] = []
        for value in outputs:
            if not isinstance(value, torch.Tensor):
                self.outputs.append(("value", value))
                continue
            view = (value.device, value.dtype, tuple(value.shape), tuple(value.stride()), value.storage_offset())
            storage = _storage(value)
            if id(value) in inputs:
                self.outputs.append(("input", inputs[id(value)]))
            elif storage in input_storages:
                self.outputs.append(("input view", input_storages[storage], view))
            elif id(value) in produced:
                self.outputs.append(("result", *produced[id(value)]))
            elif storage in produced_storages:
                self.outputs.append(("result view", *produced_storages[storage], view))
            else:
                if storage not in fresh:
                    fresh[storage] = len(self.fresh)
                    self.fresh.append((value.device, value.untyped_storage().nbytes()))
                self.outputs.append(("fresh", fresh[storage], view))

    def __call__(self, args: Sequence[Any], planner: Any) -> Any:
        made: list[list[torch.Tensor]] = []

        def tensor(value: Any) -> Any:
            if not isinstance(value, _Ref):
                return value
            kind, *where = value.where
            if kind == "input":
                return args[where[0]]
            if kind == "result":
                return made[where[0]][where[1]]
            device, dtype, sizes, strides, offset, nbytes = where[0]
            return _view(_storage_of(device, nbytes), (device, dtype, sizes, strides, offset))

        for func, spec in self.steps:
            op_args, op_kwargs = tree_map(tensor, spec)
            made.append(tensor_leaves(func(*op_args, **op_kwargs)))
        planner.flops += self.flops
        storages = [_storage_of(device, nbytes) for device, nbytes in self.fresh]
        outputs = []
        for kind, *where in self.outputs:
            if kind == "value":
                outputs.append(where[0])
            elif kind == "input":
                outputs.append(args[where[0]])
            elif kind == "input view":
                outputs.append(_view(args[where[0]].untyped_storage(), where[1]))
            elif kind == "result":
                outputs.append(made[where[0]][where[1]])
            elif kind == "result view":
                outputs.append(_view(made[where[0]][where[1]].untyped_storage(), where[2]))
            else:
                outputs.append(_view(storages[where[0]], where[1]))
        return self.container(outputs)


def _storage_of(device: torch.device, nbytes: int) -> torch.UntypedStorage:
    """A fresh host fake's storage of `nbytes` (made under the plan's modes, as the graph's own ops make theirs)."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device).untyped_storage()


def _view(storage: torch.UntypedStorage, view: tuple) -> torch.Tensor:
    """A tensor of `view`'s device, dtype, sizes, strides and offset on `storage` (a fake's is on `meta`)."""
    device, dtype, sizes, strides, offset = view
    return torch.empty(0, dtype=dtype, device=device).set_(storage, offset, sizes, strides)


def replaying(run_graph: Callable[[Any, Sequence[Any]], Any]) -> Callable[[Any, Sequence[Any]], Any]:
    """neuron-compile's `AtenHostCode.run_graph` for a plan: a call on inputs laid out as an earlier call's (of the
    same host code) replays that call (the module's doc)."""
    # (host code, key) -> (the host code and its other inputs, alive as their ids are in the key; the replay or None)
    replays: dict[tuple[int, tuple], tuple[tuple, _Replay | None]] = {}

    def planned(self: Any, args: Sequence[Any]) -> Any:
        planner = plan_state.active_planner() if plan_state.is_planning() else None
        key = _key(args) if planner is not None and not planner.assumed.holds_values() else None
        if key is None:
            return run_graph(self, args)
        found = replays.get((id(self), key))
        if found is not None:
            replay = found[1]
            return run_graph(self, args) if replay is None else replay(args, planner)
        recorder = _Recorder(planner)
        with recorder:
            outputs = run_graph(self, args)
        replayable = recorder.replayable and _key(args) == key and isinstance(outputs, (list, tuple)) and all(
            _plain(value) if isinstance(value, torch.Tensor) else value is None or type(value) in (bool, int, float)
            for value in outputs)
        kept = (self, *(arg for arg in args if not isinstance(arg, torch.Tensor)))  # not the tensors: their memory
        replays[(id(self), key)] = (kept, _Replay(recorder, args, outputs) if replayable else None)
        return outputs

    return planned
