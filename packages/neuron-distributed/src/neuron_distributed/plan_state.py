"""Plan mode's state: the planned rank (`Planner`: step boundaries, the charges seen, live storages by module), its
result (`RankPlan`), and whether a plan is running (`is_planning`).

The planned step is found without changing the script: an optimizer step (an optimizer stepped inside another's
step, as `ZeroRedundancyOptimizer` steps its local one, is part of it) closes it; a script without an optimizer is
planned whole. HBM: the allocator model overcommits (`DeviceAllocator.overcommit`) so a plan that does not fit still
completes: an allocation is granted past the core's HBM only once the real allocator would have failed too (after
releasing its cache and retrying), and the first such allocation is recorded with its op, its module, the line that
made it (for a compiled graph's output, its node's source line) and the largest live tensors by module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import itertools
import os
import traceback
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from neuron_device import services
from neuron_device.services import ChargePart

from . import costs

__all__ = ["INTERNALS", "UNANSWERED", "PlanValueError", "Planner", "RankPlan", "StopPlan", "activated", "active_planner",
           "answering", "answering_by", "code_site", "is_planning", "user_frame", "value_read"]

_HERE = (os.path.dirname(os.path.dirname(torch.__file__)), os.path.dirname(__file__),
         os.path.dirname(services.__file__))


def _sibling_wheels() -> tuple[str, ...]:
    """The folders of the sibling wheels that run a script's ops (neuron-compile's compiled graphs, neuron-nki's
    kernels), when installed: found, not imported."""
    found = (importlib.util.find_spec(name) for name in ("neuron_compile", "nki", "neuronxcc"))
    return tuple(folder for spec in found if spec is not None for folder in spec.submodule_search_locations or ())


# torch and the simulator (this package, neuron-device, its siblings): a frame outside them is the code an op was
# called from (`code_site`)
INTERNALS = (os.path.dirname(torch.__file__), os.path.dirname(__file__), os.path.dirname(services.__file__),
             *_sibling_wheels())
_active: Planner | None = None
UNANSWERED = object()  # what a rule of `answering_by` returns for a read it does not answer


def is_planning() -> bool:
    """True inside plan mode: a script can skip a block that needs tensor values (`if not is_planning(): ...`)."""
    return _active is not None


def active_planner() -> Planner:
    """The planned rank's state (inside plan mode only)."""
    if _active is None:
        raise RuntimeError("plan mode is not active")
    return _active


class PlanValueError(RuntimeError):
    """A script read a tensor's value in plan mode, where tensors have shapes but no values."""


_ENTRY = (os.path.join(os.path.dirname(__file__), "planning.py"), "plan_rank")  # the frame a planned script runs in


def _in_plan(frames: list[traceback.FrameSummary]) -> list[traceback.FrameSummary]:
    """The frames above `plan_rank` (what the planned script runs): not the process's own below it (neuron-plan's,
    which the ranks' zygote is forked from, or a caller of `torch_neuronx.plan`)."""
    for i in range(len(frames) - 1, -1, -1):
        if (frames[i].filename, frames[i].name) == _ENTRY:
            return frames[i + 1:]
    return frames


def user_frame(frames: list[traceback.FrameSummary] | None = None) -> traceback.FrameSummary | None:
    """The innermost frame of the planned script (not torch, not this package) in `frames` (default: the stack)."""
    for frame in reversed(_in_plan(traceback.extract_stack() if frames is None else list(frames))):
        if not frame.filename.startswith(_HERE) and "site-packages" not in frame.filename and \
                not frame.filename.startswith("<"):
            return frame
    return None


def code_site(stack_trace: str | None = None) -> str:
    """The innermost line outside torch and the simulator (a library's or the script's) on the stack, or in
    `stack_trace` (an FX node's: the line a compiled graph's op was traced from): `file:line in function ('code')`."""
    if stack_trace is not None:
        frame = torch.fx.graph._parse_stack_trace(
            stack_trace, lambda file, name, code: not file.startswith(INTERNALS) and not file.startswith("<"))
        if frame is not None:
            return f"{frame.file}:{frame.lineno} in {frame.name} ({frame.code!r})"
    for frame in reversed(_in_plan(traceback.extract_stack())):
        if not frame.filename.startswith(INTERNALS) and not frame.filename.startswith("<"):
            return f"{frame.filename}:{frame.lineno} in {frame.name} ({(frame.line or '').strip()!r})"
    return "the script"


@contextlib.contextmanager
def answering(*values: Any) -> Iterator[None]:
    """Value reads of planned tensors in the block get `values` in turn (the last one repeats): only for a read plan
    mode knows cannot change the reported step (see `plan_patches._trunc_normal`)."""
    answers = itertools.chain(values, itertools.repeat(values[-1]))
    with answering_by(lambda: next(answers)):
        yield


@contextlib.contextmanager
def answering_by(rule: Callable[[], Any]) -> Iterator[None]:
    """Value reads of planned tensors in the block are answered by `rule()`, unless it returns `UNANSWERED` (the read
    then goes on as any other: a symbol, a branch on it refused). Only for reads plan mode knows the meaning of."""
    answers = active_planner().answers
    answers.append(rule)
    try:
        yield
    finally:
        answers.pop()


def value_read(what: str) -> PlanValueError:
    """The error for a value read at the planned script's innermost line."""
    frame = user_frame()
    where = f"{frame.filename}:{frame.lineno} ({(frame.line or '').strip()!r})" if frame else "the script"
    return PlanValueError(
        f"plan mode: {where} reads a tensor's value ({what}), but planned tensors have shapes and no values, so no "
        "honest number exists. Skip the block while planning (`if not torch_neuronx.is_planning(): ...`) or give "
        "the value the plan should assume in plain Python.")


@dataclasses.dataclass
class RankPlan:
    """What one planned rank did: its step, time split, FLOPs and HBM."""

    rank: int
    world_size: int
    steps_observed: int
    step_seconds: float
    compute_seconds: float
    communication_seconds: float
    exposed_communication_seconds: float
    flops_per_step: float
    peak_hbm_bytes: int
    peak_allocated_bytes: int
    hbm_capacity_bytes: int
    fits: bool
    oom: dict[str, Any] | None
    # a pipeline-parallel rank's stage costs and schedule (`plan_pipeline`); its step_seconds then covers one
    # micro-batch through its stages, until `plan_pipeline.combine` lays out the schedule with every stage's costs
    pipeline: dict[str, Any] | None
    lanes: list[tuple[str, int, float, float]]  # (name, stream, start, end) of the planned step, for --trace
    # the step's seconds by what they went to (`Planner.breakdown`); they sum to step_seconds
    breakdown: dict[str, float] = dataclasses.field(default_factory=dict)
    # a script that generates (transformers' `generate`): time to first token, per output token, KV cache
    # (`plan_generate.Serving.figures`)
    serving: dict[str, Any] | None = None
    # what the plan assumed where the script's values steer the run (`plan_values`), reported with the figures
    assumptions: list[str] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("lanes")
        return out


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _uncovered(spans: list[tuple[float, float]], cover: list[tuple[float, float]]) -> float:
    """Seconds of `spans` (a union) outside `cover` (a union)."""
    total = 0.0
    for start, end in spans:
        covered = sum(max(0.0, min(end, b) - max(start, a)) for a, b in cover)
        total += end - start - covered
    return total


def _attribute(out: dict[str, float], seconds: float, compute: dict[int, ChargePart], comm: dict[int, str]) -> None:
    """Add `seconds` of a step to `out`: to the compute charges running (equal shares), else to the collectives
    running (exposed), else to idle."""
    running = compute or comm
    if not running:
        out["idle"] = out.get("idle", 0.0) + seconds
        return
    share = seconds / len(running)
    for part in running.values():
        if isinstance(part, str):
            out[part] = out.get(part, 0.0) + share
            continue
        total = sum(part.values())
        for name, amount in part.items():
            out[name] = out.get(name, 0.0) + share * amount / total


class StopPlan(BaseException):
    """Raised at the last planned optimizer step: the rest of the script is not needed."""




class Planner:
    """The state of one planned rank: step boundaries, the charges seen, live storages by module."""

    def __init__(self, rank: int, world_size: int, steps: int | None) -> None:
        self.rank, self.world_size, self.steps = rank, world_size, steps
        self.index = torch.neuron.current_device()
        self.capacity = services.topology().hbm_bytes_per_device
        torch.neuron.reset_peak_memory_stats(self.index)  # the plan's peak, not what this process did before
        self.boundaries: list[float] = [self.clock()]
        self.flops_at: list[float] = [0.0]
        self.charges: list[tuple[str, int, float, float]] = []
        self.parts: list[ChargePart] = []  # each charge's part of the step (`_part`), beside `charges`
        self.live: dict[int, tuple[weakref.ref, int, str, str]] = {}
        self.oom: dict[str, Any] | None = None
        self.pipeline: dict[str, Any] | None = None
        self.optimizer_depth = 0
        self.modules: Any = None
        self.flops = 0  # FLOPs of every op so far, by `FlopCounterMode`'s formulas
        self.fake_mode: Any = None
        self.values: Any = None  # the symbols answering the script's value reads (`plan_values.PlannedValues`)
        self.answers: list[Callable[[], Any]] = []  # the innermost `answering_by` block's rule answers value reads
        self.serving: dict[str, Any] | None = None  # a `generate` call's figures (`plan_generate`), the last one
        self.assumed: Any = None  # the values the plan assumes and computes from them (`plan_values.AssumedValues`)

    def record(self, name: str, index: int, stream: int, start: float, end: float, part: ChargePart = None) -> None:
        if index == self.index:
            self.charges.append((name, stream, start, end))
            self.parts.append(self._part(name, part))

    def _part(self, name: str, part: ChargePart) -> ChargePart:
        """What a charge's time went to, by context first: a collective's kind, the optimizer's step, the recompute
        of activation checkpointing (forward work run inside a backward with gradients enabled, as
        `torch.utils.checkpoint` reruns a block, eager or compiled), else the kernel's own part."""
        if costs.is_collective_charge(name):
            return "collective:" + name.removeprefix(costs.LABEL_PREFIX)
        if self.optimizer_depth > 0:
            return "optimizer"
        if torch._C._current_graph_task_id() != -1 and torch.is_grad_enabled():
            return "recompute"
        return "other" if part is None else part

    def clock(self) -> float:
        return max(services.timeline(self.index).clocks.values())

    def allocated(self, op: Any, storages: list[torch.UntypedStorage]) -> None:
        if not storages:
            return
        module = max(self.modules.parents, key=len) if self.modules is not None else "Global"
        for storage in storages:
            ref = weakref.ref(storage, lambda r: self.live.pop(id(r), None))
            self.live[id(ref)] = (ref, storage.nbytes(), module, str(op))
        if self.oom is None and torch.neuron.memory_reserved(self.index) > self.capacity:
            self._ran_out(str(op), module, code_site(), torch.neuron.memory_reserved(self.index))

    def segment_reserved(self, reserved: int) -> None:
        """The allocator's `segment_tracker`: an allocation made for a compiled graph (`services.allocating_from`: an
        output, adopted after the graph ran; its workspace) that goes past the HBM is where the plan runs out, named
        by the line its node was traced from (else the line that called the graph). An op's allocation is named by
        `allocated`, which knows the op."""
        source = services.allocation_source() if self.oom is None and reserved > self.capacity else None
        if source is not None:
            module = max(self.modules.parents, key=len) if self.modules is not None else "Global"
            self._ran_out(source[0], module, code_site(source[1]), reserved)

    def _ran_out(self, op: str, module: str, code: str, reserved: int) -> None:
        self.oom = {"op": op, "module": module, "code": code, "reserved_bytes": reserved,
                    "largest_live_tensors_by_module": self._largest_live()}

    def _largest_live(self, top: int = 10) -> list[dict[str, Any]]:
        by_module: dict[str, list[int]] = {}
        for _, nbytes, module, _ in self.live.values():
            entry = by_module.setdefault(module, [0, 0])
            entry[0] += nbytes
            entry[1] += 1
        ranked = sorted(by_module.items(), key=lambda item: -item[1][0])[:top]
        return [{"module": m, "bytes": b, "tensors": n} for m, (b, n) in ranked]

    def optimizer_stepping(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.optimizer_depth += 1

    def optimizer_stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.optimizer_depth -= 1
        if self.optimizer_depth > 0:  # an optimizer inside another's step (ZeroRedundancyOptimizer's local AdamW)
            return
        self.boundaries.append(self.clock())
        self.flops_at.append(float(self.flops))
        if self.steps is not None and len(self.boundaries) - 1 >= self.steps:
            raise StopPlan

    def result(self) -> RankPlan:
        steps = len(self.boundaries) - 1
        if steps == 0:  # no optimizer: the whole run is the step
            self.boundaries.append(self.clock())
            self.flops_at.append(float(self.flops))
        start, end = self.boundaries[-2], self.boundaries[-1]
        compute, communication, exposed = self.split(start, end)
        reserved = torch.neuron.max_memory_reserved(self.index)
        return RankPlan(
            rank=self.rank, world_size=self.world_size, steps_observed=steps, step_seconds=end - start,
            compute_seconds=compute, communication_seconds=communication, exposed_communication_seconds=exposed,
            flops_per_step=self.flops_at[-1] - self.flops_at[-2], peak_hbm_bytes=reserved,
            peak_allocated_bytes=torch.neuron.max_memory_allocated(self.index), hbm_capacity_bytes=self.capacity,
            fits=self.oom is None and reserved <= self.capacity, oom=self.oom, pipeline=self.pipeline,
            lanes=self.window(start, end), breakdown=self.breakdown(start, end), serving=self.serving,
            assumptions=self.assumed.reported() if self.assumed is not None else [])

    def window(self, start: float, end: float) -> list[tuple[str, int, float, float]]:
        """The charges between two clock readings, clipped to them."""
        return [(n, s, max(a, start), min(b, end)) for n, s, a, b in self.charges if b > start and a < end]

    def breakdown(self, start: float, end: float) -> dict[str, float]:
        """The seconds between two clock readings by what they went to; they sum to `end - start`. Each instant
        goes to the compute charges running then (shared equally, a charge of several parts split in its
        proportions); with none, to the collectives running then, as exposed collectives by kind
        ("collective:all_reduce"); with neither, to "idle" (the device waits, e.g. for the host)."""
        events = []
        for i, (_, _, a, b) in enumerate(self.charges):
            a, b = max(a, start), min(b, end)
            if b > a:
                events += [(a, 1, i), (b, 0, i)]  # at equal times, ends before starts
        events.sort()
        out: dict[str, float] = {}
        compute: dict[int, ChargePart] = {}
        comm: dict[int, str] = {}
        at = start
        for when, starts, i in events:
            if when > at:
                _attribute(out, when - at, compute, comm)
                at = when
            part = self.parts[i]
            active = comm if isinstance(part, str) and part.startswith("collective:") else compute
            if starts:
                active[i] = part
            else:
                active.pop(i, None)
        if end > at:
            _attribute(out, end - at, compute, comm)
        return out

    def split(self, start: float, end: float) -> tuple[float, float, float]:
        """Compute, communication and exposed communication seconds between two clock readings."""
        window = self.window(start, end)
        comm = [(a, b) for n, _, a, b in window if costs.is_collective_charge(n)]
        compute = [(a, b) for n, _, a, b in window if not costs.is_collective_charge(n)]
        return (sum(b - a for a, b in compute), sum(b - a for a, b in comm),
                _uncovered(_union(comm), _union(compute)))


@contextlib.contextmanager
def activated(planner: Planner) -> Iterator[Planner]:
    """`planner` is the active plan for a block (plans do not nest)."""
    global _active
    if _active is not None:
        raise RuntimeError("plan mode is already active in this process; plans do not nest")
    _active = planner
    try:
        yield planner
    finally:
        _active = None
