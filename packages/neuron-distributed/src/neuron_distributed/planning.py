"""Plan mode: run an unmodified training or inference script as one rank of a full-size cluster, with no host memory.

What is PyTorch's and what is ours:

* `neuron` (and CPU) tensors are PyTorch's `FakeTensorMode` fakes: shape, dtype, strides, device, no data; ops
  run their meta kernels. The module an op runs in comes from `torch.distributed._tools.mod_tracker.ModTracker`.
* `torch.compile(backend="neuron")`: Dynamo and neuron-compile compile each graph from the planned fakes as in a
  real run, and the compiled graph charges its kernel plan (forward, and backward when autograd runs it) and takes
  its workspace and results from the allocator model, as a real run's does.
* The process group is PyTorch's `FakeProcessGroup` behind backend `neuron` (and a `FakeStore`, so no rendezvous):
  collectives return at once with correctly shaped fakes.
* Ours: every op is charged as the real run's kernel charges it, every collective as the real process group charges
  it, FLOPs counted by PyTorch's formulas. Plan mode changes what is stored, not what is charged.

The planner's parts: `plan_state` (the planned rank, its result), `plan_charger` (the dispatch mode that charges
each op), `plan_hops` (its rules for higher-order ops), `plan_values` (the symbols that answer a script's value
reads), `plan_generate` (transformers' `generate`: its reads answered by rule, its serving figures), `plan_patches`
(what a plan changes in torch), `plan_replay` (a compiled graph's repeated calls replayed), `plan_pipeline`
(pipelining schedules), `plan_report` and `plan_ranks` (neuron-plan's report and its planned processes), `plan_cli`
(the command), `plan_search` and `plan_search_report` (`neuron-plan --search`), `plan_serve` (`neuron-plan
--serve`). This module is the entry: `plan_rank` (a script's body as one rank), `plan` (`torch_neuronx.plan`).
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from neuron_device import services

from . import envvars
from .plan_charger import Charger
from .plan_generate import Serving, generation_patches
from .plan_patches import patched, patched_torch
from .plan_state import Planner, PlanValueError, RankPlan, StopPlan, activated, active_planner, is_planning
from .plan_values import AssumedValues, PlannedValues

__all__ = ["PlanValueError", "RankPlan", "active_planner", "is_planning", "launcher_environment", "plan",
           "plan_rank"]


def plan_rank(run: Callable[[], Any], *, rank: int, world_size: int, steps: int | None = None) -> RankPlan:
    """Run `run` (a script's body) as rank `rank` of `world_size` in plan mode; return what that rank did.

    The launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK, ...) must already be set, and the simulated machine
    (NEURON_SIM_INSTANCE_TYPE) chosen before neuron-device was imported.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mod_tracker import ModTracker

    if is_planning():
        raise RuntimeError("plan mode is already active in this process; plans do not nest")
    # initialised, as a real run's first device op does: fake factories then resolve "neuron" to the current device
    torch.neuron.init()
    planner = Planner(rank, world_size, steps)
    planner.values = PlannedValues()
    planner.assumed = AssumedValues()
    allocator = services.device_allocator(planner.index)
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(allocator, "overcommit", True))  # what does not fit is recorded, not raised
        stack.enter_context(patched(allocator, "segment_tracker", planner.segment_reserved))
        stack.enter_context(_collector_thresholds(*_PLAN_GC_THRESHOLDS))
        stack.enter_context(patched_torch())
        serving = Serving(planner.index)
        for owner, name, value in generation_patches(serving, rules=True):
            stack.enter_context(patched(owner, name, value))
        previous = services.set_charge_recorder(planner.record)
        stack.callback(services.set_charge_recorder, previous)
        for handle in (register_optimizer_step_pre_hook(planner.optimizer_stepping),
                       register_optimizer_step_post_hook(planner.optimizer_stepped)):
            stack.callback(handle.remove)
        stack.enter_context(activated(planner))
        planner.fake_mode = stack.enter_context(FakeTensorMode(allow_non_fake_inputs=False))
        # A fake tensor keeps its mode in its __dict__, which Tensor.__deepcopy__ deep-copies: a copied model (torchtitan
        # copies its meta model once per pipeline stage) would hold fakes of a mode of its own ('Mixing fake modes').
        # The mode is the plan's context, not the tensor's state: a copy shares it.
        planner.fake_mode.__deepcopy__ = lambda memo: planner.fake_mode
        planner.modules = stack.enter_context(ModTracker())
        stack.enter_context(Charger(planner))
        stack.callback(_destroy_process_group)  # also after a refusal: the next plan in this process starts afresh
        try:
            run()
        except StopPlan:
            pass
        except SystemExit as exit_:
            if exit_.code not in (None, 0):
                raise
        planner.serving = serving.figures()
        result = planner.result()
    sys.stdout.flush()
    return result


# The cyclic garbage collector's thresholds while a rank is planned (CPython's default: 700, 10, 10). A plan makes
# millions of short-lived objects (Dynamo's and AOTAutograd's traces, a fake tensor and its metadata for every op)
# over a heap that grows with the model (an 80-layer DTensor model's modules, parameters and graphs): at the default
# the collector ran 1,900 times in an 8-layer 70B decode plan, its 5 full collections alone 1.6 s, and 8.9 s in the
# 80-layer plan, freeing few objects. Collections are rarer here: 2.1 -> 1.0 s at 8 layers, the same plan.
_PLAN_GC_THRESHOLDS = (10_000, 10, 10)


@contextlib.contextmanager
def _collector_thresholds(*thresholds: int) -> Iterator[None]:
    """`gc.set_threshold(*thresholds)` for a block (then restored)."""
    previous = gc.get_threshold()
    gc.set_threshold(*thresholds)
    try:
        yield
    finally:
        gc.set_threshold(*previous)


def _destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def plan(fn: Callable[[], Any], *, world_size: int | None = None, rank: int = 0, steps: int | None = None) -> RankPlan:
    """Plan `fn` (e.g. a training loop) as rank `rank` of a job of `world_size` ranks (default: every NeuronCore of
    this process's simulated machine, `NEURON_SIM_INSTANCE_TYPE`), with the launcher's environment it would see.
    `steps` stops after that many optimizer steps. `torch_neuronx.plan` is this function."""
    per_node = services.topology().device_count
    world_size = per_node if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of {world_size} ranks")
    with launcher_environment(rank, world_size, per_node), torch.neuron.device(rank % per_node):
        return plan_rank(fn, rank=rank, world_size=world_size, steps=steps)


@contextlib.contextmanager
def launcher_environment(rank: int, world_size: int, per_node: int) -> Iterator[None]:
    """torchrun's environment for `rank` of `world_size` ranks, `per_node` a node, for a block (then restored)."""
    values = {envvars.RANK: rank, envvars.WORLD_SIZE: world_size, services.LOCAL_RANK: rank % per_node,
              envvars.LOCAL_WORLD_SIZE: min(per_node, world_size), envvars.MASTER_ADDR: "127.0.0.1",
              envvars.MASTER_PORT: "29500"}
    with contextlib.ExitStack() as stack:
        for variable, value in values.items():
            stack.enter_context(variable.overridden(str(value)))
        yield
