"""Plan mode: run an unmodified training or inference script as one rank of a full-size cluster, with no host memory.

What is PyTorch's and what is ours:

* `neuron` (and CPU) tensors are PyTorch's `FakeTensorMode` fakes: shape, dtype, strides, device, no data; ops
  run their meta kernels. FLOPs are counted with PyTorch's `FlopCounterMode` formulas (`flop_registry`), by our
  charger (no `FlopCounterMode` mode or module hooks: its `ModuleTracker` keeps checkpointed layers' tensors alive,
  pytorch/pytorch#139214, and its mode would stop Dynamo compiling); the module an op runs in comes from
  `torch.distributed._tools.mod_tracker.ModTracker`.
* `torch.compile(backend="neuron")`: Dynamo and neuron-compile compile each graph from the planned fakes as in a
  real run, and the compiled graph charges its kernel plan (forward, and backward when autograd runs it) and takes
  its workspace and results from the allocator model, as a real run's does.
* The process group is PyTorch's `FakeProcessGroup` behind backend `neuron` (and a `FakeStore`, so no rendezvous):
  collectives return at once with correctly shaped fakes.
* Ours: every op is charged as the real run's kernel charges it (`services.account_planned_op`: the same op
  catalogue, cost model, streams and allocator model), and every collective through `costs.charge`, the function
  the real process group uses. Plan mode changes what is stored, not what is charged.

The step is found without changing the script: an optimizer step (`register_optimizer_step_post_hook`; an optimizer
stepped inside another's step, as `ZeroRedundancyOptimizer` steps its local one, is part of it) closes it;
a script without an optimizer is planned whole. HBM: the allocator model runs with no capacity limit so a plan that
does not fit still completes; the first allocation that takes the reserved bytes past the core's HBM is recorded
with its op, its module and the largest live tensors by module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sys
import traceback
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from neuron_device import services

from . import costs, envvars
from .kernels import OPS as C10D_OPS
from .kernels import charge_c10d, group_ranks
from .plan_pipeline import patched_schedules

__all__ = ["PlanValueError", "RankPlan", "active_planner", "is_planning", "launcher_environment", "plan",
           "plan_rank"]

_aten = torch.ops.aten
# Functional collectives (DTensor, FSDP2, async TP): op name -> the cost model's collective kind.
_FUNCTIONAL = {
    "all_reduce": "allreduce", "all_reduce_": "allreduce", "all_reduce_coalesced": "allreduce_coalesced",
    "all_gather_into_tensor": "all_gather_single", "all_gather_into_tensor_out": "all_gather_single",
    "all_gather_into_tensor_coalesced": "allgather_into_tensor_coalesced",
    "reduce_scatter_tensor": "reduce_scatter_single", "reduce_scatter_tensor_coalesced":
    "reduce_scatter_tensor_coalesced", "all_to_all_single": "alltoall_base", "broadcast": "broadcast",
    "broadcast_": "broadcast",
}
# Ops that read a tensor's values into Python: a fake tensor has none.
_VALUE_READS = frozenset({_aten._local_scalar_dense.default, _aten.is_nonzero.default, _aten.equal.default,
                          _aten.allclose.default})
_HERE = (os.path.dirname(os.path.dirname(torch.__file__)), os.path.dirname(__file__),
         os.path.dirname(services.__file__))

_active: _Planner | None = None
_FakeTensor = torch._subclasses.fake_tensor.FakeTensor


def is_planning() -> bool:
    """True inside plan mode: a script can skip a block that needs tensor values (`if not is_planning(): ...`)."""
    return _active is not None


def active_planner() -> _Planner:
    """The planned rank's state (inside plan mode only)."""
    if _active is None:
        raise RuntimeError("plan mode is not active")
    return _active


class PlanValueError(RuntimeError):
    """A script read a tensor's value in plan mode, where tensors have shapes but no values."""


def _user_frame() -> traceback.FrameSummary | None:
    """The innermost frame of the planned script (not torch, not this package)."""
    for frame in reversed(traceback.extract_stack()):
        if not frame.filename.startswith(_HERE) and "site-packages" not in frame.filename and \
                not frame.filename.startswith("<"):
            return frame
    return None


def _value_read(what: str) -> PlanValueError:
    frame = _user_frame()
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


class _StopPlan(BaseException):
    """Raised at the last planned optimizer step: the rest of the script is not needed."""


def _known(args: tuple) -> bool:
    """Every tensor argument is a fake whose value the fake mode tracks (a CPU scalar built from Python numbers,
    such as an optimizer's step count): reading it is exact."""
    return all(getattr(t, "constant", None) is not None for t in args if isinstance(t, torch.Tensor))


def _traced(result: Any, mode: Any) -> bool:
    """The op ran on a compiler's fakes (Dynamo tracing a graph inside a DDP forward, where it leaves the plan's
    modes on), not on the script's: it is compile time, which no device time or FLOP is charged for."""
    first = result[0] if isinstance(result, (tuple, list)) and result else result
    return isinstance(first, _FakeTensor) and first.fake_mode is not mode


class _Charger(TorchDispatchMode):
    """Charges each op on fake tensors as the real kernel would, and every collective as the process group would."""

    def __init__(self, planner: _Planner) -> None:
        super().__init__()
        self.planner = planner

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
            raise _value_read(f"{func.__name__} of a tensor")
        try:
            result = func(*args, **kwargs)
        except torch._subclasses.fake_tensor.DynamicOutputShapeException as error:
            raise _value_read(f"{func}, whose output shape depends on the values") from error
        if _traced(result, self.planner.fake_mode):
            return result
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.planner.flops += formula(*args, **kwargs, out_val=result)
        namespace = func.namespace
        if namespace == "c10d" and func._opname in C10D_OPS:
            charge_c10d(C10D_OPS[func._opname], args)
        elif namespace == "_c10d_functional" and func._opname in _FUNCTIONAL:
            group = dist.distributed_c10d._resolve_process_group(args[-1])
            tensors = [t for t in args if isinstance(t, torch.Tensor)] or list(args[0])
            outputs = [result] if isinstance(result, torch.Tensor) else list(result)
            costs.charge(_FUNCTIONAL[func._opname], tensors, outputs, group.size(), group_ranks(group))
        else:
            self.planner.allocated(func, services.account_planned_op(func, args, kwargs, result))
        return result


def _planned_allreduce(group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's built-in gradient all-reduce (divide by the group size, all-reduce the bucket), as a comm hook: the fake
    process group's work completes with no value, and the reducer reads the reduced bucket from its future."""
    group = group or dist.group.WORLD
    tensor = bucket.buffer()
    tensor.div_(group.size())
    dist.all_reduce(tensor, group=group)
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(tensor)
    return future


# DDP checks a hook's annotations as objects (not the strings postponed evaluation makes).
_planned_allreduce.__annotations__ = {"group": Any, "bucket": dist.GradBucket,
                                      "return": torch.futures.Future[torch.Tensor]}


class _KeptBuckets:
    """DDP's reducer, except that it keeps its first buckets: rebuilding them agrees on the new order across ranks
    by reading a CPU tensor's data, which a fake does not have (one planned rank has no peers to agree with)."""

    def __init__(self, reducer: Any) -> None:
        self._reducer = reducer

    def _rebuild_buckets(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)


def _ddp_init(init: Callable) -> Callable:
    def planned(self, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.register_comm_hook(self.process_group, _planned_allreduce)
        self.reducer = _KeptBuckets(self.reducer)

    return planned


def _fake_neuron_group(store: Any, rank: int, size: int, timeout: Any) -> Any:
    """Backend `neuron` in plan mode: PyTorch's fake process group (no communication, no peers)."""
    from torch._C._distributed_c10d import FakeProcessGroup

    return FakeProcessGroup._create_internal(rank, size)


class _Planner:
    """The state of one planned rank: step boundaries, the charges seen, live storages by module."""

    def __init__(self, rank: int, world_size: int, steps: int | None) -> None:
        self.rank, self.world_size, self.steps = rank, world_size, steps
        self.index = torch.neuron.current_device()
        self.capacity = services.topology().hbm_bytes_per_device
        torch.neuron.reset_peak_memory_stats(self.index)  # the plan's peak, not what this process did before
        self.boundaries: list[float] = [self.clock()]
        self.flops_at: list[float] = [0.0]
        self.charges: list[tuple[str, int, float, float]] = []
        self.live: dict[int, tuple[weakref.ref, int, str, str]] = {}
        self.oom: dict[str, Any] | None = None
        self.pipeline: dict[str, Any] | None = None
        self.optimizer_depth = 0
        self.modules: Any = None
        self.flops = 0  # FLOPs of every op so far, by `FlopCounterMode`'s formulas
        self.fake_mode: Any = None

    def record(self, name: str, index: int, stream: int, start: float, end: float) -> None:
        if index == self.index:
            self.charges.append((name, stream, start, end))

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
            self.oom = {"op": str(op), "module": module, "reserved_bytes": torch.neuron.memory_reserved(self.index),
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
            raise _StopPlan

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
            lanes=self.window(start, end))

    def window(self, start: float, end: float) -> list[tuple[str, int, float, float]]:
        """The charges between two clock readings, clipped to them."""
        return [(n, s, max(a, start), min(b, end)) for n, s, a, b in self.charges if b > start and a < end]

    def split(self, start: float, end: float) -> tuple[float, float, float]:
        """Compute, communication and exposed communication seconds between two clock readings."""
        window = self.window(start, end)
        comm = [(a, b) for n, _, a, b in window if n.startswith("c10d::")]
        compute = [(a, b) for n, _, a, b in window if not n.startswith("c10d::")]
        return (sum(b - a for a, b in compute), sum(b - a for a, b in comm),
                _uncovered(_union(comm), _union(compute)))


def _swap_fakes(swap: Callable) -> Callable:
    """`Module.to` swaps a fake parameter for its moved fake, which torch refuses while the fake tensor converter
    holds a weak reference to it (its memo): drop the memo entries of the two fakes first."""

    def swap_tensors(t1, t2):
        from torch._subclasses.fake_tensor import FakeTensor

        for tensor in (t1, t2):
            if isinstance(tensor, FakeTensor):
                memo = tensor.fake_mode.fake_tensor_converter.tensor_memo
                for key in [k for k, v in list(memo.items()) if v is tensor]:
                    del memo[key]
        return swap(t1, t2)

    return swap_tensors


def _outside_plan(fn: Callable) -> Callable:
    """`fn` with plan mode's tensor modes off: a DeviceMesh is laid out by a real CPU tensor of rank numbers, which
    it reads (its layout, not the job's data)."""
    from torch.utils._python_dispatch import _disable_current_modes

    def call(*args: Any, **kwargs: Any) -> Any:
        with _disable_current_modes():
            return fn(*args, **kwargs)

    return call


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _compile(compile_: Callable) -> Callable:
    """`torch.compile` in plan mode: backend "neuron" only (the one whose graphs the cost model prices), and each
    call of the compiled callable runs without the planner's module tracker. Its hooks are global module hooks,
    which a real run does not have: Dynamo would trace them into the graph (and fail on their weak dictionaries),
    so the graph would differ from the real run's."""

    def planned(model: Any = None, *, backend: Any = "inductor", **kwargs: Any) -> Any:
        if backend != "neuron":
            raise NotImplementedError(
                f"plan mode: torch.compile(backend={backend!r}) is not planned; only backend=\"neuron\" is (its graphs "
                "are priced by neuron-compile's kernel plan). Compile with backend=\"neuron\" or leave the script eager.")
        if model is None:  # the decorator form: @torch.compile(backend="neuron")
            return lambda fn: planned(fn, backend=backend, **kwargs)
        compiled = compile_(model, backend=_compiled_outside_plan(torch._dynamo.lookup_backend(backend)), **kwargs)
        if isinstance(compiled, torch.nn.Module):  # OptimizedModule: its forward enters the compiled frame
            compiled.forward = _untracked(compiled.forward)
            return compiled
        return functools.wraps(model)(_untracked(compiled))

    return planned


@functools.cache
def _compiled_outside_plan(backend: Callable) -> Callable:
    """The backend run with the plan's tensor modes off, as Dynamo runs backends. (Dynamo's DDPOptimizer path, taken
    for a graph traced inside a DDP forward, leaves them on, and AOTAutograd then fails on its functional tensors.)
    One callable per backend: Dynamo guards each compiled frame on its backend, so a new wrapper per
    `torch.compile` call made each block compiled per layer a recompile of the shared `forward` ("BACKEND_MATCH
    failure"), and blocks after the recompile limit ran eagerly."""

    @functools.wraps(backend)  # the backend's name in Dynamo's messages; neuron-compile finds it through this
    def compile_graph(gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Callable:
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():
            return backend(gm, example_inputs, **kwargs)

    return compile_graph


def _untracked(fn: Callable) -> Callable:
    """`fn` run with the planner's module tracker off (its allocations count to the module that called it)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        tracker = active_planner().modules
        tracker.__exit__(None, None, None)
        try:
            return fn(*args, **kwargs)
        finally:
            tracker.__enter__()

    return call


def _init_process_group(init: Callable) -> Callable:
    """`init_process_group` in plan mode: no rendezvous (a `FakeStore`), the launcher's rank and world size."""

    def planned(backend: Any = None, init_method: Any = None, *args: Any, **kwargs: Any) -> Any:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        kwargs.setdefault("store", FakeStore())
        kwargs.setdefault("rank", envvars.RANK.read())
        kwargs.setdefault("world_size", envvars.WORLD_SIZE.read())
        return init(backend, *args, **kwargs)

    return planned


def plan_rank(run: Callable[[], Any], *, rank: int, world_size: int, steps: int | None = None) -> RankPlan:
    """Run `run` (a script's body) as rank `rank` of `world_size` in plan mode; return what that rank did.

    The launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK, ...) must already be set, and the simulated machine
    (NEURON_SIM_INSTANCE_TYPE) chosen before neuron-device was imported.
    """
    global _active
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mod_tracker import ModTracker

    if _active is not None:
        raise RuntimeError("plan mode is already active in this process; plans do not nest")
    # initialised, as a real run's first device op does: fake factories then resolve "neuron" to the current device
    torch.neuron.init()
    planner = _Planner(rank, world_size, steps)
    allocator = services.device_allocator(planner.index)
    plugin = dist.Backend._plugins["NEURON"]
    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(allocator, "capacity", 1 << 62))  # over-capacity is recorded, not raised
        stack.enter_context(_patched(torch.utils, "swap_tensors", _swap_fakes(torch.utils.swap_tensors)))
        stack.enter_context(_patched(torch, "compile", _compile(torch.compile)))
        stack.enter_context(_patched(dist, "init_process_group", _init_process_group(dist.init_process_group)))
        # DDP checks parameter shapes across ranks by reading a CPU tensor's data: one planned rank has no peers
        # to disagree with, and the fake holds no data.
        stack.enter_context(_patched(dist, "_verify_params_across_processes", lambda *args: None))
        from torch.distributed import device_mesh

        stack.enter_context(_patched(device_mesh, "init_device_mesh", _outside_plan(device_mesh.init_device_mesh)))
        for method in ("__getitem__", "get_local_rank", "get_coordinate", "_flatten"):
            mesh_class = device_mesh.DeviceMesh
            stack.enter_context(_patched(mesh_class, method, _outside_plan(getattr(mesh_class, method))))
        ddp = torch.nn.parallel.DistributedDataParallel
        stack.enter_context(_patched(ddp, "__init__", _ddp_init(ddp.__init__)))
        stack.enter_context(patched_schedules())
        dist.Backend._plugins["NEURON"] = plugin._replace(creator_fn=_fake_neuron_group)
        stack.callback(dist.Backend._plugins.__setitem__, "NEURON", plugin)
        previous = services.set_charge_recorder(planner.record)
        stack.callback(services.set_charge_recorder, previous)
        for handle in (register_optimizer_step_pre_hook(planner.optimizer_stepping),
                       register_optimizer_step_post_hook(planner.optimizer_stepped)):
            stack.callback(handle.remove)
        _active = planner
        stack.callback(globals().__setitem__, "_active", None)
        planner.fake_mode = stack.enter_context(FakeTensorMode(allow_non_fake_inputs=False))
        planner.modules = stack.enter_context(ModTracker())
        stack.enter_context(_Charger(planner))
        try:
            run()
        except _StopPlan:
            pass
        except SystemExit as exit_:
            if exit_.code not in (None, 0):
                raise
        result = planner.result()
        if dist.is_initialized():
            dist.destroy_process_group()
    sys.stdout.flush()
    return result


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
