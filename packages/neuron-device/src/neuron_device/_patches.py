"""Every patch of torch internals, in one place, each with its reason. Applied once by `register()`.

torch 2.13 cannot register a c10 allocator for a Python PrivateUse1 backend, so every torch path that asks the C++
allocator for `neuron` memory dereferences a null allocator and kills the process. Those paths all meet in a few
storage entry points, patched here to allocate through `torch.empty` (our allocator) instead:

* `UntypedStorage(n, device="neuron")`, which also serves `TypedStorage(..., device=...)`, `storage.clone()`
  (and so `copy.deepcopy` of tensors), `storage.to(device)` / `storage.neuron()`, and every `torch.load` onto a
  `neuron` device (torch's own deserializer for the PrivateUse1 tag does `storage.to(device)`). Fixing the one
  constructor fixes them all, so `torch.serialization` needs no deserializer of ours.
* `UntypedStorage.new()`, `UntypedStorage.resize_()` (the C++ side asks the hooks for `resizePrivateUse1Bytes`,
  which Python cannot provide).

`Tensor.new_tensor` / `Tensor.new` rely on the C++ device guard to put results on the source tensor's device; the
Python guard always reports index 0, so they name the device explicitly.

Pinned memory has no Python-registrable allocator either; since host memory is device memory, `pin_memory()` makes a
copy flagged as pinned. Backward on `neuron:1..n` runs the autograd engine without device threads (see below).
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import threading
import types
import weakref
from collections.abc import Callable

import torch

from . import allocator

__all__ = ["apply_all"]

_NEURON = "neuron"
_applied = False


def _neuron_device(device) -> torch.device | None:
    """`device` as a torch.device if it names a `neuron` device, else None."""
    if device is None:
        return None
    device = torch.device(device)
    return device if device.type == _NEURON else None


def _allocate_storage(nbytes: int, device: torch.device) -> torch.UntypedStorage:
    return torch.empty(nbytes, dtype=torch.uint8, device=device).untyped_storage()


def _patch_storage_constructor() -> None:
    """`torch.UntypedStorage(size_or_sequence, device="neuron")` allocates through our allocator, not c10's."""
    construct = torch.UntypedStorage.__new__

    def __new__(cls, *args, device=None, **kwargs):
        target = _neuron_device(device)
        if target is None:
            if device is not None:
                kwargs["device"] = device
            return construct(cls, *args, **kwargs)
        if cls is not torch.UntypedStorage:
            raise NotImplementedError(
                f"{cls.__qualname__}(..., device='{target}'): subclasses of UntypedStorage cannot be allocated on "
                "neuron; allocate a torch.UntypedStorage instead"
            )
        if "allocator" in kwargs:
            raise NotImplementedError(
                "UntypedStorage(..., allocator=...) on neuron: the neuron device always uses its own allocator"
            )
        if not args:
            return _allocate_storage(0, target)
        size = args[0]
        if len(args) == 1 and isinstance(size, int) and not isinstance(size, bool):
            return _allocate_storage(size, target)
        host = construct(cls, *args, **kwargs)  # torch parses and validates the arguments (e.g. a byte sequence)
        return _allocate_storage(host.nbytes(), target).copy_(host)

    torch.UntypedStorage.__new__ = staticmethod(__new__)


def _patch_storage_new() -> None:
    """`storage.new()` (an empty storage on the same device) asks the C++ allocator."""
    new = torch.UntypedStorage.new

    def storage_new(self: torch.UntypedStorage) -> torch.UntypedStorage:
        if self.device.type == _NEURON:
            return _allocate_storage(0, self.device)
        return new(self)

    _replace(torch.UntypedStorage, "new", new, storage_new)


def _patch_storage_resize() -> None:
    """`storage.resize_(n)` on neuron raises from C++ (no `resizePrivateUse1Bytes` hook); FSDP2 needs it to work."""
    resize_ = torch.UntypedStorage.resize_

    def storage_resize_(self: torch.UntypedStorage, size: int) -> torch.UntypedStorage:
        if self.device.type != _NEURON:
            return resize_(self, size)
        if not isinstance(size, int) or isinstance(size, bool):
            raise TypeError(f"resize_(): argument 'size' must be int, not {type(size).__name__}")
        allocator.resize(self, size)
        return self

    _replace(torch.UntypedStorage, "resize_", resize_, storage_resize_)


_pinned_storages: set[int] = set()  # data pointers of host storages made by pin_memory() and still alive


def _patch_pin_memory() -> None:
    """Pinning a CPU tensor asks the current accelerator (neuron) for a pinned-memory allocator, which a Python
    backend cannot register in torch 2.13. In the simulator host memory *is* device memory, so page-locking buys
    nothing: `pin_memory()` returns a copy marked as pinned (`is_pinned()` is True, as on CUDA), which is what
    `DataLoader(pin_memory=True)` and the Trainer's default pipelines need."""
    pin_memory, is_pinned = torch.Tensor.pin_memory, torch.Tensor.is_pinned

    def tensor_is_pinned(self: torch.Tensor, device=None) -> bool:
        if self.device.type == "cpu" and (device is None or _neuron_device(device) is not None):
            return self.untyped_storage().data_ptr() in _pinned_storages
        return is_pinned(self) if device is None else is_pinned(self, device)

    def tensor_pin_memory(self: torch.Tensor, device=None) -> torch.Tensor:
        if self.device.type != "cpu" or (device is not None and _neuron_device(device) is None):
            return pin_memory(self) if device is None else pin_memory(self, device)
        if tensor_is_pinned(self):
            return self
        pinned = torch.empty_like(self, memory_format=torch.preserve_format).copy_(self)
        storage = pinned.untyped_storage()
        _pinned_storages.add(storage.data_ptr())
        weakref.finalize(storage, _pinned_storages.discard, storage.data_ptr())
        return pinned

    _replace(torch.Tensor, "is_pinned", is_pinned, tensor_is_pinned)
    _replace(torch.Tensor, "pin_memory", pin_memory, tensor_pin_memory)


def _with_current_index(device):
    """`device` with the current `neuron` index filled in when it names `neuron` without one, else `device`."""
    if device == _NEURON or (isinstance(device, torch.device) and device.type == _NEURON and device.index is None):
        return torch.device(_NEURON, torch.neuron.current_device())
    return device


def _patch_tensor_to_current_device() -> None:
    """`tensor.to("neuron")` must land on the current device (`torch.neuron.set_device`, `torch.neuron.device(i)`,
    `LOCAL_RANK`), as `.to("cuda")` does. torch fills a missing index from the C++ device guard, which for a Python
    backend always says 0, so the index is filled in here before torch sees the device."""
    to = torch.Tensor.to

    def tensor_to(self: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if args and (args[0] == _NEURON or isinstance(args[0], torch.device)):
            args = (_with_current_index(args[0]), *args[1:])
        elif "device" in kwargs:
            kwargs["device"] = _with_current_index(kwargs["device"])
        return to(self, *args, **kwargs)

    _replace(torch.Tensor, "to", to, tensor_to)


def _patch_lazy_parameters_move_with_neuron() -> None:
    """A lazy module's uninitialized parameters allow `.cuda()` (a list in `UninitializedTensorMixin`); torch's
    generated `Tensor.neuron()` is not on it, so `LazyLinear(3).neuron()` raised where `.cuda()` works."""
    torch.nn.parameter.UninitializedTensorMixin._allowed_methods.append(torch.Tensor.neuron)


def _patch_backward_single_threaded() -> None:
    """The C++ device guard of a Python backend reports one device, so the autograd engine, which keeps one worker
    queue per device, asserts on a graph living on `neuron:1` or higher. Running the engine without device threads
    avoids the per-device queues. `set_multithreading_enabled` is thread-local, so it is applied where every
    backward starts (`Tensor.backward` and `torch.autograd.grad` both call `_engine_run_backward`), in any thread."""
    import torch.autograd.graph as graph

    run_backward = graph._engine_run_backward

    @functools.wraps(run_backward)
    def engine_run_backward(*args, **kwargs):
        with torch.autograd.set_multithreading_enabled(False):
            return run_backward(*args, **kwargs)

    graph._engine_run_backward = engine_run_backward
    torch.autograd._engine_run_backward = engine_run_backward


class _ModeDispatchFailed:
    """What a guarded dispatch mode or unpack hook returns in place of a result after it raised: no op result and no
    saved tensor has this type, so torch rejects it with a C++ error, which leaves no Python error pending."""


_MODE_DISPATCH_FAILED = _ModeDispatchFailed()


class _InsideModeDispatch(threading.local):
    depth = 0


_inside_mode_dispatch = _InsideModeDispatch()


def _guard_mode_errors(mode, raised: list[BaseException]) -> Callable:
    """`mode.__torch_dispatch__`, which stores what it raises in `raised` instead of raising into the engine (only
    at the outermost call: inside it, a mode's errors reach the mode that called it as they always do)."""
    dispatch = mode.__torch_dispatch__

    def __torch_dispatch__(self, func, tensor_types, args=(), kwargs=None):
        if _inside_mode_dispatch.depth:
            return dispatch(func, tensor_types, args, kwargs)
        if raised:
            return _MODE_DISPATCH_FAILED
        _inside_mode_dispatch.depth = 1
        try:
            return dispatch(func, tensor_types, args, kwargs)
        except BaseException as error:
            raised.append(error)
            return _MODE_DISPATCH_FAILED
        finally:
            _inside_mode_dispatch.depth = 0

    return types.MethodType(__torch_dispatch__, mode)


class _BackwardErrors(threading.local):
    """The errors held back during the innermost backward run on this thread, None outside a backward."""

    raised: list[BaseException] | None = None


_backward_errors = _BackwardErrors()


# What a guarded hook returns after it raised, per kind of hook: a value torch rejects in C++, leaving no Python
# error pending (checked from Python on the CPU: a RuntimeError, where a value of the wrong kind gives a TypeError,
# raised as a Python error). A saved-tensor unpack hook returns no tensor ("Output of saved tensor unpack_hook
# expected to be a Tensor"); a tensor hook or a post-accumulate-grad hook returns a tensor of another type than every
# gradient ("hook ... has changed the type of value"); a node hook or pre-hook returns one gradient too many ("hook
# ... has returned an incorrect number of values").
_REJECTED_GRAD = torch.empty(0, dtype=torch.bool)


def _reject_unpacked(args: tuple) -> object:
    return _MODE_DISPATCH_FAILED


def _reject_grad(args: tuple) -> torch.Tensor:
    return _REJECTED_GRAD


def _reject_grads(args: tuple) -> tuple:
    return (None,) * (len(args[0]) + 1)


def _guard_hook(hook: Callable, rejected: Callable[[tuple], object]) -> Callable:
    """`hook`, which inside a backward stores what it raises and returns `rejected(args)` instead, a value torch
    rejects in C++ (see `_REJECTED_GRAD`); outside a backward it is `hook`."""
    if getattr(hook, "_neuron_guarded", False):  # a tensor subclass's __torch_function__ registers it once more
        return hook

    @functools.wraps(hook, updated=())  # not a module's state
    def guarded_hook(*args):
        raised = _backward_errors.raised
        if raised is None:
            return hook(*args)
        if raised:
            return rejected(args)
        try:
            return hook(*args)
        except BaseException as error:
            raised.append(error)
            return rejected(args)

    guarded_hook._neuron_guarded = True
    return guarded_hook


def _patch_backward_mode_errors() -> None:
    """An error raised by a Python dispatch mode (FakeTensorMode and the proxy mode while AOTAutograd traces a
    backward, or a user's `TorchDispatchMode`), by a saved-tensor unpack hook (non-reentrant activation
    checkpointing's recompute, where selective checkpointing's `_CachedTorchDispatchMode` raises when the recompute
    differs from the forward) or by a tensor or node hook (`Tensor.register_hook`, `register_post_accumulate_grad_hook`,
    `grad_fn.register_hook` / `register_prehook`, which module backward hooks use too) inside a backward node on
    `neuron` killed the process ("terminate called without an active exception"): torch leaves the Python error
    pending while the C++ engine unwinds, and the engine's stream guard, leaving the node, asks the Python device
    guard for its type. That Python call fails with an error pending, inside a `noexcept` method (`torch.acc`'s
    `PythonDeviceGuard::exchangeStream`), so C++ terminates (or, for a mode entered inside a hook, the engine returned
    "NULL without setting an exception"). On the CPU there is no stream guard, and AOTAutograd catches such errors
    (data-dependent shapes) and goes on.

    While a backward runs, the outermost call of each dispatch mode on the stack and every unpack, tensor and node
    hook (wrapped where it is registered) store their error and return a value torch rejects in C++ (no Python error
    pending, see `_REJECTED_GRAD`); the engine unwinds cleanly and the stored error is raised from `backward()` /
    `torch.autograd.grad()`, as on the CPU. Dynamo still special-cases the patched `Tensor.register_hook` by name
    (a compiled hook is traced into the graph). Errors of a tensor subclass's own `__torch_dispatch__`, of
    `torch.fx.GraphModule` unpack hooks (which torch.compile inlines, so they stay unwrapped) and of modes entered
    during the backward outside a hook are not covered."""
    import torch.autograd.graph as graph
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    run_backward = graph._engine_run_backward
    unset = object()

    @functools.wraps(run_backward)
    def engine_run_backward(*args, **kwargs):
        modes = _get_current_dispatch_mode_stack()
        raised: list[BaseException] = []
        saved = [(mode, vars(mode).get("__torch_dispatch__", unset)) for mode in modes]
        depth, _inside_mode_dispatch.depth = _inside_mode_dispatch.depth, 0  # a backward run inside a mode's dispatch
        outer, _backward_errors.raised = _backward_errors.raised, raised
        for mode in modes:
            mode.__torch_dispatch__ = _guard_mode_errors(mode, raised)
        try:
            result = run_backward(*args, **kwargs)
        except Exception:
            if not raised:
                raise
        finally:
            _inside_mode_dispatch.depth = depth
            _backward_errors.raised = outer
            for mode, own in saved:
                if own is unset:
                    del mode.__torch_dispatch__
                else:
                    mode.__torch_dispatch__ = own
        if raised:
            raise raised[0]  # outside the except block: its context stays the one it was raised with
        return result

    graph._engine_run_backward = engine_run_backward
    torch.autograd._engine_run_backward = engine_run_backward

    push_hooks = torch._C._autograd._push_saved_tensors_default_hooks

    @functools.wraps(push_hooks)
    def push_saved_tensors_default_hooks(pack_hook: Callable, unpack_hook: Callable) -> None:
        if not isinstance(unpack_hook, torch.fx.GraphModule):  # torch.compile inlines GraphModule hooks: kept as is
            unpack_hook = _guard_hook(unpack_hook, _reject_unpacked)
        push_hooks(pack_hook, unpack_hook)

    torch._C._autograd._push_saved_tensors_default_hooks = push_saved_tensors_default_hooks
    torch.autograd._push_saved_tensors_default_hooks = push_saved_tensors_default_hooks

    for name in ("register_hook", "register_post_accumulate_grad_hook"):
        _replace(torch.Tensor, name, getattr(torch.Tensor, name), _registering_guarded(getattr(torch.Tensor, name)))

    # Every node's register_hook and register_prehook (C++ nodes and custom Functions' alike) store the hook
    # through this static method, looked up on `torch.autograd.Function` at each call.
    mixin = torch.autograd.function._HookMixin
    register_node_hook = mixin._register_hook

    @functools.wraps(register_node_hook)
    def _register_hook(backward_hooks, hook):
        return register_node_hook(backward_hooks, _guard_hook(hook, _reject_grads))

    mixin._register_hook = staticmethod(_register_hook)


def _registering_guarded(register: Callable) -> Callable:
    """`Tensor.register_hook` or `Tensor.register_post_accumulate_grad_hook`, registering the hook guarded."""

    def register_guarded(self: torch.Tensor, hook: Callable):
        return register(self, _guard_hook(hook, _reject_grad))

    return register_guarded


def _patch_clear_autocast_cache() -> None:
    """Leaving the outermost autocast region calls `torch.clear_autocast_cache()`, which clears only the C++ weight
    cache: also clear the cache of the Python `neuron` autocast policies (`autocast.py`)."""
    from . import autocast

    clear = torch.clear_autocast_cache

    def clear_autocast_cache() -> None:
        clear()
        autocast.clear_cache()

    clear_autocast_cache.__doc__ = clear.__doc__
    torch.clear_autocast_cache = clear_autocast_cache


def _while_neuron(original: Callable, target: Callable) -> Callable:
    """`original`, except that while neuron is the current accelerator the call goes to `target` (torch.accelerator's
    functions serve whichever accelerator is current; other accelerators keep theirs)."""

    def routed(*args, **kwargs):
        accelerator = torch.accelerator.current_accelerator()
        if accelerator is None or accelerator.type != _NEURON:
            return original(*args, **kwargs)
        return target(*args, **kwargs)

    return functools.wraps(original)(routed)


def _patch_accelerator_memory() -> None:
    """torch.accelerator's memory functions ask c10's DeviceAllocator registry, which a Python backend cannot join in
    torch 2.13 (INTERNAL ASSERT "Allocator for neuron is not a DeviceAllocator"): route them to `torch.neuron`, whose
    caching-allocator model keeps the same statistics. Other accelerators keep the original functions."""
    from torch.accelerator import memory as accelerator_memory

    routes = {name: name for name in (
        "empty_cache", "max_memory_allocated", "max_memory_reserved", "memory_allocated", "memory_reserved",
        "memory_stats", "reset_accumulated_memory_stats", "reset_peak_memory_stats",
    )}
    routes["get_memory_info"] = "mem_get_info"
    for name, target in routes.items():
        routed = _while_neuron(getattr(accelerator_memory, name), getattr(torch.neuron, target))
        setattr(accelerator_memory, name, routed)
        setattr(torch.accelerator, name, routed)


def _patch_legacy_constructors() -> None:
    """`t.new_tensor(data)` and `t.new(...)` build on the current device of the C++ device guard, which CUDA sets
    to `t`'s device; a Python backend's guard always says index 0, so `t` on neuron:1 gave results on neuron:0.
    Name `t`'s device explicitly instead."""
    new_tensor, new = torch.Tensor.new_tensor, torch.Tensor.new

    def tensor_new_tensor(self: torch.Tensor, data, *args, **kwargs) -> torch.Tensor:
        if self.device.type == _NEURON and kwargs.get("device") is None:
            kwargs["device"] = self.device
        return new_tensor(self, data, *args, **kwargs)

    def tensor_new(self: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        target = _neuron_device(kwargs.get("device", self.device))
        if self.device.type != _NEURON or target is None or (args and isinstance(args[0], torch.Tensor)):
            return new(self, *args, **kwargs)  # other devices, errors, and new(tensor), which aliases `tensor`
        if target.index is None:
            target = torch.device(_NEURON, torch.neuron.current_device())
        if not args:  # even an explicit device is ignored by torch here
            return torch.empty(0, dtype=self.dtype, device=target)
        return new(self, *args, **{**kwargs, "device": target})

    _replace(torch.Tensor, "new_tensor", new_tensor, tensor_new_tensor)
    _replace(torch.Tensor, "new", new, tensor_new)


def _patch_accelerator_streams() -> None:
    """torch.accelerator's stream functions reach the C++ device guard, whose streams are dummies for a Python
    backend: `synchronize()` raises "Backend doesn't support synchronizing all streams", `current_stream()` is always
    stream 0 and `set_stream()` does nothing. Route them to `torch.neuron`'s streams (simulated time) while neuron
    is the accelerator. (`torch.Stream`/`torch.Event` are immutable C++ types and stay torch's dummies.)"""
    for name in ("current_stream", "set_stream", "synchronize"):
        setattr(torch.accelerator, name, _while_neuron(getattr(torch.accelerator, name), getattr(torch.neuron, name)))


# Every dtype a `neuron` tensor can hold and convert to and from (tests/test_dtypes.py moves and casts each).
_SUPPORTED_DTYPES = frozenset({
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
    torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex32, torch.complex64,
    torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
    torch.float8_e8m0fnu,
})


def _device_capability(index: int) -> dict[str, set[torch.dtype]]:
    """`torch.accelerator.get_device_capability()` for a `neuron` device."""
    torch.neuron.get_device_properties(index)  # names a bad index
    return {"supported_dtypes": set(_SUPPORTED_DTYPES)}


def _patch_accelerator_device_index() -> None:
    """torch.accelerator's device-index functions reach the C++ device guard, which for a Python backend always says
    index 0 and ignores a new one: `current_device_index()` was 0 under `torch.neuron.set_device(1)`, and
    `set_device_index()` (transformers' distributed set-up calls it with the local rank) and the `device_index(i)`
    context manager did nothing. Every one of them reads the guard through four `torch._C` functions, looked up at
    call time; while neuron is the accelerator those use `torch.neuron`'s current device. The same holds for
    `get_device_capability()`, which raised "Backend doesn't support getting device capabilities"."""

    def exchange(index: int) -> int:
        previous = torch.neuron.current_device()
        torch.neuron.set_device(index)  # a negative index changes nothing, as in CUDA's exchange
        return previous

    routes = {
        "_accelerator_getDeviceCapability": _device_capability,
        "_accelerator_getDeviceIndex": torch.neuron.current_device,
        "_accelerator_setDeviceIndex": torch.neuron.set_device,
        "_accelerator_exchangeDevice": exchange,
        "_accelerator_maybeExchangeDevice": exchange,
    }
    for name, target in routes.items():
        setattr(torch._C, name, _while_neuron(getattr(torch._C, name), target))


def _patch_data_parallel_comm() -> None:
    """`nn.DataParallel` moves tensors between devices through `torch.nn.parallel.comm`, whose scatter, gather and
    broadcasts call C++ functions that only CUDA builds have ("module 'torch._C' has no attribute '_scatter'"), and
    whose `reduce_add` warns "PyTorch is not compiled with NCCL support" on every backward. While neuron is the
    accelerator they go to `torch.neuron.comm` (`reduce_add_coalesced` is Python that calls `reduce_add`).

    Scattering a CPU batch copies each chunk on a background stream from `torch.Stream(index)`, which for a Python
    backend is always a dummy stream of device 0; the main stream of device 1 then refused to wait for it. Those
    streams are `torch.neuron.Stream`s of the right device instead."""
    from torch.nn.parallel import _functions, comm

    for name in ("broadcast", "broadcast_coalesced", "reduce_add", "scatter", "gather"):
        setattr(comm, name, _while_neuron(getattr(comm, name), getattr(torch.neuron.comm, name)))
    _functions._get_stream = _while_neuron(_functions._get_stream, torch.neuron.Stream)


def _patch_storage_non_blocking_copy() -> None:
    """`storage.to("cpu", non_blocking=True)` from a PrivateUse1 device copies into a pinned buffer, which a Python
    backend cannot allocate (see `_patch_pin_memory`). The simulator's copies are synchronous, so pinning would buy
    nothing: copy into ordinary memory."""
    to = torch.storage._StorageBase.to

    def storage_to(self, *, device, non_blocking: bool = False):
        if non_blocking and self.device.type == _NEURON and torch.device(device).type == "cpu":
            non_blocking = False
        return to(self, device=device, non_blocking=non_blocking)

    _replace(torch.storage._StorageBase, "to", to, storage_to)


def _patch_process_sharing() -> None:
    """Sending a `neuron` tensor or storage to another process (multiprocessing queues, DataLoader workers, spawn
    arguments) fell into torch's CPU shared-memory path and failed with "_share_fd_: only available on CPU", in a
    queue's feeder thread, so `put()` returned and the receiver waited forever. CUDA shares device memory through
    IPC handles; the simulator's device memory is host memory, so a `neuron` storage is shared as a CPU one: its bytes
    move into shared memory on first send (`allocator.host_shared`), torch's CPU reduction sends that, and the
    receiver maps it as a storage of the same `neuron` device. As with CUDA, both processes then see each other's
    writes. Tensors, parameters and typed storages reduce to their untyped storage through torch's own reducers."""
    from multiprocessing.reduction import ForkingPickler

    from torch.multiprocessing import reductions

    reduce_storage = reductions.reduce_storage

    def reduce_neuron_storage(storage: torch.UntypedStorage):
        if storage.device.type != _NEURON:
            return reduce_storage(storage)
        if storage.nbytes() == 0:  # empty storages cannot be mapped (torch's own special case)
            rebuild, args = reductions.rebuild_storage_empty, (torch.UntypedStorage,)
        else:
            rebuild, args = reduce_storage(allocator.host_shared(storage))
        return _rebuild_neuron_storage, (rebuild, args, storage.device.index)

    for cls, reduce in list(ForkingPickler._extra_reducers.items()):
        if reduce is reduce_storage:
            ForkingPickler.register(cls, functools.wraps(reduce)(reduce_neuron_storage))


def _rebuild_neuron_storage(rebuild: Callable, args: tuple, index: int) -> torch.UntypedStorage:
    """The receiving end of `_patch_process_sharing`: the sender's CPU shared memory as a `neuron:index` storage."""
    return allocator.adopt_shared(rebuild(*args), index)


def _patch_printing_on_host() -> None:
    """Printing a tensor measures its values (`torch._tensor_str._Formatter`) with `masked_select`, whose output size
    depends on the data, so on the chip it is a CPU fallback: `print(neuron_tensor)` warned "Operator
    'aten::masked_select' fell back to CPU". The device copies a tensor to the host to print it (as CUDA's printing
    ends up doing for the values); the formatter measures that host copy, so printing charges one transfer and
    warns about nothing."""
    formatter = torch._tensor_str._Formatter
    init = formatter.__init__

    def __init__(self, tensor: torch.Tensor) -> None:
        init(self, tensor.cpu() if tensor.device.type == _NEURON else tensor)

    _replace(formatter, "__init__", init, __init__)


def _replace(owner: type, name: str, original: Callable, replacement: Callable) -> None:
    """Install `replacement` as `owner.name`, keeping the original's name and docstring for help() and Sphinx.

    torch lists a few Tensor methods by identity: the methods an uninitialized (lazy) parameter allows, checked in its
    `__torch_function__`, which receives whatever `torch.Tensor.<name>` is now. A replacement joins the list its
    original is on, or `LazyLinear(...).to("cpu")` raises "Attempted to use an uninitialized parameter"."""
    replacement.__name__ = name
    replacement.__qualname__ = f"{owner.__qualname__}.{name}"
    replacement.__doc__ = original.__doc__
    setattr(owner, name, replacement)
    allowed = torch.nn.parameter.UninitializedTensorMixin._allowed_methods
    if original in allowed:
        allowed.append(replacement)


NEURON_GENERATOR_ERROR = (
    "torch.Generator('{device}') cannot be created: torch 2.13 lets a Python backend implement only is_available, "
    "is_built and has_primary_context of the PrivateUse1 hooks, not getNewGenerator. Random ops on neuron draw from "
    "the device's own generator, torch.neuron.random.default_generator({index}) (seeded by torch.neuron.manual_seed); "
    "for a generator of your own, pass a CPU torch.Generator() as generator=, e.g. "
    "torch.rand_like(t, generator=torch.Generator().manual_seed(0)): it gives the numbers the CPU would"
)


def _patch_generator_constructor() -> None:
    """`torch.Generator("neuron")` asks the PrivateUse1 hooks for `getNewGenerator`, which a Python backend cannot
    provide, and torch's error tells the user to register C++ hooks. Raise one that names what to use instead.
    `torch.Generator`'s metaclass (torch's OpaqueBaseMeta, a Python class) is the one place a call to it passes."""
    metaclass = type(torch.Generator)
    original = metaclass.__call__

    @functools.wraps(original)
    def call(cls, *args, **kwargs):
        if cls is torch.Generator:
            device = kwargs.get("device", args[0] if args else None)
            device = _neuron_device(device) if isinstance(device, (str, torch.device)) else None
            if device is not None:
                index = device.index if device.index is not None else torch.neuron.current_device()
                raise NotImplementedError(NEURON_GENERATOR_ERROR.format(device=device, index=index))
        return original(cls, *args, **kwargs)

    metaclass.__call__ = call


# The runtime's modules: called by torch's dispatcher (kernels, fallback, allocator, guards), never by user code
RUNTIME_MODULES = tuple(f"neuron_device.{name}" for name in (
    "_patches", "_registration", "adaptive_eager", "allocator", "barrier", "fallback", "hooks", "livestats", "numerics", "ops",
    "progress", "services", "simulation", "storage", "timeline",
))
_DYNAMO_RULES = "torch._dynamo.trace_rules"


def _skip_runtime_in_dynamo() -> None:
    """Dynamo traces every Python frame that starts while a frame it transformed runs, and a `neuron` op that runs
    eagerly between two graphs (after a graph break) enters our Python kernels from C++: Dynamo would take each
    kernel frame for user code and trace the runtime itself (the allocator, the cost model, the timeline), hitting
    graph breaks and recompile limits in it. torch skips its own files by directory; the runtime's modules join that
    list (`trace_rules.add`) as soon as Dynamo's rules are imported, whichever backend compiles (neuron-compile's or
    `aot_eager`). Dynamo takes 2 s to import, so it is not imported here: an import hook waits for it."""
    def add_all(rules) -> None:
        for name in RUNTIME_MODULES:
            rules.add(name)

    if _DYNAMO_RULES in sys.modules:
        add_all(sys.modules[_DYNAMO_RULES])
        return
    sys.meta_path.insert(0, _AfterImport(_DYNAMO_RULES, add_all))


_FLEX_ATTENTION = "torch.nn.attention.flex_attention"


def _patch_flex_attention_devices() -> None:
    """`flex_attention` checks its inputs' device against a fixed set (cuda, cpu, xpu, hpu, mps) before it reaches
    its higher-order op, whose kernels dispatch by device like any op's: `neuron` has its own (`ops.flex_attention`,
    one flash kernel each, with a backward). `neuron` passes the check; other devices get torch's. The module is not
    imported by `import torch`, so an import hook waits for it."""
    def accept_neuron(module) -> None:
        validate = module._validate_device

        @functools.wraps(validate)
        def _validate_device(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
            if query.device.type != "neuron":
                validate(query, key, value)

        module._validate_device = _validate_device

    if _FLEX_ATTENTION in sys.modules:
        accept_neuron(sys.modules[_FLEX_ATTENTION])
    else:
        sys.meta_path.insert(0, _AfterImport(_FLEX_ATTENTION, accept_neuron))


_CONTEXT_PARALLEL = "torch.distributed.tensor.experimental._context_parallel._attention"


def _patch_context_parallel_fused_attention() -> None:
    """torch 2.13's context parallelism shards only the CUDA SDPA ops (flash, efficient, cuDNN: their ring-attention
    handlers and sequence-sharding rules), so SDPA on a PrivateUse1 backend, which runs the fused op torch keeps for
    such backends (`_scaled_dot_product_fused_attention_overrideable`, as TorchNeuron's and neuron's SDPA do), fails
    under `context_parallel` with "does not have a sharding strategy registered". The fused op returns what the
    flash op returns (output and logsumexp first), so the same ring attention serves it: its forward and backward
    join CP's op handlers, with sequence-sharded (dim 2) rules registered and removed with CP's own. The module is
    not imported by `import torch`, so an import hook waits for it."""
    def shard_fused_attention(attention) -> None:
        from torch.distributed.tensor import DTensor, Replicate, Shard
        from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
        from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy
        from torch.distributed.tensor.experimental._context_parallel import _sharding_rules

        aten, seq = torch.ops.aten, Shard(2)
        forward_op = aten._scaled_dot_product_fused_attention_overrideable.default
        backward_op = aten._scaled_dot_product_fused_attention_overrideable_backward.default

        def ring_forward(mesh, query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False,
                         return_debug_mask=False, *, scale=None):
            if attn_bias is not None or return_debug_mask:
                raise NotImplementedError("context parallelism of the fused attention: attn_bias and "
                                          "return_debug_mask are not supported")
            return attention._templated_ring_attention(mesh.get_group(), 2, forward_op, query=query, key=key,
                                                       value=value, is_causal=is_causal, dropout_p=dropout_p,
                                                       scale=scale)

        def ring_backward(mesh, grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q,
                          cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
            return attention._templated_ring_attention_backward(
                mesh.get_group(), 2, backward_op, grad_out=grad_out, grad_out_name="grad_out", query=query, key=key,
                value=value, out=out, logsumexp=logsumexp, is_causal=is_causal, attn_bias=attn_bias,
                grad_input_mask=grad_input_mask, cum_seq_q=cum_seq_q, cum_seq_k=cum_seq_k, max_q=max_q,
                max_k=max_k, dropout_p=dropout_p, philox_seed=philox_seed, philox_offset=philox_offset, scale=scale)

        rings = {forward_op: ring_forward, backward_op: ring_backward}

        def handler(op_call, args, kwargs):  # CP's `_sdpa_handler`, with the fused op's ring attention
            dispatcher = DTensor._op_dispatcher
            info = dispatcher.unwrap_to_op_info(op_call, args, kwargs)
            dispatcher.sharding_propagator.propagate(info)
            if info.output_sharding is None or info.output_sharding.needs_redistribute:
                raise AssertionError("context parallelism expects q, k and v sharded on the sequence dim")
            local = rings[op_call](info.compute_mesh, *info.local_args, **info.local_kwargs)
            return dispatcher.wrap(local, info.output_sharding.output_spec)

        def forward_strategy(op_schema):
            # outputs: out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, philox_seed, philox_offset, debug mask;
            # then the tensor inputs q, k, v
            outputs = [None, None, None, None, Replicate(), Replicate(), None]
            strategies = [[Replicate(), Replicate(), *outputs, Replicate(), Replicate(), Replicate()],
                          [seq, seq, *outputs, seq, seq, seq]]
            return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(), op_schema, strategies,
                                                   input_index=9)

        def backward_strategy(op_schema):
            # outputs: grad q, k, v, bias (none); inputs: grad_out, q, k, v, out, logsumexp, philox seed and offset
            strategies = [[Replicate()] * 3 + [None] + [Replicate()] * 8,
                          [seq] * 3 + [None] + [seq] * 6 + [Replicate()] * 2]
            return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(validate=False), op_schema,
                                                   strategies, input_index=4)

        register = _sharding_rules.register_cp_sharding_rules

        @functools.wraps(register)
        def register_cp_sharding_rules() -> None:
            registered = bool(_sharding_rules._cp_strategy_contexts)
            register()
            if registered:
                return
            for op, strategy, schema in ((forward_op, forward_strategy, RuntimeSchemaInfo(4)),
                                         (backward_op, backward_strategy, None)):
                context = _sharding_rules._op_strategy_context(op, strategy, schema)
                _sharding_rules._original_strategies[op] = context.__enter__()
                _sharding_rules._cp_strategy_contexts[op] = context

        _sharding_rules.register_cp_sharding_rules = register_cp_sharding_rules
        attention.custom_ops.update({forward_op: handler, backward_op: handler})

    if _CONTEXT_PARALLEL in sys.modules:
        shard_fused_attention(sys.modules[_CONTEXT_PARALLEL])
    else:
        sys.meta_path.insert(0, _AfterImport(_CONTEXT_PARALLEL, shard_fused_attention))


_FSDP_PARAM_GROUP = "torch.distributed.fsdp._fully_shard._fsdp_param_group"
_sac_bypass = threading.local()  # depth of FSDP's unshard calls on this thread: selective checkpointing skips them


def _outside_selective_checkpointing(method: Callable) -> Callable:
    @functools.wraps(method)
    def run(*args, **kwargs):
        depth = getattr(_sac_bypass, "depth", 0)
        _sac_bypass.depth = depth + 1
        try:
            return method(*args, **kwargs)
        finally:
            _sac_bypass.depth = depth

    return run


def _patch_selective_checkpointing_fsdp_runtime() -> None:
    """Selective activation checkpointing (SAC) caches each op of a checkpointed region by its invocation index per
    op, in the forward, and replays them by the same index in the recompute, so the region must run the same ops
    both times. FSDP2's hooks inside the region do not: a module sharded on its own inside a checkpointed block (the
    routed experts torchtitan shards apart for expert parallelism) is all-gathered in the forward by the previous
    block's explicit prefetch, outside the region, but in the recompute by its own pre-forward, inside it; and its
    `record_function` annotations run a different number of times. SAC then raises "... invocation index N
    encountered during backward but not found in storage" (`profiler._record_function_enter_new`,
    `fsdp.all_gather_copy_in`), and a differing count of an op could hand back another call's cached output. The same
    happens on the CPU with Gloo (torch 2.13). As upstream (pytorch/pytorch#196862, "[FSDP] Exclude all-gather
    internals from selective checkpointing"): the profiler's record-function ops join SAC's ignored ops, and FSDP's
    unshard (all-gather launch) and wait for it (copy-out) run outside SAC's caching (other dispatch modes still see
    them). The FSDP module is not imported by `import torch`, so an import hook waits for it."""
    from torch.utils import checkpoint

    profiler = torch.ops.profiler
    checkpoint.SAC_IGNORED_OPS.update({profiler._record_function_enter.default,
                                       profiler._record_function_enter_new.default,
                                       profiler._record_function_exit.default,
                                       profiler._record_function_exit._RecordFunction})
    for mode in (checkpoint._CachingTorchDispatchMode, checkpoint._CachedTorchDispatchMode):
        dispatch = mode.__torch_dispatch__

        @functools.wraps(dispatch)
        def __torch_dispatch__(self, func, types, args=(), kwargs=None, _dispatch=dispatch):
            if getattr(_sac_bypass, "depth", 0):
                return func(*args, **(kwargs or {}))
            return _dispatch(self, func, types, args, kwargs)

        mode.__torch_dispatch__ = __torch_dispatch__

    def unshard_outside(module) -> None:
        group = module.FSDPParamGroup
        group.unshard = _outside_selective_checkpointing(group.unshard)
        group.wait_for_unshard = _outside_selective_checkpointing(group.wait_for_unshard)

    if _FSDP_PARAM_GROUP in sys.modules:
        unshard_outside(sys.modules[_FSDP_PARAM_GROUP])
    else:
        sys.meta_path.insert(0, _AfterImport(_FSDP_PARAM_GROUP, unshard_outside))


class _AfterImport:
    """A meta-path finder that runs `then(module)` once the module named `name` has been executed."""

    def __init__(self, name: str, then: Callable) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        execute = spec.loader.exec_module

        def exec_module(module) -> None:
            execute(module)
            self.then(module)

        spec.loader.exec_module = exec_module
        return spec


_PATCHES = (
    _patch_generator_constructor,
    _patch_storage_constructor,
    _patch_storage_new,
    _patch_storage_resize,
    _patch_pin_memory,
    _patch_backward_single_threaded,
    _patch_backward_mode_errors,
    _patch_tensor_to_current_device,
    _patch_lazy_parameters_move_with_neuron,
    _patch_legacy_constructors,
    _patch_storage_non_blocking_copy,
    _patch_process_sharing,
    _patch_clear_autocast_cache,
    _patch_accelerator_memory,
    _patch_accelerator_streams,
    _patch_accelerator_device_index,
    _patch_data_parallel_comm,
    _patch_printing_on_host,
    _skip_runtime_in_dynamo,
    _patch_flex_attention_devices,
    _patch_context_parallel_fused_attention,
    _patch_selective_checkpointing_fsdp_runtime,
)


def apply_all() -> None:
    """Apply all patches (idempotent)."""
    global _applied
    if _applied:
        return
    for patch in _PATCHES:
        patch()
    _applied = True
