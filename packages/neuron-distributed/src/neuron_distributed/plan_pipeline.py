"""Pipeline parallelism in plan mode: one micro-batch through a rank's stages, then the schedule from the costs.

A `torch.distributed.pipelining` schedule's `step` would run every micro-batch through the stage, exchanging
activations with the neighbouring stages' ranks. A planned rank has no neighbours and each micro-batch costs the
same, so plan mode runs one micro-batch's forward and backward through each of the rank's stages (charged as a real
run charges them, on this rank's timeline) and keeps, per stage: forward seconds, backward seconds, the bytes its
forward keeps alive until the backward, and the bytes it sends to the next stage. Plan mode then lays out the step
from those costs and the schedule itself (`schedule.pipeline_order`, PyTorch's list of actions of every pipeline
rank, the one a real run executes): an action starts when its rank is free and its input has arrived (the previous
stage's forward, or the next stage's backward, plus the point-to-point transfer when the stages are on different
ranks); the bubble comes out of the dependencies. The cost of planning is one micro-batch per stage, whatever the
number of micro-batches or the world size.

What is PyTorch's: the schedules, their action lists and stage-to-rank mapping, the input splitting. Ours: running
one micro-batch instead of all, and timing the action lists (`lay_out`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from neuron_device.services import flat_tensors

from . import costs
from .plan_state import active_planner

__all__ = ["StageCost", "announcing_stage_ranks", "combine", "exchanging_stage_outputs", "lay_out", "patched_schedules"]

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


def _single_order(kind: str, stages: int, micro: int) -> list[list[tuple[str, int, int]]]:
    """Each rank's actions of a single-stage schedule, as its `_step_microbatches` runs them (its
    `pipeline_order` is a drawing: 1F1B's skips micro-batch 0 on the last rank). GPipe: every forward, then every
    backward. 1F1B: `min(micro, stages - stage)` forwards, then a backward and a forward in turn, then the rest of
    the backwards."""
    order = []
    for stage in range(stages):
        if kind == "ScheduleGPipe":
            order.append([("F", stage, m) for m in range(micro)] + [("B", stage, m) for m in range(micro)])
            continue
        warmup = min(micro, stages - stage)
        actions = [("F", stage, m) for m in range(warmup)]
        for m in range(micro - warmup):
            actions += [("B", stage, m), ("F", stage, warmup + m)]
        actions += [("B", stage, m) for m in range(micro - warmup, micro)]
        order.append(actions)
    return order


def _order(schedule: Any) -> list[list[tuple[str, int, int]]]:
    """The schedule's compute actions per pipeline rank: (F or B, stage, micro-batch)."""
    from torch.distributed.pipelining import schedules

    name = type(schedule).__name__
    if isinstance(schedule, schedules.PipelineScheduleSingle):
        if name not in ("ScheduleGPipe", "Schedule1F1B"):
            raise NotImplementedError(f"plan mode: pipeline schedule {name} is not planned (GPipe, 1F1B and the "
                                      "multi-stage schedules of forward and full-backward actions are)")
        return _single_order(name, schedule._num_stages, schedule._n_microbatches)
    order: list[list[tuple[str, int, int]]] = []
    for _, actions in sorted(schedule.pipeline_order.items()):
        kept = []
        for action in actions:
            if action is None:
                continue
            kind = action.computation_type.value
            if kind in _COMPUTE:
                kept.append((kind, action.stage_index, action.microbatch_index))
            elif kind not in _IGNORED:
                raise NotImplementedError(
                    f"plan mode: pipeline schedule {name} uses action {kind!r} (split backward, zero-bubble "
                    "schedules); only forward (F) and full backward (B) actions are planned")
        order.append(kept)
    return order


def _stage_ranks(schedule: Any, stages: list[Any]) -> list[int]:
    """Global rank of every stage (by stage index), from the schedule's stage-to-rank mapping."""
    group = stages[0].group
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    mapping = getattr(schedule, "stage_index_to_group_rank", None) or {i: i for i in range(stages[0].num_stages)}
    return [ranks[mapping[s]] for s in range(stages[0].num_stages)]


_announce: list[Callable[[list[int]], None]] = []  # told each stage's rank as soon as a schedule steps
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
    """`schedule.step(...)` in plan mode: one micro-batch through this rank's stages (see the module's doc).

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
    target_mb = next(iter(_split_tensor(target, _TARGET_CHUNK_SPEC, micro))) if target is not None else None
    index = planner.index
    start, flops = planner.clock(), planner.flops
    kept, loss, output = [], None, None
    ranks = _stage_ranks(schedule, stages)
    for callback in _announce:
        callback(ranks)
    previous: dict[int, Any] = {}  # this rank's stages' outputs, by stage index
    for stage in stages:
        before_clock, before_bytes, before_sizes = planner.clock(), torch.neuron.memory_allocated(index), _sizes(planner)
        inputs = args_split[0] if stage.is_first else _stage_inputs(
            stage, schedule._has_backward, previous.get(stage.stage_index - 1), ranks)
        output = stage.submod(*inputs, **(kwargs_split[0] if stage.is_first else {}))
        previous[stage.stage_index] = output
        if not stage.is_last and _exchange:
            _exchange[-1][0](stage.stage_index, _outputs_meta(output, stage.stage_index))
        if stage.is_last and schedule._loss_fn is not None:
            loss = schedule._compute_loss(output, target_mb, loss_kwargs)
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
        pair = (ranks[stage.stage_index], ranks[min(stage.stage_index + 1, len(ranks) - 1)])
        costs_by_stage.append(StageCost(stage.stage_index, forward, planner.clock() - before_clock,
                                        max(0, activation), sent, _transfer_seconds(sent, pair)))
    end = planner.clock()
    compute, communication, exposed = planner.split(start, end)
    planner.pipeline = {
        "schedule": type(schedule).__name__, "n_microbatches": micro, "num_stages": stages[0].num_stages,
        "pipeline_rank": stages[0].group_rank,
        "stages": [dataclasses.asdict(c) for c in sorted(costs_by_stage, key=lambda c: c.stage_index)],
        "stage_ranks": ranks, "order": _order(schedule),
        "window_start": start, "window_seconds": end - start, "window_compute_seconds": compute,
        "window_communication_seconds": communication, "window_exposed_communication_seconds": exposed,
        "window_flops": float(planner.flops - flops), "window_breakdown": planner.breakdown(start, end),
    }
    if schedule._has_backward:  # once a step, after the last micro-batch's backward, as the schedule runs it
        for stage in stages:
            if _is_fsdp(stage):
                stage.perform_reduce_grad(1)
    if losses is not None and loss is not None:
        losses.extend([loss.detach()] * micro)
    if return_outputs and stages[-1].is_last:
        return schedule._merge_outputs([output] * micro)
    return None


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


def _transfer_seconds(nbytes: int, ranks: tuple[int, int]) -> float:
    """One point-to-point transfer of `nbytes` between two global ranks (the cost model's send, by placement)."""
    if ranks[0] == ranks[1]:
        return 0.0
    return costs.collective_seconds("send", nbytes, 2, where=costs.placement_of_ranks(ranks))


Timed = tuple[int, str, int, int, float, float]  # pipeline rank, F or B, stage, micro-batch, start, end


def lay_out(order: list[list[tuple[str, int, int]]],
            stages: dict[int, StageCost]) -> tuple[list[float], list[int], list[Timed]]:
    """Time a schedule's action lists from per-stage costs: each pipeline rank runs its actions in order; an action
    waits for its input (previous stage's forward / next stage's backward of the same micro-batch, plus the transfer
    when the two stages are on different ranks). Returns each pipeline rank's finish time, its peak of activation
    bytes in flight (forwards whose backward has not run), and the timed actions."""
    last = max(stages)
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * len(order)
    position = [0] * len(order)
    timed: list[Timed] = []
    remaining = sum(len(actions) for actions in order)
    while remaining:
        progressed = False
        for rank, actions in enumerate(order):
            while position[rank] < len(actions):
                kind, stage, micro = actions[position[rank]]
                if kind == "F":
                    need, peer = (("F", stage - 1, micro), stage - 1) if stage > 0 else (None, stage)
                elif stage < last:
                    need, peer = ("B", stage + 1, micro), stage + 1
                else:
                    need, peer = ("F", stage, micro), stage
                if need is not None and need not in done:
                    break
                ready = 0.0 if need is None else done[need]
                if peer != stage:  # the activation (or its gradient) crosses between the two stages
                    ready += stages[min(stage, peer)].send_seconds
                begin = max(free[rank], ready)
                cost = stages[stage].forward_seconds if kind == "F" else stages[stage].backward_seconds
                done[(kind, stage, micro)] = free[rank] = begin + cost
                timed.append((rank, kind, stage, micro, begin, begin + cost))
                position[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {r: order[r][position[r]] for r in range(len(order)) if position[r] < len(order[r])}
            raise RuntimeError(f"pipeline schedule deadlocks: next actions per rank {stuck}")
    peaks = []
    for actions in order:
        live = peak = 0
        for kind, stage, _ in actions:
            live += stages[stage].activation_bytes if kind == "F" else -stages[stage].activation_bytes
            peak = max(peak, live)
        peaks.append(peak)
    return free, peaks, timed


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
    order = [[tuple(a) for a in actions] for actions in first["order"]]
    finish, peaks, timed = lay_out(order, stages)
    return [_combined(plan, stages, finish, peaks, timed) if plan.get("pipeline") else plan for plan in plans]


def _pipeline_breakdown(planned: dict[str, float], pipe: dict[str, Any], finish: float) -> dict[str, float]:
    """The step's breakdown with the schedule laid out: the planned micro-batch's parts once per micro-batch, and
    the rest of the pipeline rank's schedule (its finish minus its micro-batches' work) as the bubble."""
    micro, window = pipe["n_microbatches"], pipe["window_seconds"]
    out = dict(planned)
    for part, seconds in pipe["window_breakdown"].items():
        out[part] = out.get(part, 0.0) + (micro - 1) * seconds
    out["pipeline_bubble"] = finish - micro * window
    return out


def _combined(plan: dict[str, Any], stages: dict[int, StageCost], finish: list[float], peaks: list[int],
              timed: list[Timed]) -> dict[str, Any]:
    pipe = plan["pipeline"]
    rank, micro = pipe["pipeline_rank"], pipe["n_microbatches"]
    mine = [c["stage_index"] for c in pipe["stages"]]
    mine_timed = [t for t in timed if t[0] == rank]
    busy = sum(end - begin for *_, begin, end in mine_timed)
    extra = max(0, peaks[rank] - sum(stages[s].activation_bytes for s in mine))
    sends = sum(2 * stages[s].send_seconds for s in mine)  # activation forward, its gradient back
    peak = plan["peak_hbm_bytes"] + extra
    out = {
        **plan, "step_seconds": plan["step_seconds"] - pipe["window_seconds"] + finish[rank],
        "compute_seconds": plan["compute_seconds"] + (micro - 1) * pipe["window_compute_seconds"],
        "communication_seconds": plan["communication_seconds"] + (micro - 1) * pipe["window_communication_seconds"]
        + micro * sends,
        "exposed_communication_seconds": plan["exposed_communication_seconds"]
        + (micro - 1) * pipe["window_exposed_communication_seconds"],
        "flops_per_step": plan["flops_per_step"] + (micro - 1) * pipe["window_flops"],
        "breakdown": _pipeline_breakdown(plan["breakdown"], pipe, finish[rank]),
        "peak_hbm_bytes": peak, "peak_allocated_bytes": plan["peak_allocated_bytes"] + extra,
        "fits": plan["fits"] and peak <= plan["hbm_capacity_bytes"],
        "pipeline": {**pipe, "finish_seconds": finish[rank], "busy_seconds": busy,
                     "bubble_fraction": 1 - busy / max(finish), "activation_peak_bytes": peaks[rank]},
    }
    out["pipeline"].pop("order")
    # the trace: the whole schedule on a lane of its own where the planned micro-batch ran, what came after later
    start, delay = pipe["window_start"], finish[rank] - pipe["window_seconds"]
    out["schedule_lanes"] = [(f"{kind} stage {stage} micro-batch {micro}", start + begin, start + end)
                             for _, kind, stage, micro, begin, end in mine_timed]
    after = start + pipe["window_seconds"]
    out["lanes"] = [(name, stream, a + delay, b + delay) if a >= after else (name, stream, a, b)
                    for name, stream, a, b in plan["lanes"]]
    if out["oom"] is None and not out["fits"]:
        out["oom"] = {"op": f"activations of the micro-batches {pipe['schedule']} keeps in flight",
                      "module": f"pipeline stages {mine}", "reserved_bytes": peak,
                      "largest_live_tensors_by_module": []}
    return out
