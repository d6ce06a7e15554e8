"""The op ledger: what the chip would do with each op (native kernel or CPU fallback), kernels compiled, device time
charged.

Every op still computes on the host (results never depend on this module). What it decides is what TorchNeuron on a
real Trainium would do:

* **Native ops** have a Neuron kernel: an engine and a cost (`NATIVE`, plus every op tagged `pointwise` or
  `reduction`, and metadata-only views). They are recorded as executed (`get_executed_ops`), compiled once per
  signature (op, input shapes and dtypes, non-tensor arguments: the real device compiles one kernel per signature)
  and charged their `costmodel` estimate on the current stream of their device.
* **Every other op is a CPU fallback**, as on the device: it warns once per op with TorchNeuron's text
  ``Operator 'aten::X' fell back to CPU``, is recorded (`get_fallback_ops`) and is charged the device->host copy of
  its inputs and the host->device copy of its outputs. Random-number ops fall back (reported for TorchNeuron's eager
  mode), as do ops with data-dependent output shapes. With ``NEURON_FALLBACK_ENABLED=0`` (TorchNeuron's variable) a
  fallback raises instead, to test that a workload runs natively.

Which engine runs an op, and its work, is the op catalogue's (`ops.catalogue`); the fallback policy is
`fallback.admit`. This module keeps the books: `charge` per op, `record_kernel` for kernels that do not run through
the fallback (NKI kernels, compiled graphs), `transfer` for host<->device copies, `compilation_stats`.

The per-op work is a tuple of shapes and dtypes per call and one lookup of it in the cache the op's record keeps
(`ops.call.OverloadRecord.charges`); a call of shapes not seen since the last clear estimates, or finds, its kernel.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from .. import compile_time as _compile_time
from .. import numerics as _numerics
from .. import timeline as _timeline
from .. import topology as _topology
from ..barrier import flush_barrier
from ..ops import catalogue as _catalogue
from ..ops.catalogue import OpInfo
from . import costmodel as _costmodel

if TYPE_CHECKING:  # the record's module is above the ledger: the ledger only keeps its cache in it
    from ..ops.call import OverloadRecord

__all__ = [
    "Launch",
    "Tracking",
    "Work",
    "charge",
    "clear_compilation_cache",
    "clear_compilation_counters",
    "clear_op_tracking",
    "compilation_stats",
    "count_call",
    "executed_ops",
    "flat_tensors",
    "get_executed_ops",
    "get_fallback_ops",
    "launches",
    "mark_executed",
    "op_work",
    "peek",
    "record_fallback",
    "record_kernel",
    "signature",
    "transfer",
]

_NEURON = "neuron"

executed_ops: Counter[str] = Counter()  # op name -> calls on `neuron` (every path, fallbacks too), for tests and tools
_executed: set[str] = set()
_fallbacks: set[str] = set()
_kernels: dict[tuple, float] = {}  # signature of a compiled native kernel -> its estimated device seconds
_seconds: dict[tuple, float] = {}  # the same for signatures that compile nothing (fallbacks, device copies)
_compilations: Counter[str] = Counter()  # op name -> kernels compiled (distinct signatures)
_cache_hits = 0


_TENSOR_TYPE = torch.Tensor
_SCALAR_TYPES = frozenset({bool, int, float, str, type(None), torch.dtype, torch.device, torch.layout,
                           torch.memory_format})


def signature(values: Iterable[Any]) -> tuple:
    """A hashable key of arguments: shape and dtype of tensors, values of scalars, the type of anything else (the
    kernel signature `charge` keys its cache on; `record_kernel` callers key theirs the same way).

    Hot path (every op): exact type checks first, recursion only for lists.
    """
    key = []
    append = key.append
    for value in values:
        kind = type(value)
        if kind is _TENSOR_TYPE:
            append((value.shape, value.dtype))
        elif kind in _SCALAR_TYPES:
            append(value)
        elif kind is tuple or kind is list:
            append(signature(value))
        elif isinstance(value, _TENSOR_TYPE):
            append((value.shape, value.dtype))
        else:
            append(kind.__name__)
    return tuple(key)


def flat_tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in `value` (a tensor or nested lists and tuples of them), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in flat_tensors(item)]
    return []


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclasses.dataclass(frozen=True)
class Work:
    """What one call of a signature does, kept so the run can be re-estimated on another target: work per engine
    and HBM bytes of a kernel (`costmodel.estimate_kernel`), or the host-link copies of a fallback."""

    engines: tuple[tuple[str, float], ...] = ()
    hbm_bytes: int = 0
    dtype: torch.dtype = torch.float32
    host_copies: tuple[int, ...] = ()  # bytes of each host<->device copy; non-empty means no kernel runs

    def seconds(self, target: _topology.Target) -> float:
        """Device seconds of one call on `target`."""
        if self.host_copies:
            return sum(_costmodel.transfer_seconds(nbytes, target) for nbytes in self.host_copies)
        return _costmodel.estimate_kernel(dict(self.engines), self.hbm_bytes, dtype=self.dtype, target=target).seconds


class Launch:
    """Calls of one signature since the last `clear_op_tracking()`: its op name, seconds per call on the simulated
    target, and its `Work` (None for kernels recorded with their time only, e.g. NKI kernels)."""

    __slots__ = ("calls", "name", "seconds", "work")

    def __init__(self, name: str, seconds: float, work: Work | None) -> None:
        self.name, self.seconds, self.work, self.calls = name, seconds, work, 0


_launches: dict[tuple, Launch] = {}
_works: dict[tuple, Work] = {}  # signature -> its work, beside the cached seconds in `_kernels` / `_seconds`
# `charge`'s one lookup for a call whose shapes it has seen since the last clear of either: the overload's record
# keeps, by the call's key (`_call_key`), its Launch, cached seconds and breakdown part (`OverloadRecord.charges`).
# Both clears empty every such cache (`_charging` lists the ones filled), so a hit means the kernel is cached, the
# op is recorded as executed and the Launch is live.
_charging: list[dict[tuple, tuple[Launch, float, str]]] = []
_parts: dict[tuple, str] = {}  # a recorded kernel's signature -> its breakdown part


def _launch(key: tuple, name: str, seconds: float) -> None:
    """Count one call of signature `key`."""
    entry = _launches.get(key)
    if entry is None:
        entry = _launches[key] = Launch(name, seconds, _works.get(key))
    entry.calls += 1


def _settle() -> None:
    """Ops queued by adaptive eager execute, and are accounted, before the tracking is read."""
    flush_barrier()


def launches() -> list[Launch]:
    """Every signature charged to a device since the last `clear_op_tracking()`, with its call count."""
    _settle()
    return list(_launches.values())


def op_work(info: OpInfo, args: tuple, kwargs: dict, result: Any) -> Work:
    """What one call of `info`'s op with these host arguments and result does (`charge` computes it once per
    signature; adaptive eager once per queued signature)."""
    outputs = flat_tensors(result)
    # an out= tensor is written, not read: it counts once, as an output
    inputs = flat_tensors(args) + [t for t in flat_tensors(list(kwargs.values())) if all(t is not o for o in outputs)]
    if info.engine is None:
        return Work(host_copies=(_nbytes(inputs), _nbytes(outputs)))
    first = outputs[0] if outputs else None
    dtype = inputs[0].dtype if inputs else (first.dtype if first is not None else torch.float32)
    if info.scatter_base is not None and result is args[0]:
        # a scatter into its first argument's buffer (`index_copy_`, run as `index_copy.out` into itself), as a
        # static KV cache's update: the other inputs in, the written region out, the rest of the buffer untouched
        region = _catalogue.scattered_elements(info.scatter_base, args)
        if region is not None:
            moved = [t for t in inputs if t is not args[0]]
            return Work(((info.engine, float(region)),), _nbytes(moved) + region * args[0].element_size(), dtype)
    out_elements = sum(t.numel() for t in outputs)
    if info.engine == "tensor":
        amount = info.flops(args, first)
    elif info.engine == "vector":
        amount = max(sum(t.numel() for t in inputs), out_elements)
    else:
        amount = out_elements or max((t.numel() for t in inputs), default=0)
    read = _nbytes(inputs)
    if info.gathers and inputs and inputs[0] is args[0]:  # the table's selected rows, at most the whole table once
        read += min(0, _nbytes(outputs) - _nbytes(inputs[:1]))
    return Work(((info.engine, amount),), read + _nbytes(outputs), dtype)


def _seconds_of(info: OpInfo, key: tuple, args: tuple, kwargs: dict, result: Any) -> float:
    """Device seconds of a signature `charge` has not seen since the last clear: cached, or estimated now (for a
    native op, a compilation)."""
    global _cache_hits
    if info.engine is None:
        seconds = _seconds.get(key)
        if seconds is None:
            work = _works[key] = op_work(info, args, kwargs, result)
            seconds = _seconds[key] = work.seconds(_topology.topology().target)
        return seconds
    _executed.add(info.name)
    seconds = _kernels.get(key)
    if seconds is None:
        work = _works[key] = op_work(info, args, kwargs, result)
        seconds = _kernels[key] = work.seconds(_topology.topology().target)
        _compilations[info.name] += 1
    else:
        _cache_hits += 1
    return seconds


_KWARGS = object()  # opens the cache key of a call with keyword arguments: no `signature` starts with it


def _kernel_key(record: OverloadRecord, args: tuple, kwargs: dict, result: Any) -> tuple:
    """The signature of the kernel a call of `record`'s op runs, in the ledger's books: the op, the arguments'
    `signature`, and what else its estimate depends on."""
    info = record.info
    key = (info.name, signature(args), (tuple(kwargs), signature(kwargs.values())) if kwargs else None)
    rounding = _fp32_rounding(args) if info.engine == "tensor" else None
    if rounding is not None:
        key += (rounding,)  # the Tensor engine rate of fp32 depends on it
    elif info.scatter_base is not None:
        key += (result is args[0],)  # into its first argument's buffer, or a new tensor (`op_work`)
    return key


def _fp32_rounding(args: tuple) -> bool | None:
    """For a Tensor engine call whose first argument is float32, whether float32 matmuls round their operands to
    bfloat16 (its rate depends on it); None for any other call."""
    if args and isinstance(args[0], torch.Tensor) and args[0].dtype == torch.float32:
        return _numerics.fp32_matmul_rounds_to_bf16()
    return None


def charge(record: OverloadRecord, index: int, args: tuple, kwargs: dict, result: Any) -> None:
    """Account one executed call of `record`'s op (`ops.call`) on device `index` (host arguments and result); at
    compile time (`compile_time`), nothing."""
    global _cache_hits
    if _compile_time.now():
        return
    info = record.info
    engine = info.engine
    if record.keyed_by_arguments or record.keyed_by_precision:  # the call's key in the record's cache: its
        # arguments' shapes, as cheap as can be (and a Tensor engine op's float32 matmul precision)
        key = signature(args) if not kwargs else (_KWARGS, signature(args), tuple(kwargs),
                                                  signature(kwargs.values()))
        if record.keyed_by_precision:
            key = (key, _fp32_rounding(args))
    elif engine == "view":
        _executed.add(info.name)
        return
    else:  # a key that also depends on the result (a scatter): the kernel's whole signature
        key = _kernel_key(record, args, kwargs, result)
    charged = record.charges.get(key)
    if charged is None:
        charged = _first_charge(record, key, args, kwargs, result)
    else:  # the common call: one lookup
        charged[0].calls += 1
        if engine is not None:
            _cache_hits += 1
    end = _timeline.charge(index, charged[1], info.name, charged[2])
    if engine is None:
        _timeline.timeline(index).host_wait(end)  # the host ran the op: it waited for its inputs and outputs


def _first_charge(record: OverloadRecord, key: tuple, args: tuple, kwargs: dict,
                  result: Any) -> tuple[Launch, float, str]:
    """`charge` of a call whose key its record has not cached since the last clear: the kernel's seconds (cached, or
    estimated now), its launch counted, and the entry cached."""
    info = record.info
    name = info.name
    key_of_kernel = (_kernel_key(record, args, kwargs, result)
                     if record.keyed_by_arguments or record.keyed_by_precision else key)
    seconds = _seconds_of(info, key_of_kernel, args, kwargs, result)
    _launch(key_of_kernel, name, seconds)
    charges = record.charges
    if not charges:
        _charging.append(charges)
    charged = charges[key] = (_launches[key_of_kernel], seconds, _catalogue.breakdown_part(name, info.engine))
    return charged


def record_kernel(name: str, index: int, signature: Hashable, seconds: float, work: Work | None = None) -> None:
    """Account one launch of a kernel that does not run through the fallback: an NKI kernel, a compiled graph.

    `signature` identifies the compiled kernel (its first launch counts as a compilation, later ones as cache hits);
    `seconds` is its device time, e.g. from `costmodel.estimate_kernel`, charged on the current stream of `index`;
    `work`, when given, lets a report re-estimate it on another target. At compile time (`compile_time`), nothing.
    """
    global _cache_hits
    if seconds < 0:
        raise ValueError(f"a kernel's device time must be non-negative, got {seconds}")
    if _compile_time.now():
        return
    _executed.add(name)
    key = (name, signature)
    if key in _kernels:
        _cache_hits += 1
    else:
        _kernels[key] = seconds
        _compilations[name] += 1
        if work is not None:
            _works[key] = work
    _launch(key, name, seconds)
    part = _parts.get(key)
    if part is None:
        part = _parts[key] = _catalogue.breakdown_part(name, _busiest_engine(work))
    _timeline.charge(index, seconds, name, part)


def _busiest_engine(work: Work | None) -> str:
    """The engine a recorded kernel spends the most time on ("other" when its work is not given)."""
    if work is None or not work.engines:
        return "other"
    estimate = _costmodel.estimate_kernel(dict(work.engines), work.hbm_bytes, dtype=work.dtype,
                                          target=_topology.topology().target)
    return max(estimate.engine_seconds, key=estimate.engine_seconds.get)


def transfer(name: str, src: torch.Tensor, dst: torch.Tensor, device: torch.device | None = None) -> None:
    """Account a copy from `src` to `dst`, either of which may be on the host (a DMA on the device's timeline).

    `device` is where `dst` ends up when `dst` is still its host form (default: `dst.device`). Host->device copies
    are queued on the current stream; a device->host copy makes the host wait for the stream (as a CUDA copy to
    pageable memory does), so `.cpu()` and `.item()` are synchronisation points. At compile time (`compile_time`),
    nothing.
    """
    if _compile_time.now():
        return
    _executed.add(name)
    nbytes = dst.numel() * dst.element_size()
    device = dst.device if device is None else device
    src_on_device = src.device.type == _NEURON
    if src_on_device and device.type == _NEURON:
        key = (name, nbytes)
        seconds = _seconds.get(key)
        if seconds is None:
            work = _works[key] = Work(hbm_bytes=2 * nbytes)
            seconds = _seconds[key] = work.seconds(_topology.topology().target)
        _launch(key, name, seconds)
        _timeline.charge(device.index, seconds, name, "data_movement")
    elif src_on_device or device.type == _NEURON:
        direction = "device->host" if src_on_device else "host->device"
        index = src.device.index if src_on_device else device.index
        key = (name, direction, nbytes)
        seconds = _seconds.get(key)
        if seconds is None:
            work = _works[key] = Work(host_copies=(nbytes,))
            seconds = _seconds[key] = work.seconds(_topology.topology().target)
        _launch(key, f"{name} ({direction})", seconds)
        end = _timeline.charge(index, seconds, f"{name} ({direction})", "host_transfers")
        if src_on_device:
            _timeline.timeline(index).host_wait(end)


def count_call(name: str) -> None:
    """Count one call of op `name` on `neuron` (`executed_ops`), whichever path runs it; at compile time
    (`compile_time`), nothing: the compiler's ops are not the program's."""
    if not _compile_time.now():
        executed_ops[name] += 1


def mark_executed(names: Iterable[str]) -> None:
    """Record ops as executed on the device whose time is charged elsewhere (inside one fused kernel); at compile
    time (`compile_time`), nothing."""
    if not _compile_time.now():
        _executed.update(names)


def record_fallback(name: str) -> bool:
    """Record op `name` as a CPU fallback; True the first time since the last `clear_op_tracking()` (it warns then)."""
    if name in _fallbacks:
        return False
    _fallbacks.add(name)
    return True


class Tracking(NamedTuple):
    """The ledger as it stands, read without flushing queued ops (`peek`)."""

    launches: list[Launch]
    fallback_ops: frozenset[str]
    kernels_compiled: int


def peek() -> Tracking:
    """The launches, fallback ops and kernels compiled so far, without running what adaptive eager queued: for a
    reader on another thread (the live statistics), which must not execute ops."""
    return Tracking(list(_launches.values()), frozenset(_fallbacks), sum(_compilations.values()))


def get_fallback_ops() -> list[str]:
    """Names of the ops that fell back to CPU since the last `clear_op_tracking()`, sorted."""
    _settle()
    return sorted(_fallbacks)


def get_executed_ops() -> list[str]:
    """Names of the ops that executed on the Neuron device (native kernels) since the last clear, sorted."""
    _settle()
    return sorted(_executed)


def _forget_charges() -> None:
    """Empty every record's cache of charges (`charge`)."""
    for charges in _charging:
        charges.clear()
    _charging.clear()


def clear_op_tracking() -> None:
    """Forget executed and fallback ops; a fallback warns again the next time it runs."""
    _settle()
    _executed.clear()
    _fallbacks.clear()
    _launches.clear()
    _forget_charges()


def clear_compilation_counters() -> None:
    """Reset the compilation and cache-hit counters; compiled kernels stay cached (a signature seen before hits)."""
    global _cache_hits
    _settle()
    _compilations.clear()
    _cache_hits = 0


def clear_compilation_cache() -> None:
    """Forget every compiled kernel (and its cost estimate) and reset the counters: every signature compiles again."""
    _settle()
    _kernels.clear()
    _seconds.clear()
    _works.clear()
    _forget_charges()
    _parts.clear()
    clear_compilation_counters()


def compilation_stats() -> dict[str, Any]:
    """Kernel-cache counters, named as TorchNeuron's compilation-cache statistics, plus compilations per op."""
    _settle()
    compilations = sum(_compilations.values())
    return {
        "total_compilations": compilations,
        "in_memory_hits": _cache_hits,
        "in_memory_misses": compilations,
        "total_entries": len(_kernels),
        "hit_rate": _cache_hits / (_cache_hits + compilations) if _cache_hits + compilations else 0.0,
        "compilations_per_op": dict(_compilations),
    }
