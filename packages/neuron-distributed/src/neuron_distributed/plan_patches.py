"""Plan mode's patches of torch: what a planned rank changes in torch for the time of a plan (`patched_torch`), each
with its reason. Nothing here outlives the plan.

* `init_process_group`: no rendezvous (a `FakeStore`), the launcher's rank and world size; backend `neuron` is
  PyTorch's `FakeProcessGroup` (collectives return at once with correctly shaped fakes, no peers).
* DDP: its built-in all-reduce as a comm hook, its first buckets kept, no cross-rank parameter check (each reads
  data a fake does not have).
* DeviceMesh: laid out by real CPU tensors of rank numbers, which it reads; built and used with the plan's modes
  off.
* `torch.compile`: backend "neuron" compiles with the plan's modes off and runs without the planner's module
  tracker; a callable compiled with another backend, in the plan or before it, runs as its eager ops with a warning
  (Dynamo's `_callback_from_stance`: `_EagerInPlan`).
* neuron-compile's `AtenHostCode.run_graph` (a compiled graph's host code): a call on inputs laid out as an earlier
  call's replays it (`plan_replay`): a static-cache decode runs the same graph each token.
* `torch.utils.swap_tensors`: `Module.to` on fakes.
* `torch.neuron.get_rng_state` / `set_rng_state`: a planned (valueless) state, which setting leaves the generator
  as it is (DTensor's RNG tracker gets, moves, shifts and sets it around every random op on a DTensor).
* `nn.init.trunc_normal_` of a planned tensor: its rejection loop's value read answered (`_trunc_normal`).
* `_StridedShard.local_shard_size_and_offset` (FSDP over TP): its layout, computed from a real CPU `arange` that
  it reads, outside the plan's modes.
* DTensor's sharding propagation derives an op's global output shape by running it on fakes of the global
  shapes, in the fake mode it detects, else a fresh one: a real run's fresh one allocates nothing, but the plan's would
  be found and charged (the first step of a DTensor model peaked at the global shapes). It runs outside the plan's
  modes, on a fresh fake mode as in the real run. (Charged, torchtitan's debug model with FSDP 2 planned a peak HBM of
  2.3 times its real run's: its first clip_grad_norm_ and AdamW step charged full-size temporaries.)
* a DataLoader iterator's set-up runs outside the plan's modes: it draws and reads its workers' base seed from a
  host generator, as the real run does.
* Module-level functions are patched in every module that bound them (`patched_everywhere`).
* FakeTensorMode's dispatch cache: a call given a storage (`set_(storage, ...)`) is not cached; its key would keep
  the storage, and its block in the allocator model, for the process's life (`_storage_args_uncached`).
* `UntypedStorage.resize_`: a planned storage's block in the allocator model follows (FSDP2 frees an unsharded
  parameter by resizing its storage to 0 bytes, and refills it; a fake's storage has no device memory to resize).
* pipelining schedules: two micro-batches a stage (`plan_pipeline`).
* `SymInt` / `SymFloat` / `SymBool.__format__`: a value the plan answered with a symbol (`plan_values`) formatted
  with a spec (a log line's `f"{loss:8.5f}"`) prints as its symbol; torch's raises `TypeError`. So does a planned
  0-d tensor's (`Tensor.__format__`: torch formats only a plain `Tensor`'s value).
* `Tensor.__getitem__` / `__setitem__` with an index made from a read value: refused naming the line
  (`PlanValueError`); torch's own error is an `IndexError` about the index's type.
* Triton's kernel launch on planned tensors: a compiled kernel's (`JITFunction.run`) is refused naming the kernel
  (it needs their memory; torch only warns on a fake's data pointer, and the process then crashed); one Triton's
  interpreter runs (`InterpretedFunction.run`, `TRITON_INTERPRET=1`) is charged as the real run's: each tensor
  argument's storage copied to the host and back, the kernel's own work on the host.
* transformers' attention masks (`masking_utils`): a (batch, positions) tensor of the plan is not "tracing"
  (`is_tracing`, which counts every FakeTensor: a planned tensor is one), so a mask is skipped for SDPA's `is_causal`
  where a real run skips it; the checks' reads of the 2-D mask and the positions are answered by `UNPADDED`, stated
  in the report (`_untraced_masks`). (Planned as traced, a forward given an all-ones attention mask, or run without a
  cache, built a (batch, 1, q, kv) mask and called SDPA with it; the real run took `is_causal`.)
* `torch.tensor` of a read value: a planned 0-d tensor (torch's converts the symbol to a number, a branch on it).
  TorchScript still takes the patched function for its builtin `aten::tensor` (`_scripted_as_builtin`): modules
  scripted while the plan runs (`torch.distributed.optim`'s functional optimizers, imported by a script's
  `ZeroRedundancyOptimizer`) call `torch.tensor`, and TorchScript cannot compile a Python wrapper.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from neuron_device import services

from . import envvars, plan_state
from .plan_pipeline import patched_schedules
from .plan_replay import replaying
from .plan_values import planned_format, planned_index, planned_tensor, planned_tensor_format

__all__ = ["UNPADDED", "patched", "patched_everywhere", "patched_torch"]

UNPADDED = ("unpadded batches: a transformers model's 2-D attention mask is all ones and its positions are one "
            "sequence a row, so its attention skips the mask for SDPA's is_causal (masking_utils' checks of them "
            "answered so)")
# transformers' `masking_utils` functions whose reads (after their `is_tracing` check) ask whether the 2-D attention
# mask is all ones or the positions pack several sequences: answered by `UNPADDED`
_MASK_CHECKS = ("_ignore_causal_mask_sdpa", "_ignore_bidirectional_mask_sdpa", "find_packed_sequence_indices",
                "create_recurrent_attention_mask")


def _planned_allreduce(group: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's built-in gradient all-reduce (divide by the group size, all-reduce the bucket), as a comm hook: the fake
    process group's work completes with no value, and the reducer reads the reduced bucket from its future. That
    value is on the host, as the `neuron` group's is (Gloo's work holds the bucket's host alias): the reducer copies
    each gradient back from it, which a real run charges as a copy from the host (a device copy here was 1.3 % of a
    tiny Llama's step over the real run's)."""
    group = group or dist.group.WORLD
    tensor = bucket.buffer()
    tensor.div_(group.size())
    dist.all_reduce(tensor, group=group)
    future: torch.futures.Future = torch.futures.Future()
    # a CPU fake (no memory, no charge; made from no `neuron` tensor, which would charge it as an op on the device)
    future.set_result(torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu"))
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


def _mesh_members(mesh_class: type) -> list[tuple[str, Any]]:
    """Every method and property of `DeviceMesh`, run outside the plan: a mesh keeps its layout in real CPU tensors
    of rank numbers (its rank map), which its methods view, slice, flatten, unflatten and concatenate, and read
    (`tolist`); a fake of the rank map would have no numbers to read, and a real one meets the plan's fake mode."""
    members = []
    for name, member in vars(mesh_class).items():
        if isinstance(member, staticmethod):
            members.append((name, staticmethod(_outside_plan(member.__func__))))
        elif isinstance(member, classmethod):
            members.append((name, classmethod(_outside_plan(member.__func__))))
        elif isinstance(member, property):
            members.append((name, property(*(_outside_plan(f) if f else None
                                              for f in (member.fget, member.fset, member.fdel)))))
        elif callable(member) and not isinstance(member, type):
            members.append((name, _outside_plan(member)))
    return members


@contextlib.contextmanager
def patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    """`obj.name` is `value` for a block."""
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


@contextlib.contextmanager
def _scripted_as_builtin(patch: Callable, original: Callable) -> Iterator[None]:
    """TorchScript compiles a call of `patch` as the builtin op of `original`, for a block."""
    table = torch.jit._builtins._get_builtin_table()
    table[id(patch)] = table[id(original)]
    try:
        yield
    finally:
        del table[id(patch)]


@contextlib.contextmanager
def patched_everywhere(module: Any, name: str, value: Any) -> Iterator[None]:
    """`module.name` is `value` for a block, and so is every module's own binding of the same function (`from
    torch.distributed.device_mesh import init_device_mesh`): a module imported before the plan began (the modules
    `neuron-plan` preloads once for all ranks, such as torchtitan's trainer) would otherwise keep the unpatched one."""
    old = getattr(module, name)
    holders = [holder for holder in list(sys.modules.values())
               if holder is not None and holder is not module and getattr(holder, "__dict__", {}).get(name) is old]
    with contextlib.ExitStack() as stack:
        for holder in (module, *holders):
            stack.enter_context(patched(holder, name, value))
        yield


def _compile(compile_: Callable) -> Callable:
    """`torch.compile` in plan mode. Backend "neuron" (the one whose graphs the cost model prices): each call of the
    compiled callable runs without the planner's module tracker. Its hooks are global module hooks, which a real run
    does not have: Dynamo would trace them into the graph (and fail on their weak dictionaries), so the graph would
    differ from the real run's. Any other backend is created as the script asks; a call of it in the plan runs its
    function's ops (`_eager_in_plan`), as one compiled before the plan does."""

    def planned(model: Any = None, *, backend: Any = "inductor", **kwargs: Any) -> Any:
        if model is None:  # the decorator form: @torch.compile(backend=...)
            return lambda fn: planned(fn, backend=backend, **kwargs)
        if backend != "neuron" and not _runs_eagerly(backend):
            return compile_(model, backend=backend, **kwargs)
        compiled = compile_(model, backend=_compiled_outside_plan(torch._dynamo.lookup_backend(backend)), **kwargs)
        return _wrap_call(compiled, model, _untracked)

    return planned


def _runs_eagerly(backend: Any) -> bool:
    """Dynamo's "eager" backend (by name or as `lookup_backend("eager")`, which torch's higher-order ops compile
    their eager call with: `flex_attention`): it runs the captured graph's ops as they are, so a real run charges
    them as eager ops, and so does the plan."""
    return backend == "eager" or backend is torch._dynamo.lookup_backend("eager")


def _wrap_call(compiled: Any, model: Any, wrap: Callable[[Callable], Callable]) -> Any:
    """`compiled` with its call wrapped by `wrap`: an `OptimizedModule`'s forward (it enters the compiled frame), or
    the compiled function, named as `model`."""
    if isinstance(compiled, torch.nn.Module):
        compiled.forward = wrap(compiled.forward)
        return compiled
    return functools.wraps(model)(wrap(compiled))


def _backend_of(callback: Any) -> tuple[Any, str | None]:
    """The backend a Dynamo frame callback compiles with (the innermost of its `_torchdynamo_orig_backend` chain,
    unwrapped from `torch.compile`'s wrapper) and its name (Dynamo's debug wrapper's: "inductor"), or None for no
    callback (Dynamo off, or run-only)."""
    backend, name = None, None
    while callback is not None and callback is not False:
        name = name or getattr(callback, "__name__", None)
        backend, callback = callback, getattr(callback, "_torchdynamo_orig_backend", None)
    return getattr(backend, "compiler_fn", backend), name


def _planned_by_its_backend(backend: Any) -> bool:
    """The plan compiles with this backend as the real run does: "neuron" (as the plan wraps it, or as given before
    the plan) and "eager"."""
    backend = getattr(backend, "__wrapped__", backend)  # as `_compiled_outside_plan` wraps it
    return backend is None or _runs_eagerly(backend) or backend is _neuron_backend()


def _neuron_backend() -> Any:
    """Dynamo's "neuron" backend, or None where neuron-compile (which registers it) is not installed."""
    try:
        return torch._dynamo.lookup_backend("neuron")
    except torch._dynamo.exc.InvalidBackend:
        return None


class _EagerInPlan:
    """A Dynamo frame callback that runs, inside a plan (its fake mode on), a frame compiled with another backend
    (Inductor, `aot_eager`, ...) as its eager ops, each charged by the plan as a real eager run charges it; outside
    one it is the compiled callback. The function may have been compiled before the plan began, at the import of a
    module `neuron-plan` preloads for all ranks (torchtitan's `torch.compile(create_block_mask)` and its class-level
    `torch.compile(flex_attention)`), and Dynamo compiles on the first call: Inductor's host code then read and wrote
    the planned tensors' memory, which they do not have, and the process died of a segmentation fault. Its graph
    has no Trainium price (a real run of an Inductor graph on `neuron` runs host C++ whose only device charge is its
    outputs' allocation), and pricing the neuron backend's graph would plan a compile the script does not make:
    its ops are what the plan can price. A warning names the function, once."""

    warned: ClassVar[set[Any]] = set()  # the functions warned about

    def __init__(self, callback: Any, backend: str) -> None:
        self.callback, self.backend = callback, backend
        self.called = False  # one object a call of the compiled callable (`_eager_in_plan`): its frame comes first

    def __call__(self, frame: Any, *args: Any, **kwargs: Any) -> Any:
        from torch._C._dynamo.eval_frame import (
            _FrameAction,
            _FrameExecStrategy,
            set_fullgraph_compiled_frame_count,
        )
        from torch._dynamo.types import ConvertFrameReturn

        planner = plan_state.active_planner()
        if planner is None or torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not planner.fake_mode:
            return self.callback(frame, *args, **kwargs)
        # this frame and every frame it calls run as they are (a compiled callable inside sets its own callback)
        eager = ConvertFrameReturn(frame_exec_strategy=_FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP),
                                   apply_to_code=False)
        if self.called:  # a frame the interpreter runs meanwhile, not called by it: a finalizer, a weakref callback
            return eager
        self.called = True
        code = frame.f_code
        if code not in self.warned:
            self.warned.add(code)
            warnings.warn(f"plan mode: {code.co_qualname} ({code.co_filename}:{code.co_firstlineno}), compiled with "
                          f"torch.compile(backend={self.backend!r}), is planned as its eager ops: only "
                          "backend=\"neuron\"'s graphs are priced (neuron-compile's kernel plan), and another "
                          "backend's compiled code cannot run on planned tensors", stacklevel=2)
        # the frame counts as compiled for `fullgraph=True`'s check (Dynamo counts the frames it runs compiled)
        count = set_fullgraph_compiled_frame_count(0)
        set_fullgraph_compiled_frame_count(count + 1 if count >= 0 else count)
        return eager


def _eager_in_plan(callback_from_stance: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Dynamo's `_callback_from_stance` in plan mode (each compiled callable's call installs its frame callback
    through it): a callback compiling with a backend other than the plan's is wrapped in `_EagerInPlan`."""

    def planned(callback: Any) -> Any:
        callback = callback_from_stance(callback)
        if isinstance(callback, _EagerInPlan):
            return callback
        backend, name = _backend_of(callback)
        return callback if _planned_by_its_backend(backend) else _EagerInPlan(callback, name or repr(backend))

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
        tracker = plan_state.active_planner().modules
        tracker.__exit__(None, None, None)
        try:
            return fn(*args, **kwargs)
        finally:
            tracker.__enter__()

    return call


def _planned_get_rng_state(get_rng_state: Callable) -> Callable:
    """`torch.neuron.get_rng_state` in plan mode: a planned (valueless) tensor of the state's shape. Its values
    cannot change the simulated time (the plan's random ops draw no numbers), and DTensor's RNG tracker moves it to
    the device and shifts its offset around every random op on a DTensor (torchtitan's `init_weights`), which a real
    CPU tensor cannot do among the plan's fakes."""

    def planned(*args: Any, **kwargs: Any) -> torch.Tensor:
        return plan_state.active_planner().fake_mode.from_tensor(get_rng_state(*args, **kwargs))

    return planned


def _planned_set_rng_state(set_rng_state: Callable) -> Callable:
    """`torch.neuron.set_rng_state` in plan mode: a planned state (from `_planned_get_rng_state`) leaves the
    generator as it is (it has no values to set); a real state is set."""
    from torch._subclasses.fake_tensor import FakeTensor

    def planned(new_state: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        if not isinstance(new_state, FakeTensor):
            set_rng_state(new_state, *args, **kwargs)

    return planned


def _trunc_normal(fill: Callable) -> Callable:
    """`nn.init`'s truncated normal fill of a planned tensor (or DTensor): its rejection loop's `mask.any()` (any sample out of
    range?) is answered True once, then False. So the loop resamples once, allocating its temporaries as the real run
    does (the same peak); the real run's further passes, whose number depends on the values, each as the first,
    come at initialisation, before the first optimizer step and outside the reported step."""

    def planned(*args: Any, **kwargs: Any) -> torch.Tensor:
        with plan_state.answering(True, False):
            return fill(*args, **kwargs)

    return planned


def _untraced(is_tracing: Callable) -> Callable:
    """transformers' `is_tracing(tensor)` for its masks in a plan: a planned (batch, positions) tensor, a FakeTensor
    of the plan's mode, is not traced; Dynamo, TorchScript and stream capture still are (`is_tracing()`). transformers
    counts every FakeTensor as traced and then materializes the mask, where the real run reads the mask's values and
    skips it. The static cache's query offset (a 0-d tensor: the cache's state, not the batch's) stays traced: the
    mask is built, as the real run builds it past the first chunk (an empty cache's offset is the int 0)."""

    def planned(tensor: Any = None) -> bool:
        if is_tracing():  # first: Dynamo, tracing a compiled forward, takes this branch alone (a constant True)
            return True
        if isinstance(tensor, torch.Tensor) and tensor.dim() == 2 and plan_state.is_planning() and \
                getattr(tensor, "fake_mode", None) is plan_state.active_planner().fake_mode:
            return False
        return is_tracing(tensor)

    return planned


def _unpadded_answer() -> bool:
    planner = plan_state.active_planner()
    if planner.assumed is not None:
        planner.assumed.state(UNPADDED)
    return True


def _unpadded(check: Callable) -> Callable:
    """A `masking_utils` check (`_MASK_CHECKS`) whose reads (is the mask all ones, is there one sequence a row) are
    answered True under `UNPADDED`: the real run's answer for a batch of unpadded sequences."""

    @functools.wraps(check)
    def planned(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():  # Dynamo tracing a compiled forward: no read to answer, nothing to trace
            return check(*args, **kwargs)
        with plan_state.answering_by(_unpadded_answer):
            return check(*args, **kwargs)

    return planned


@contextlib.contextmanager
def _untraced_masks() -> Iterator[None]:
    """transformers' masking utilities patched for a plan (`_untraced`, `_unpadded`); nothing without transformers
    imported (a script that imports it inside the plan keeps transformers' traced masks)."""
    if "transformers" not in sys.modules:
        yield
        return
    from transformers import masking_utils

    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(masking_utils, "is_tracing", _untraced(masking_utils.is_tracing)))
        for name in _MASK_CHECKS:
            if hasattr(masking_utils, name):
                stack.enter_context(patched(masking_utils, name, _unpadded(getattr(masking_utils, name))))
        yield


def _init_process_group(init: Callable) -> Callable:
    """`init_process_group` in plan mode: no rendezvous (a `FakeStore`), the launcher's rank and world size."""

    def planned(backend: Any = None, init_method: Any = None, *args: Any, **kwargs: Any) -> Any:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        kwargs.setdefault("store", FakeStore())
        kwargs.setdefault("rank", envvars.RANK.read())
        kwargs.setdefault("world_size", envvars.WORLD_SIZE.read())
        return init(backend, *args, **kwargs)

    return planned


def _tracked_resize(resize_: Callable) -> Callable:
    def storage_resize_(self: torch.UntypedStorage, size: int) -> torch.UntypedStorage:
        result = resize_(self, size)
        services.resize_planned_storage(self, size)
        return result

    return storage_resize_


def _fake_neuron_group(store: Any, rank: int, size: int, timeout: Any) -> Any:
    """Backend `neuron` in plan mode: PyTorch's fake process group (no communication, no peers)."""
    from torch._C._distributed_c10d import FakeProcessGroup

    return FakeProcessGroup._create_internal(rank, size)


def _planned(leaves: Any) -> list[torch.Tensor]:
    return [leaf for leaf in leaves if isinstance(leaf, torch._subclasses.fake_tensor.FakeTensor)]


def _refused_launch(run: Callable[..., Any]) -> Callable[..., Any]:
    """A compiled Triton kernel's launch (`JITFunction.run`) on planned tensors: refused naming the kernel. It reads
    and writes its tensors through their data pointers, which a planned tensor does not have (torch only warns
    "Accessing the data pointer of FakeTensor", then the process crashed); a real run on `neuron` has no GPU driver
    to launch it either."""

    @functools.wraps(run)
    def launch(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _planned((*args, *kwargs.values())):
            name = getattr(getattr(self, "fn", None), "__name__", None) or repr(self)
            raise plan_state.value_read(
                f"the Triton kernel {name!r}, which reads and writes its tensors through their data pointers: a "
                "planned tensor has no memory, and plan mode charges ATen ops and Triton's interpreter "
                "(TRITON_INTERPRET=1), not compiled Triton kernels")
        return run(self, *args, **kwargs)

    return launch


def _interpreted_launch(run: Callable[..., Any]) -> Callable[..., Any]:
    """A Triton kernel run by Triton's interpreter (`InterpretedFunction.run`, `TRITON_INTERPRET=1`) on planned
    tensors: charged as a real run on `neuron` charges it. The interpreter copies each tensor argument's storage to
    the host (`UntypedStorage.cpu()`), runs the kernel there with NumPy (host time, no device time), and copies every
    storage back (`copy_`); the plan charges the two copies of each storage and does not run the kernel, whose work is
    on the values (torchtitan 0.2.2's MoE token permutation, `generate_permute_indices`: indices computed from the
    tokens per expert). What it writes stays planned (valueless), as every planned tensor is."""

    @functools.wraps(run)
    def launch(self: Any, *args: Any, grid: Any = None, warmup: bool = False, **kwargs: Any) -> Any:
        planned = _planned((*args, *kwargs.values()))
        if not planned:
            return run(self, *args, grid=grid, warmup=warmup, **kwargs)
        storages = {}
        for tensor in planned:  # one copy of each storage, as the interpreter makes
            storages.setdefault(tensor.untyped_storage()._cdata, tensor)
        for tensor in storages.values():
            whole = tensor.detach().as_strided((tensor.untyped_storage().nbytes() // tensor.element_size(),), (1,), 0)
            host = torch.empty(whole.shape, dtype=whole.dtype, device="cpu")  # made from no `neuron` tensor: no charge
            host.copy_(whole)  # `UntypedStorage.cpu()`: a `copy_` to the host, as the real run charges it
            whole.copy_(host)
        return None

    return launch


def _triton_launchers() -> list[tuple[Any, Callable[[Callable], Callable]]]:
    """Triton's kernel classes whose `run` launches a kernel, each with its plan-mode launch, if Triton is installed
    (imported for the patch: a script may import it inside the plan)."""
    if importlib.util.find_spec("triton") is None:
        return []
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    return [(JITFunction, _refused_launch), (InterpretedFunction, _interpreted_launch)]


def _storage_args_uncached(cache_key: Callable) -> Callable:
    """FakeTensorMode's `_cache_key` in plan mode: a call given a storage (`set_(storage, ...)`, as the device runtime
    makes a tensor over a storage it holds) is not cached. Its key would hold the storage itself, kept for the
    process's life in the fake dispatch cache: with the storage, its block in the allocator model, never freed (a
    plan of a checkpointed compiled Llama layer grew by every layer's saved input each micro-batch, 2 GiB a step
    at T2, where a real run holds none of it)."""

    def key(self: Any, state: Any, func: Any, args: Any, kwargs: Any) -> Any:
        if any(isinstance(arg, torch.UntypedStorage) for arg in (*args, *kwargs.values())):
            from torch._subclasses.fake_tensor import _BypassDispatchCache

            raise _BypassDispatchCache("storage argument (plan mode)")
        return cache_key(self, state, func, args, kwargs)

    return key


@contextlib.contextmanager
def patched_torch() -> Iterator[None]:
    """torch patched for a plan (see the module's doc), restored after the block."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed import device_mesh

    plugin = dist.Backend._plugins["NEURON"]
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched_everywhere(torch.utils, "swap_tensors", _swap_fakes(torch.utils.swap_tensors)))
        stack.enter_context(patched_everywhere(torch, "compile", _compile(torch.compile)))
        frames = torch._dynamo.eval_frame
        stack.enter_context(patched(frames, "_callback_from_stance", _eager_in_plan(frames._callback_from_stance)))
        stack.enter_context(patched(torch.UntypedStorage, "resize_", _tracked_resize(torch.UntypedStorage.resize_)))
        stack.enter_context(patched(FakeTensorMode, "_cache_key", _storage_args_uncached(FakeTensorMode._cache_key)))
        # A strided shard (FSDP over TP) computes its layout by splitting a real CPU `arange` and reading it
        # (`tolist`): ints in, ints out, the layout and not the job's data, computed outside the plan's modes.
        strided = torch.distributed.tensor.placement_types._StridedShard
        stack.enter_context(patched(strided, "local_shard_size_and_offset",
                                    _outside_plan(strided.local_shard_size_and_offset)))
        # DTensor's sharding propagation runs the op on global-shape fakes of its own fake mode, as in a real run.
        propagator = torch.distributed.tensor._sharding_prop.ShardingPropagator
        stack.enter_context(patched(propagator, "_propagate_tensor_meta_non_cached",
                                    _outside_plan(propagator._propagate_tensor_meta_non_cached)))
        # A DataLoader iterator draws its workers' base seed from a host generator and reads it (`.item()`): a host
        # value the real run draws the same way, drawn for real (its set-up runs outside the plan's modes).
        loader_iter = torch.utils.data.dataloader._BaseDataLoaderIter
        stack.enter_context(patched(loader_iter, "__init__", _outside_plan(loader_iter.__init__)))
        stack.enter_context(patched(torch.nn.init, "_no_grad_trunc_normal_",
                                    _trunc_normal(torch.nn.init._no_grad_trunc_normal_)))
        stack.enter_context(patched_everywhere(torch.neuron, "get_rng_state",
                                               _planned_get_rng_state(torch.neuron.get_rng_state)))
        stack.enter_context(patched_everywhere(torch.neuron, "set_rng_state",
                                               _planned_set_rng_state(torch.neuron.set_rng_state)))
        stack.enter_context(patched_everywhere(dist, "init_process_group", _init_process_group(dist.init_process_group)))
        # DDP checks parameter shapes across ranks by reading a CPU tensor's data: one planned rank has no peers
        # to disagree with, and the fake holds no data.
        stack.enter_context(patched_everywhere(dist, "_verify_params_across_processes", lambda *args: None))
        stack.enter_context(patched_everywhere(device_mesh, "init_device_mesh",
                                               _outside_plan(device_mesh.init_device_mesh)))
        for name, member in _mesh_members(device_mesh.DeviceMesh):
            stack.enter_context(patched(device_mesh.DeviceMesh, name, member))
        ddp = torch.nn.parallel.DistributedDataParallel
        stack.enter_context(patched(ddp, "__init__", _ddp_init(ddp.__init__)))
        stack.enter_context(patched_schedules())
        for symbolic in (torch.SymInt, torch.SymFloat, torch.SymBool):
            stack.enter_context(patched(symbolic, "__format__", planned_format(symbolic.__format__)))
        stack.enter_context(patched(torch.Tensor, "__format__", planned_tensor_format(torch.Tensor.__format__)))
        tensor = planned_tensor(torch.tensor)
        stack.enter_context(_scripted_as_builtin(tensor, torch.tensor))
        stack.enter_context(patched(torch, "tensor", tensor))
        for launcher, planned_launch in _triton_launchers():
            stack.enter_context(patched(launcher, "run", planned_launch(launcher.run)))
        for name in ("__getitem__", "__setitem__"):
            stack.enter_context(patched(torch.Tensor, name, planned_index(getattr(torch.Tensor, name))))
        stack.enter_context(_untraced_masks())
        if importlib.util.find_spec("neuron_compile") is not None:  # a compiled decode's repeated calls replayed
            from neuron_compile.output_code import AtenHostCode

            stack.enter_context(patched(AtenHostCode, "run_graph", replaying(AtenHostCode.run_graph)))
        dist.Backend._plugins["NEURON"] = plugin._replace(creator_fn=_fake_neuron_group)
        stack.callback(dist.Backend._plugins.__setitem__, "NEURON", plugin)
        yield
