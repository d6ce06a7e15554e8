"""Calling ``@nki.jit`` kernels with torch tensors: zero-copy NumPy views in, torch tensors out, cost charged.

A ``neuron`` tensor is host memory (neuron-device's storage model), so its NumPy view is a view of the caller's
storage: a kernel that writes an input writes the caller's tensor. CPU tensors are viewed the same way.
Kernel outputs become tensors on the device of the first tensor argument (``neuron`` outputs are adopted by the
device allocator, so they count against its HBM). The launch's simulated latency is charged to the current stream
of that device through ``neuron_device.services.record_kernel`` and logged per kernel (:func:`kernel_log`).

Fake tensors (``torch.compile`` tracing, ``register_fake``) never reach the simulator with data: the kernel is run
once per signature on zero-filled arrays to learn its output shapes and dtypes, and fake outputs are returned.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import torch

from neuron_device import services

from .._launch import Kernel, map_nested

__all__ = ["KernelLaunch", "dry_run", "from_numpy", "kernel_log", "launch", "record_launch", "record_launches",
           "signature", "to_numpy"]

# torch dtypes NumPy cannot hold: viewed through a same-size integer and reinterpreted as the ml_dtypes type.
_VIA_INT = {
    torch.bfloat16: (torch.int16, np.dtype(ml_dtypes.bfloat16)),
    torch.float8_e4m3fn: (torch.uint8, np.dtype(ml_dtypes.float8_e4m3fn)),
    torch.float8_e5m2: (torch.uint8, np.dtype(ml_dtypes.float8_e5m2)),
}
_FROM_NUMPY = {np_dtype: (int_dtype, torch_dtype) for torch_dtype, (int_dtype, np_dtype) in _VIA_INT.items()}


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A NumPy view of a CPU or ``neuron`` tensor's memory (same shape and strides; no copy)."""
    if t.device.type == "neuron":
        t = services.host_alias(t)
    elif t.device.type != "cpu":
        raise TypeError(f"NKI kernels run on 'neuron' or 'cpu' tensors, got a tensor on {t.device}")
    if t.requires_grad:
        t = t.detach()
    if t.is_conj() or t.is_neg():
        raise TypeError("NKI kernels cannot take tensors with a lazy conjugate/negative bit; call resolve_conj() / "
                        "resolve_neg() first")
    via = _VIA_INT.get(t.dtype)
    if via is not None:
        return t.view(via[0]).numpy().view(via[1])
    return t.numpy()


def from_numpy(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A torch tensor on ``device`` over ``a``'s memory (``neuron``: adopted and accounted by the allocator)."""
    a = np.ascontiguousarray(a)
    via = _FROM_NUMPY.get(a.dtype)
    if via is not None:
        int_dtype, torch_dtype = via
        t = torch.from_numpy(a.view(np.int16 if int_dtype is torch.int16 else np.uint8)).view(torch_dtype)
    else:
        t = torch.from_numpy(a)
    if device.type == "neuron":
        return services.adopt_tracked(t, device.index if device.index is not None else 0)
    return t


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t)


_NUMPY = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16, torch.int8: np.int8,
          torch.int16: np.int16, torch.int32: np.int32, torch.int64: np.int64, torch.uint8: np.uint8,
          torch.bool: np.bool_}


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    via = _VIA_INT.get(dtype)
    if via is not None:
        return via[1]
    if dtype not in _NUMPY:
        raise TypeError(f"NKI kernels do not take {dtype} tensors")
    return np.dtype(_NUMPY[dtype])


def _torch_dtype(np_dtype: np.dtype) -> torch.dtype:
    via = _FROM_NUMPY.get(np.dtype(np_dtype))
    if via is not None:
        return via[1]
    return torch.from_numpy(np.zeros(0, dtype=np_dtype)).dtype


@dataclass(frozen=True)
class KernelLaunch:
    """One simulated launch as the device saw it: kernel name, argument signature, simulated latency."""

    name: str
    signature: tuple
    latency_ns: float
    cost: Any  # nki.CostReport


class _Log(threading.local):
    def __init__(self) -> None:
        self.stack: list[list[KernelLaunch]] = []
        self.dry = False


_log = _Log()
KERNEL_LOG_SIZE = 10_000  # launches kept by `kernel_log`: a long eager run must not grow the log without bound
_all_launches: collections.deque[KernelLaunch] = collections.deque(maxlen=KERNEL_LOG_SIZE)
_shape_cache: dict[tuple, Any] = {}


def kernel_log() -> list[KernelLaunch]:
    """The last `KERNEL_LOG_SIZE` NKI launches on torch tensors in this process, oldest first (the simulated cost of
    each). `record_launches` collects every launch of a block, however many."""
    return list(_all_launches)


@contextlib.contextmanager
def record_launches() -> Iterator[list[KernelLaunch]]:
    """Collect the NKI launches made in this thread inside the block (e.g. one model forward)."""
    launches: list[KernelLaunch] = []
    _log.stack.append(launches)
    try:
        yield launches
    finally:
        _log.stack.pop()


@contextlib.contextmanager
def dry_run() -> Iterator[list[KernelLaunch]]:
    """Collect the launches made in this thread inside the block, and only here: not in `kernel_log`, not in
    enclosing `record_launches` blocks, not charged to any device (a compile-time estimate on sample data)."""
    launches: list[KernelLaunch] = []
    saved = _log.stack, _log.dry
    _log.stack, _log.dry = [launches], True
    try:
        yield launches
    finally:
        _log.stack, _log.dry = saved


def tensors_in(values: Any) -> list[torch.Tensor]:
    """The torch tensors in nested tuples, lists and dicts (a call's arguments), in order (walked by `map_nested`;
    Dynamo traces it inside a compiled `nki_op` call)."""
    found: list[torch.Tensor] = []
    map_nested(values, lambda v: found.append(v) if isinstance(v, torch.Tensor) else None)
    return found


def _key(v: Any) -> Any:
    """`signature`'s key of one value."""
    if type(v) is torch.Tensor:  # a real tensor (every eager call): its sizes and strides are ints already
        return ("T", tuple(v.shape), v.stride(), v.dtype)
    if isinstance(v, torch.Tensor):  # a fake or traced one: symbolic sizes become the ints they stand for
        return ("T", tuple(int(s) for s in v.shape), tuple(int(s) for s in v.stride()), v.dtype)
    if isinstance(v, (list, tuple)):
        return tuple([_key(x) for x in v])
    if isinstance(v, (int, float, bool, str, type(None))):
        return v
    return type(v).__name__


def signature(args: tuple, kwargs: dict) -> tuple:
    """A hashable key of a call: tensors by shape, strides and dtype; other values as they are."""
    return _key(args), tuple(sorted((k, _key(v)) for k, v in kwargs.items()))


def _device_of(tensors: list[torch.Tensor]) -> torch.device:
    devices = {(t.device.type, t.device.index) for t in tensors}
    if len(devices) > 1:
        raise RuntimeError(f"an NKI kernel's tensor arguments must be on one device, got {sorted(map(str, devices))}")
    return tensors[0].device


def _bind(kernel: Kernel, grid: Any, device: torch.device) -> Kernel:
    """The kernel bound to its launch grid and, on a `neuron` device, to that device's target and logical-core
    size (the simulated machine's, e.g. trn1 under ``NEURON_SIM_INSTANCE_TYPE=trn1.32xlarge``), unless the kernel
    names its own target."""
    bound = kernel[grid] if grid != () else kernel
    if device.type != "neuron" or "target" in bound.options:
        return bound
    machine = services.topology()
    return Kernel(bound.fn, bound.grid, **{**bound.options, "target": machine.target, "lnc": machine.lnc})


@dataclass(frozen=True)
class _Spec:
    """Shape and dtype of a tensor (a fake argument or a simulated output)."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def _fake_outputs(kernel: Kernel, grid: Any, args: tuple, kwargs: dict, device: torch.device,
                  allow_writes: bool) -> Any:
    """Outputs of a launch on fake tensors: shapes/dtypes from one simulation on sample data (cached per
    signature), which also tells which tensor arguments the kernel writes."""
    def concrete(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return _Spec(tuple(int(s) for s in v.shape), v.dtype)  # a symbolic size is specialised (guarded) here
        return v

    key = (kernel.fn, repr(grid), map_nested(args, concrete), tuple(sorted((k, map_nested(v, concrete)) for k, v in kwargs.items())))
    found = _shape_cache.get(key)
    if found is None:
        rng = np.random.default_rng(0)
        inputs: list[np.ndarray] = []

        def sample(v: Any) -> Any:
            if not isinstance(v, _Spec):
                return v
            a = rng.standard_normal(v.shape).astype(_numpy_dtype(v.dtype))
            inputs.append(a)
            return a

        bound = _bind(kernel, grid, device)
        sampled_args = map_nested(key[2], sample)
        sampled_kwargs = {k: map_nested(v, sample) for k, v in key[3]}
        originals = [a.copy() for a in inputs]
        run = bound.run(*sampled_args, **sampled_kwargs)
        written = tuple(i for i, (a, o) in enumerate(zip(inputs, originals, strict=True))
                        if not np.array_equal(a, o, equal_nan=a.dtype.kind == "f"))
        spec = map_nested(run.outputs, lambda o: _Spec(o.shape, _torch_dtype(o.dtype)) if isinstance(o, np.ndarray) else o)
        found = _shape_cache[key] = (spec, written)
    spec, written = found
    if written and not allow_writes:
        raise RuntimeError(f"NKI kernel {getattr(kernel.fn, '__name__', kernel)} writes its tensor argument(s) "
                           f"{list(written)}; wrap_nki supports kernels that return their outputs. Call it from an "
                           "nki_op declaring mutates_args instead")
    return map_nested(spec, lambda s: torch.empty(s.shape, dtype=s.dtype, device=device) if isinstance(s, _Spec) else s)


def launch(kernel: Kernel, grid: Any, args: tuple, kwargs: dict, *, name: str | None = None,
           allow_writes: bool = True) -> Any:
    """Run ``kernel[grid](*args, **kwargs)`` on torch tensors (the framework runner registered with nki).

    ``allow_writes=False`` (a functional graph node) makes tracing reject a kernel that writes its arguments."""
    tensors = tensors_in((args, kwargs))
    device = _device_of(tensors)
    if any(_is_fake(t) for t in tensors):
        return _fake_outputs(kernel, grid, args, kwargs, device, allow_writes)

    def conv(v: Any) -> Any:
        return to_numpy(v) if isinstance(v, torch.Tensor) else v

    bound = _bind(kernel, grid, device)
    run = bound.run(*map_nested(args, conv), **{k: map_nested(v, conv) for k, v in kwargs.items()})
    kname = name or f"nki::{getattr(kernel.fn, '__name__', 'kernel')}"
    record_launch(KernelLaunch(kname, (repr(grid), signature(args, kwargs)), run.cost.latency_ns, run.cost), device)
    return map_nested(run.outputs, lambda o: from_numpy(o, device) if isinstance(o, np.ndarray) else o)


def record_launch(record: KernelLaunch, device: torch.device) -> None:
    """Log one launch and, on a ``neuron`` device, charge its simulated latency to the current stream.

    Also how a launch whose cost is already known is replayed without simulating it again (``native``)."""
    for launches in _log.stack:
        launches.append(record)
    if _log.dry:
        return
    _all_launches.append(record)
    if device.type == "neuron":
        index = device.index if device.index is not None else 0
        services.record_kernel(record.name, index, record.signature, record.latency_ns * 1e-9)
