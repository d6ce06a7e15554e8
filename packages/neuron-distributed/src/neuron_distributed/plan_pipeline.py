"""Pipeline parallelism in plan mode: two micro-batches through a rank's stages, then the schedule from the costs.

A `torch.distributed.pipelining` schedule's `step` would run every micro-batch through the stage, exchanging
activations with the neighbouring stages' ranks. A planned rank has no neighbours and each micro-batch costs the
same but the first (its backward creates the gradients, the later ones accumulate into them), so plan mode runs two
micro-batches' forward and backward through each of the rank's stages (charged as a real run charges them, on this
rank's timeline), ends the step as the schedules do (`perform_reduce_grad`) and keeps, per stage: forward seconds,
backward seconds (the first apart), the bytes its forward keeps alive until the backward, and the bytes it sends to
the next stage. Plan mode then lays out the step
from those costs and the schedule itself (`schedule.pipeline_order`, PyTorch's list of actions of every pipeline
rank, the one a real run executes, or for GPipe and 1F1B the order their `_step_microbatches` runs), with the
point-to-point transfers where the schedule's code issues them and the waits for them where it waits (a real run
times them so: `p2p`): an action starts when its rank is free and its input has arrived (the previous stage's
forward, or the next stage's backward, plus its transfer when the stages are on different ranks); a transfer starts
when it is issued, after the sender's earlier transfers; the bubble comes out of the dependencies. The cost of
planning is two micro-batches per stage, whatever the number of micro-batches or the world size.

What is PyTorch's: the schedules, their action lists and stage-to-rank mapping, the input splitting. Ours: running
two micro-batches instead of all, and timing each rank's program of actions, transfers and waits (`lay_out`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from neuron_device import services
from neuron_device.services import flat_tensors

from . import costs
from .plan_state import active_planner

__all__ = ["Layout", "RoleReused", "StageCost", "announcing_stage_ranks", "combine", "exchanging_stage_outputs",
           "identifying_roles", "lay_out", "outputs_bytes", "patched_schedules", "send_seconds"]

_COMPUTE = {"F": "forward", "B": "backward"}
_IGNORED = frozenset({"REDUCE_GRAD", "UNSHARD", "RESHARD", "SEND_F", "RECV_F", "SEND_B", "RECV_B"})


@dataclasses.dataclass
class StageCost:
    """One micro-batch through one pipeline stage, as planned."""

    stage_index: int
    forward_seconds: float
    backward_seconds: float
    activation_bytes: int  # kept alive from the stage's forward of a micro-batch to its backward
    send_bytes: int  # the forward's output, sent to the next stage (its gradient comes back the same size)
    send_seconds: float  # that transfer, priced by the cost model for the two stages' placement
    # the step's first backward through the stage: it creates the gradients, the later ones accumulate into them
    first_backward_seconds: float | None = None


def _planned_input(meta: Any, device: torch.device, has_backward: bool) -> torch.Tensor:
    """A planned input of a non-first stage from its metadata (the script's `input_args`, or the previous stage's
    outputs): it requires grad as PyTorch's received activation does, when the metadata does and the step trains."""
    requires_grad = bool(meta.requires_grad) and has_backward and torch.is_grad_enabled()
    return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device=device,
                               requires_grad=requires_grad)


def _outputs_meta(output: Any, stage_index: int) -> list[dict[str, Any]]:
    """What PyTorch's shape exchange sends the next stage: each output tensor's shape, strides, dtype and whether it
    requires grad."""
    from torch.distributed.tensor import DTensor

    metas = []
    for tensor in flat_tensors(output):
        if isinstance(tensor, DTensor):
            raise NotImplementedError(
                f"plan mode: pipeline stage {stage_index} sends a DTensor to the next stage, whose input shapes "
                "were not given; give them with PipelineStage(..., input_args=...)")
        metas.append({"shape": list(tensor.shape), "stride": list(tensor.stride()),
                      "dtype": str(tensor.dtype).removeprefix("torch."), "requires_grad": tensor.requires_grad})
    return metas


def _stage_inputs(stage: Any, has_backward: bool, previous: Any, ranks: list[int]) -> tuple[torch.Tensor, ...]:
    """The inputs of a non-first stage: from the shapes the script gave (`PipelineStage(input_args=...)`), else, as
    PyTorch's shape exchange gives them, the previous stage's outputs: planned just before when that stage is on
    this rank, else received from the planned rank of that stage (`exchanging_stage_outputs`)."""
    metas = stage._user_meta.inputs
    if metas is None and previous is not None:
        metas = [SimpleNamespace(shape=t.shape, stride=t.stride(), dtype=t.dtype, requires_grad=t.requires_grad)
                 for t in flat_tensors(previous)]
    elif metas is None:
        if not _exchange:
            raise RuntimeError(
                f"plan mode: pipeline stage {stage.stage_index} was built without input_args; its input shapes "
                "come from the previous stage's rank, which only neuron-plan plans alongside (the Python API plans "
                "one rank). Pass PipelineStage(..., input_args=(torch.empty(shape, dtype=..., device='meta'),)) "
                "(meta tensors are enough) or plan with neuron-plan")
        received = _exchange[-1][1](stage.stage_index - 1, ranks[stage.stage_index - 1])
        metas = [SimpleNamespace(**{**meta, "dtype": getattr(torch, meta["dtype"])}) for meta in received]
    return tuple(_planned_input(meta, stage.device, has_backward) for meta in metas)


Op = tuple[str, str, int, int]  # ("run" | "send" | "wait", "F" | "B", stage, micro-batch)


def _single_programs(kind: str, stages: int, micro: int) -> list[list[Op]]:
    """Each rank's program under a single-stage schedule, as its `_step_microbatches` runs it (its
    `pipeline_order` is a drawing: 1F1B's skips micro-batch 0 on the last rank): the compute actions ("run"), where
    it issues each output's transfer to the neighbouring stage ("send") and where it waits for one to complete
    ("wait"). GPipe: every forward, each sent at once, the sends waited; then the same for the backwards. 1F1B:
    `min(micro, stages - stage)` forwards, each send waited after the next forward, the last one sent with the first
    backward's receive and waited with it; then a backward and a forward in turn, each send waited with the next
    receive; then the rest of the backwards, each send waited after the next backward (the last one not at all)."""
    programs = []
    for stage in range(stages):
        ops: list[Op] = []

        def run(k: str, m: int, ops: list[Op] = ops, stage: int = stage) -> None:
            ops.append(("run", k, stage, m))

        def send(k: str, m: int, ops: list[Op] = ops, stage: int = stage) -> None:
            ops.append(("send", k, stage, m))

        def wait(k: str, m: int, ops: list[Op] = ops, stage: int = stage) -> None:
            ops.append(("wait", k, stage, m))

        if kind == "ScheduleGPipe":
            for k in ("F", "B"):
                for m in range(micro):
                    run(k, m)
                    send(k, m)
                for m in range(micro):
                    wait(k, m)
            programs.append(ops)
            continue
        warmup = min(micro, stages - stage)
        for m in range(warmup):
            run("F", m)
            if m > 0:  # the previous forward's send
                wait("F", m - 1)
            if m != warmup - 1:
                send("F", m)
        forward, backward = warmup, 0
        deferred: int | None = warmup - 1
        while True:
            if deferred is not None:  # the forward's send, issued and waited with the backward's receive
                send("F", deferred)
                wait("F", deferred)
            run("B", backward)
            backward += 1
            if forward == micro:
                break
            send("B", backward - 1)  # issued and waited with the next forward's receive
            wait("B", backward - 1)
            run("F", forward)
            deferred, forward = forward, forward + 1
        send("B", backward - 1)
        for m in range(backward, micro):
            run("B", m)
            wait("B", m - 1)
            send("B", m)
        programs.append(ops)
    return programs


def _programs(schedule: Any) -> list[list[Op]]:
    """The schedule's program per pipeline rank (see `_single_programs`). A multi-stage schedule's runtime
    (`_PipelineScheduleRuntime`) runs its compute actions in `pipeline_order`, issues each output's transfer after
    its action and waits for every transfer at the end of the step."""
    from torch.distributed.pipelining import schedules

    name = type(schedule).__name__
    if isinstance(schedule, schedules.PipelineScheduleSingle):
        if name not in ("ScheduleGPipe", "Schedule1F1B"):
            raise NotImplementedError(f"plan mode: pipeline schedule {name} is not planned (GPipe, 1F1B and the "
                                      "multi-stage schedules of forward and full-backward actions are)")
        return _single_programs(name, schedule._num_stages, schedule._n_microbatches)
    programs: list[list[Op]] = []
    for _, actions in sorted(schedule.pipeline_order.items()):
        ops: list[Op] = []
        for action in actions:
            if action is None:
                continue
            kind = action.computation_type.value
            if kind in _COMPUTE:
                ops += [("run", kind, action.stage_index, action.microbatch_index),
                        ("send", kind, action.stage_index, action.microbatch_index)]
            elif kind not in _IGNORED:
                raise NotImplementedError(
                    f"plan mode: pipeline schedule {name} uses action {kind!r} (split backward, zero-bubble "
                    "schedules); only forward (F) and full backward (B) actions are planned")
        programs.append(ops + [("wait", *op[1:]) for op in ops if op[0] == "send"])
    return programs


def _stage_ranks(schedule: Any, stages: list[Any]) -> list[int]:
    """Global rank of every stage (by stage index), from the schedule's stage-to-rank mapping."""
    group = stages[0].group
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    mapping = getattr(schedule, "stage_index_to_group_rank", None) or {i: i for i in range(stages[0].num_stages)}
    return [ranks[mapping[s]] for s in range(stages[0].num_stages)]


_announce: list[Callable[[list[int]], None]] = []  # told each stage's rank as soon as a schedule steps
# asked, when a schedule steps, whether a plan of this rank's role exists (`identifying_roles`)
_identify: list[Callable[[str, dict[str, Any]], bool]] = []
# (send, receive): a stage's output metadata to the next stage's planned rank, and back (`exchanging_stage_outputs`)
_exchange: list[tuple[Callable[[int, list[dict[str, Any]]], None], Callable[[int, int], list[dict[str, Any]]]]] = []


@contextlib.contextmanager
def announcing_stage_ranks(callback: Callable[[list[int]], None]) -> Iterator[None]:
    """Call `callback(stage_ranks)` when a schedule's planned step starts, before it runs its micro-batch: neuron-plan
    starts planning the other stages' ranks then, instead of after this rank's whole plan."""
    _announce.append(callback)
    try:
        yield
    finally:
        _announce.remove(callback)


class RoleReused(Exception):
    """Raised out of a planned rank's first schedule step when a plan of its role exists: the rank stops there."""

    def __init__(self, key: str, probe: dict[str, Any]) -> None:
        super().__init__(key)
        self.key, self.probe = key, probe


@contextlib.contextmanager
def identifying_roles(decide: Callable[[str, dict[str, Any]], bool]) -> Iterator[None]:
    """At a schedule's planned step, before its micro-batch runs, call `decide(key, probe)` with the rank's role key
    (`_role_key`: what the rank runs from here) and what the step's layout needs of this rank (its stages, pipeline
    rank, micro-batches, action lists); when it answers True the step raises `RoleReused`. A rank whose role cannot
    be told before it runs (a later stage whose input shapes come from another rank) is not asked."""
    _identify.append(decide)
    try:
        yield
    finally:
        _identify.remove(decide)


def _specs(tensors: Any) -> list[Any]:
    return [[list(t.shape), list(t.stride()), str(t.dtype), t.requires_grad] for t in flat_tensors(tensors)]


def _structure(module: torch.nn.Module) -> list[Any]:
    """What a stage's module runs, without its modules' names: each module (depth-first, as `named_modules` walks
    it) by its position under its parent, its class, its `extra_repr`, its own parameters (name, shape, dtype,
    requires grad, placements of a DTensor) and buffers, its hooks (their functions' qualified names). The names are
    left out because they hold the layers' numbers (torchtitan keeps a stage's layers under their numbers in the whole
    model): two stages of equal structure run the same thing whatever their layers are called."""
    position: dict[torch.nn.Module, tuple[int, ...]] = {module: ()}
    out = []
    for _, sub in module.named_modules():  # a module before its children
        for i, child in enumerate(sub.children()):
            position.setdefault(child, (*position[sub], i))
        hooks = [[kind, [getattr(h, "__qualname__", type(h).__qualname__) for h in getattr(sub, kind, {}).values()]]
                 for kind in ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")]
        out.append([position[sub], f"{type(sub).__module__}.{type(sub).__qualname__}", sub.extra_repr(),
                    [[n, list(p.shape), str(p.dtype), p.requires_grad, repr(getattr(p, "placements", None))]
                     for n, p in sub.named_parameters(recurse=False)],
                    [[n, list(b.shape), str(b.dtype)] for n, b in sub.named_buffers(recurse=False)],
                    [hook for hook in hooks if hook[1]]])
    return out


def _module_names(stage: Any) -> list[str]:
    """The names the planned rank's module tracker gives a stage's modules (in `named_modules` order): what a plan's
    HBM figures name (`RankPlan.oom`), to tell a shared role's plan in this rank's names (`plan_ranks.Roles`)."""
    tracker = active_planner().modules
    tracker._get_mod_name(stage.submod)  # names the module and its children, as its first forward would
    return [tracker._known_modules[sub] for _, sub in stage.submod.named_modules()]


def _role_key(schedule: Any, stages: list[Any], args_split: Any, kwargs_split: Any, target: Any,
              ranks: list[int]) -> str | None:
    """What this rank runs from its first schedule step on, as a hash: its stages (their modules' structure without
    their names (`_structure`), inputs, first or last), the schedule's kind and loss, the target's shape, every
    process group it is in (size and placement, which price its collectives), the world, the machine, and the rank's
    state so far (simulated clock, FLOPs, HBM, whether it went past the HBM). Not the stage's index, its layers'
    names nor the number of micro-batches: a stage's per-micro-batch costs depend on none of them. Nor where its
    stages' neighbours are: the plan runs no transfer, it prices each stage's send to the next stage
    (`StageCost.send_seconds`, from its bytes and the pair's placement), which a rank that takes the role's plan
    prices for its own pair (`send_seconds`). A stage whose input shapes come from another rank waits for them here
    (its first micro-batch would wait for them too). None when they cannot come (no neuron-plan)."""
    import hashlib
    import json

    from torch.distributed import distributed_c10d

    planner = active_planner()
    rank, index = dist.get_rank(), planner.index
    described = []
    for stage in stages:
        if stage.is_first:
            inputs = [_specs(args_split[0]), {k: _specs(v) for k, v in sorted(kwargs_split[0].items())}]
        elif stage._user_meta.inputs is not None:
            inputs = [[list(m.shape), list(m.stride), str(m.dtype), m.requires_grad] for m in stage._user_meta.inputs]
        elif any(s.stage_index == stage.stage_index - 1 for s in stages):
            inputs = "the previous stage's outputs, on this rank"
        elif _exchange:
            inputs = [[m["shape"], m["stride"], str(getattr(torch, m["dtype"])), m["requires_grad"]]
                      for m in _exchange[-1][1](stage.stage_index - 1, ranks[stage.stage_index - 1])]
        else:
            return None
        described.append({"first": stage.is_first, "last": stage.is_last, "module": _structure(stage.submod),
                          "inputs": inputs})
    groups = sorted([len(members), costs.placement_of_ranks(list(members)),
                     costs.ranks_on_each_instance(list(members))]
                    for members in distributed_c10d._world.pg_group_ranks.values() if rank in members)
    key = {
        "stages": described, "schedule": type(schedule).__name__, "backward": schedule._has_backward,
        "loss": getattr(schedule._loss_fn, "__qualname__", repr(schedule._loss_fn)),
        "target": _specs(target) if target is not None else None, "groups": groups,
        "world": dist.get_world_size(), "machine": repr(services.topology()), "steps": planner.steps,
        "state": [planner.clock(), float(planner.flops), torch.neuron.memory_allocated(index),
                  torch.neuron.max_memory_allocated(index), torch.neuron.memory_reserved(index),
                  torch.neuron.max_memory_reserved(index), len(planner.boundaries), planner.oom is not None],
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


@contextlib.contextmanager
def exchanging_stage_outputs(send: Callable[[int, list[dict[str, Any]]], None],
                             receive: Callable[[int, int], list[dict[str, Any]]]) -> Iterator[None]:
    """PyTorch's shape exchange between planned ranks: a stage built without `input_args` finds its input shapes
    at the first step from the previous stage's rank. In a plan, `send(stage_index, metas)` publishes a stage's
    outputs (shape, strides, dtype, requires_grad) after its planned forward, and `receive(stage_index, rank)` waits
    for those of `stage_index` from the rank planning it (neuron-plan: files in its scratch folder)."""
    _exchange.append((send, receive))
    try:
        yield
    finally:
        _exchange.remove((send, receive))


def _planned_step(schedule: Any, *args: Any, **kwargs: Any) -> Any:
    """`schedule.step(...)` in plan mode: two micro-batches through this rank's stages (see the module's doc).

    Cyclic garbage is collected first and the collector held off meanwhile: a stage's activation bytes are the
    allocator's live bytes across its forward, and a collection landing inside one (when it lands depends on how many
    objects the script made before, e.g. on the micro-batch count) would free unrelated tensors there."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _plan_one_micro_batch(schedule, *args, **kwargs)
    finally:
        if was_enabled:
            gc.enable()


def _plan_one_micro_batch(schedule: Any, *args: Any, target: Any = None, losses: list | None = None,
                          return_outputs: bool = True, loss_kwargs: dict | None = None, **kwargs: Any) -> Any:
    from torch.distributed.pipelining.microbatch import _split_tensor
    from torch.distributed.pipelining.schedules import _TARGET_CHUNK_SPEC

    planner = active_planner()
    stages = sorted(getattr(schedule, "_stages", None) or [schedule._stage], key=lambda s: s.stage_index)
    micro = schedule._n_microbatches
    args_split, kwargs_split = schedule._split_inputs(args, kwargs)
    targets = list(_split_tensor(target, _TARGET_CHUNK_SPEC, micro)) if target is not None else None
    ranks = _stage_ranks(schedule, stages)
    for callback in _announce:
        callback(ranks)
    if _identify:
        key = _role_key(schedule, stages, args_split, kwargs_split, targets[0] if targets is not None else None,
                        ranks)
        probe = {"stage_indices": [s.stage_index for s in stages], "pipeline_rank": stages[0].group_rank,
                 "num_stages": stages[0].num_stages, "n_microbatches": micro, "stage_ranks": ranks,
                 "programs": _programs(schedule), "modules": [_module_names(s) for s in stages], "oom": planner.oom}
        if key is not None and _identify[-1](key, probe):
            raise RoleReused(key, probe)
    # the step's first micro-batch (its backward creates the gradients), then one that accumulates into them
    start = planner.clock()
    first, _, _ = _micro_batch(schedule, stages, ranks, 0, args_split, kwargs_split, targets, loss_kwargs)
    second_start, flops = planner.clock(), planner.flops
    steady, loss, output = _micro_batch(schedule, stages, ranks, min(1, micro - 1), args_split, kwargs_split, targets,
                                        loss_kwargs)
    end = planner.clock()
    for cost, planned_first in zip(steady, first, strict=True):
        cost.first_backward_seconds = planned_first.backward_seconds
    compute, communication, exposed = planner.split(second_start, end)
    planner.pipeline = {
        "schedule": type(schedule).__name__, "n_microbatches": micro, "num_stages": stages[0].num_stages,
        "pipeline_rank": stages[0].group_rank,
        "stages": [dataclasses.asdict(c) for c in sorted(steady, key=lambda c: c.stage_index)],
        "stage_ranks": ranks, "programs": _programs(schedule),
        "window_start": start, "planned_seconds": end - start, "window_seconds": end - second_start,
        "window_compute_seconds": compute, "window_communication_seconds": communication,
        "window_exposed_communication_seconds": exposed, "window_flops": float(planner.flops - flops),
        "window_breakdown": planner.breakdown(second_start, end),
    }
    if schedule._has_backward:  # once a step, after the last micro-batch's backward, as the schedules end a step:
        for stage in stages:  # FSDP's post-backward (reduce-scatter, reshard), the gradients scaled
            stage.perform_reduce_grad(micro if schedule.scale_grads else 1)
    if losses is not None and loss is not None:
        losses.extend([loss.detach()] * micro)
    if return_outputs and stages[-1].is_last:
        return schedule._merge_outputs([output] * micro)
    return None


def _micro_batch(schedule: Any, stages: list[Any], ranks: list[int], mb: int, args_split: list, kwargs_split: list,
                 targets: list | None, loss_kwargs: dict | None) -> tuple[list[StageCost], Any, Any]:
    """Micro-batch `mb` through this rank's stages, forward then backward; return each stage's cost (last stage
    first), the loss and the last stage's output."""
    planner = active_planner()
    index = planner.index
    kept, loss, output = [], None, None
    previous: dict[int, Any] = {}  # this rank's stages' outputs, by stage index
    for stage in stages:
        before_clock, before_bytes, before_sizes = planner.clock(), torch.neuron.memory_allocated(index), _sizes(planner)
        inputs = args_split[mb] if stage.is_first else _stage_inputs(
            stage, schedule._has_backward, previous.get(stage.stage_index - 1), ranks)
        output = stage.submod(*inputs, **(kwargs_split[mb] if stage.is_first else {}))
        previous[stage.stage_index] = output
        if not stage.is_last and _exchange and mb == 0:
            _exchange[-1][0](stage.stage_index, _outputs_meta(output, stage.stage_index))
        if stage.is_last and schedule._loss_fn is not None:
            loss = schedule._compute_loss(output, targets[mb] if targets is not None else None, loss_kwargs)
        own = {t.untyped_storage()._cdata for t in flat_tensors((inputs, output, loss if stage.is_last else None))}
        grown = {key: (ref, size - before_sizes.get(key, (None, 0))[1]) for key, (ref, size) in _sizes(planner).items()
                 if size > before_sizes.get(key, (None, 0))[1] and ref()._cdata not in own}
        kept.append([stage, output, planner.clock() - before_clock,
                     torch.neuron.memory_allocated(index) - before_bytes, grown, before_sizes])
    costs_by_stage = []
    for stage, out, forward, activation, grown, before_sizes in reversed(kept):
        before_clock = planner.clock()
        if schedule._has_backward:
            _backward_without_sync(stage)
            if stage.is_last and loss is not None:
                loss.backward()
            else:
                outs = [t for t in flat_tensors(out) if t.requires_grad]
                torch.autograd.backward(outs, [torch.empty_like(t) for t in outs])
            activation -= _still_grown(grown, before_sizes)
        sent = 0 if stage.is_last else sum(t.numel() * t.element_size() for t in flat_tensors(out))
        backward = planner.clock() - before_clock
        costs_by_stage.append(StageCost(stage.stage_index, forward, backward, max(0, activation), sent,
                                        send_seconds(stage.stage_index, ranks, sent), backward))
    return costs_by_stage, loss, output


def send_seconds(stage_index: int, ranks: list[int], nbytes: int) -> float:
    """A stage's output (`nbytes`) sent to the next stage's rank (`ranks`: every stage's), priced for the two ranks'
    placement; nothing after the last stage. A planned stage's `StageCost.send_seconds`, and what a rank that takes
    another rank's plan of its role prices for its own pair (`plan_ranks`)."""
    return costs.transfer_seconds(nbytes, (ranks[stage_index], ranks[min(stage_index + 1, len(ranks) - 1)]))


def outputs_bytes(metas: list[dict[str, Any]]) -> int:
    """The bytes of a stage's outputs described as the shape exchange describes them (`_outputs_meta`)."""
    return sum(math.prod(meta["shape"]) * getattr(torch, meta["dtype"]).itemsize for meta in metas)


@contextlib.contextmanager
def patched_schedules() -> Iterator[None]:
    """Every pipelining schedule's `step` planned (single-stage and multi-stage schedules)."""
    from torch.distributed.pipelining import schedules

    olds = [(cls, cls.step) for cls in (schedules.PipelineScheduleSingle, schedules.PipelineScheduleMulti)]
    for cls, _ in olds:
        cls.step = _planned_step
    try:
        yield
    finally:
        for cls, old in olds:
            cls.step = old


def _sizes(planner: Any) -> dict[int, tuple[Any, int]]:
    """The planner's live storages (key: (weak reference, bytes now)): FSDP2 frees and refills a storage by resizing
    it, so a storage's bytes, not its being alive, say what it holds."""
    return {key: (ref, storage.nbytes()) for key, (ref, *_) in list(planner.live.items())
            if (storage := ref()) is not None}


def _still_grown(grown: dict[int, tuple[Any, int]], before: dict[int, tuple[Any, int]]) -> int:
    """Bytes of what a stage's forward allocated (or grew) that its backward left in place, beyond the micro-batch's
    own inputs, outputs and loss: not the micro-batch's to keep until its backward, but the stage's, kept once
    whatever the micro-batches in flight (FSDP's unsharded parameters, which stay so until the schedule's last
    backward: torchtitan's reshard_after_forward=False under PP)."""
    total = 0
    for key, (ref, growth) in grown.items():
        storage = ref()
        if storage is not None:
            total += max(0, min(growth, storage.nbytes() - before.get(key, (None, 0))[1]))
    return total


def _is_fsdp(stage: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(stage.submod, FSDPModule)


def _backward_without_sync(stage: Any) -> None:
    """A micro-batch's backward as the schedule runs every one (`backward_maybe_with_nosync`): an FSDP stage keeps its
    parameters unsharded and its gradients unreduced; the schedule reduces and reshards once, after the last
    micro-batch (`perform_reduce_grad`, run after the planned window: charged once a step)."""
    if _is_fsdp(stage):
        stage.submod.set_is_last_backward(False)
        stage.submod.set_reshard_after_backward(False)
        stage.submod.set_requires_gradient_sync(False)


Timed = tuple[int, str, int, int, float, float]  # pipeline rank, F or B, stage, micro-batch, start, end


@dataclasses.dataclass
class Layout:
    """A schedule laid out: per pipeline rank its finish (its compute stream's clock at the end of its program)
    and its peak of activation bytes in flight (forwards whose backward has not run); the timed compute actions
    and the timed transfers (rank: the sender's)."""

    finish: list[float]
    peaks: list[int]
    timed: list[Timed]
    transfers: list[Timed]


def lay_out(programs: list[list[Op]], stages: dict[int, StageCost]) -> Layout:
    """Time each pipeline rank's program (`_single_programs`, `_programs`) from per-stage costs, as a real run's
    point-to-point transfers go (`p2p`): an action starts when its rank is free and its input is there (the
    previous stage's forward, or the next stage's backward, of the same micro-batch: when that stage is on another
    rank, once its transfer completed); a transfer starts when its sender issues it, after the sender's earlier
    transfers, and takes the stage's `send_seconds` (a gradient: the size of the activation it answers); a wait
    holds the rank until its transfer completed. Stages on one rank hand their outputs over for free."""
    last = max(stages)
    rank_of = {op[2]: rank for rank, ops in enumerate(programs) for op in ops if op[0] == "run"}
    done: dict[tuple[str, int, int], float] = {}
    arrived: dict[tuple[str, int, int], float] = {}  # transfers' completion, by the output they carry
    backed: set[int] = set()  # stages whose first backward of the step ran
    clock = [0.0] * len(programs)
    sending = [0.0] * len(programs)  # each rank's transfer stream: when its last transfer completes
    position = [0] * len(programs)
    timed: list[Timed] = []
    transfers: list[Timed] = []

    def crosses(kind: str, stage: int) -> bool:
        """Whether the output of `kind` on `stage` goes to a stage on another rank."""
        to = stage + 1 if kind == "F" else stage - 1
        return 0 <= to <= last and rank_of.get(to, rank_of[stage]) != rank_of[stage]

    def input_ready(kind: str, stage: int, micro: int) -> float | None:
        """When the input of an action is there (None: not yet known)."""
        if kind == "F" and stage == 0:
            return 0.0
        source = ("F", stage - 1, micro) if kind == "F" else ("B", stage + 1, micro) if stage < last else (
            "F", stage, micro)
        return (arrived if crosses(*source[:2]) else done).get(source)

    remaining = sum(len(ops) for ops in programs)
    while remaining:
        progressed = False
        for rank, ops in enumerate(programs):
            while position[rank] < len(ops):
                op, kind, stage, micro = ops[position[rank]]
                key = (kind, stage, micro)
                if op == "run":
                    ready = input_ready(kind, stage, micro)
                    if ready is None:
                        break
                    begin = max(clock[rank], ready)
                    cost = stages[stage].forward_seconds if kind == "F" else stages[stage].backward_seconds
                    if kind == "B" and stage not in backed and stages[stage].first_backward_seconds is not None:
                        cost = stages[stage].first_backward_seconds
                    if kind == "B":
                        backed.add(stage)
                    done[key] = clock[rank] = begin + cost
                    timed.append((rank, kind, stage, micro, begin, begin + cost))
                elif op == "send" and crosses(kind, stage):
                    begin = max(clock[rank], sending[rank])
                    seconds = stages[stage if kind == "F" else stage - 1].send_seconds
                    arrived[key] = sending[rank] = begin + seconds
                    transfers.append((rank, kind, stage, micro, begin, begin + seconds))
                elif op == "wait" and key in arrived:
                    clock[rank] = max(clock[rank], arrived[key])
                position[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {r: programs[r][position[r]] for r in range(len(programs)) if position[r] < len(programs[r])}
            raise RuntimeError(f"pipeline schedule deadlocks: next actions per rank {stuck}")
    peaks = []
    for ops in programs:
        live = peak = 0
        for op, kind, stage, _ in ops:
            if op == "run":
                live += stages[stage].activation_bytes if kind == "F" else -stages[stage].activation_bytes
                peak = max(peak, live)
        peaks.append(peak)
    return Layout(clock, peaks, timed, transfers)


def combine(plans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each planned pipeline rank's step with the schedule laid out from every stage's planned costs: the one
    micro-batch it ran through its stages is replaced by its pipeline rank's actions of the whole schedule, and its
    HBM peak grows by the activations of the micro-batches the schedule keeps in flight beyond the one planned.
    Plans without a pipeline pass as they are."""
    piped = [p for p in plans if p.get("pipeline")]
    if not piped:
        return plans
    stages = {c["stage_index"]: StageCost(**c) for p in piped for c in p["pipeline"]["stages"]}
    first = piped[0]["pipeline"]
    missing = sorted(set(range(first["num_stages"])) - set(stages))
    if missing:
        ranks = sorted({first["stage_ranks"][s] for s in missing})
        raise RuntimeError(f"pipeline stages {missing} were not planned; plan their ranks too: {ranks}")
    layout = lay_out([[tuple(op) for op in ops] for ops in first["programs"]], stages)
    return [_combined(plan, stages, layout) if plan.get("pipeline") else plan for plan in plans]


def _pipeline_breakdown(planned: dict[str, float], pipe: dict[str, Any], finish: float) -> dict[str, float]:
    """The step's breakdown with the schedule laid out: the planned first micro-batch's parts once, the planned
    second's once per later micro-batch, and the rest of the pipeline rank's schedule (its finish minus its
    micro-batches' work) as the bubble."""
    more = pipe["n_microbatches"] - 2  # micro-batches beyond the two planned
    out = dict(planned)
    for part, seconds in pipe["window_breakdown"].items():
        out[part] = out.get(part, 0.0) + more * seconds
    out["pipeline_bubble"] = finish - pipe["planned_seconds"] - more * pipe["window_seconds"]
    return out


def _combined(plan: dict[str, Any], stages: dict[int, StageCost], layout: Layout) -> dict[str, Any]:
    pipe = plan["pipeline"]
    rank, more = pipe["pipeline_rank"], pipe["n_microbatches"] - 2  # micro-batches beyond the two planned
    finish, peaks = layout.finish, layout.peaks
    mine = [c["stage_index"] for c in pipe["stages"]]
    mine_timed = [t for t in layout.timed if t[0] == rank]
    busy = sum(end - begin for *_, begin, end in mine_timed)
    extra = max(0, peaks[rank] - sum(stages[s].activation_bytes for s in mine))
    sends = sum(end - begin for sender, *_, begin, end in layout.transfers if sender == rank)
    peak = plan["peak_hbm_bytes"] + extra
    out = {
        **plan, "step_seconds": plan["step_seconds"] - pipe["planned_seconds"] + finish[rank],
        "compute_seconds": plan["compute_seconds"] + more * pipe["window_compute_seconds"],
        "communication_seconds": plan["communication_seconds"] + more * pipe["window_communication_seconds"] + sends,
        "exposed_communication_seconds": plan["exposed_communication_seconds"]
        + more * pipe["window_exposed_communication_seconds"],
        "flops_per_step": plan["flops_per_step"] + more * pipe["window_flops"],
        "breakdown": _pipeline_breakdown(plan["breakdown"], pipe, finish[rank]),
        "peak_hbm_bytes": peak, "peak_allocated_bytes": plan["peak_allocated_bytes"] + extra,
        "fits": plan["fits"] and peak <= plan["hbm_capacity_bytes"],
        "pipeline": {**pipe, "finish_seconds": finish[rank], "busy_seconds": busy,
                     "bubble_fraction": 1 - busy / max(finish), "activation_peak_bytes": peaks[rank]},
    }
    out["pipeline"].pop("programs")
    # the trace: the whole schedule on a lane of its own where the planned micro-batch ran, what came after later
    start, delay = pipe["window_start"], finish[rank] - pipe["planned_seconds"]
    out["schedule_lanes"] = [(f"{kind} stage {stage} micro-batch {micro}", start + begin, start + end)
                             for _, kind, stage, micro, begin, end in mine_timed]
    after = start + pipe["planned_seconds"]
    out["lanes"] = [(name, stream, a + delay, b + delay) if a >= after else (name, stream, a, b)
                    for name, stream, a, b in plan["lanes"]]
    if out["oom"] is None and not out["fits"]:
        out["oom"] = {"op": f"activations of the micro-batches {pipe['schedule']} keeps in flight",
                      "module": f"pipeline stages {mine}", "reserved_bytes": peak,
                      "largest_live_tensors_by_module": []}
    return out
