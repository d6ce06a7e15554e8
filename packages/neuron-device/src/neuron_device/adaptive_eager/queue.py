"""Adaptive eager (TorchNeuron's "concatenation"): queue fusable eager ops, run each queued run as one kernel.

Why: an eager op on `neuron` pays a fixed host cost (aliasing its inputs, adopting its result, charging it) on top of
its CPU kernel, and the chip pays a launch and an HBM round trip per op. TorchNeuron's answer is to queue eager ops
while the program does not look at their values and to fuse what it queued. Ours, opt-in with
``TORCH_NEURONX_ENABLE_CONCATENATION=1`` (read when the device registers; `set_enabled` toggles it at run time):

* **Record.** A fusable op (a functional, non-random overload of the fast path, `ops/fastpath.py`, on tensors of
  one `neuron` device) is not executed: its result comes back at once, with the sizes, strides and dtype a meta
  run of the op's signature on zeros gave (one CPU run per signature, cached), on device storage that the allocator
  accounts as usual but that is not written yet (host memory a flushed result of the signature no longer needs, when
  there is some, and no host twin until the flush writes it: `storage.adopt_untwinned`). In-place and `out=` ops,
  random ops, ops whose results or errors depend on index values, and anything outside the fast path's common call
  run as usual, after a flush.
* **Flush.** The queue runs, in order, before anything reads device memory on the host: every such read goes
  through `storage.host_alias`, which calls `flush` while ops are queued (so `print`, `.item()`, `.cpu()`,
  `.tolist()`, a non-fusable op, an in-place op on a queued op's input, a collective all flush), and so does a
  storage resize (FSDP2 frees and re-allocates its parameters' storages that way). Stream, event and
  synchronize calls flush through `timeline.timeline`; the queue flushes itself at its size limit, when an op
  targets another device, and when deterministic algorithms are switched on (`torch.use_deterministic_algorithms`
  disables recording).
* **Execute adaptively.** A flushed run is keyed by its structure (ops, signatures, how results feed ops, which
  results are still referenced). The first time, it runs op by op on host aliases: the same ATen CPU kernels as
  plain eager, so results are bitwise identical, and each op is charged as in eager. From the second time, the run
  is handed, as an FX graph of CPU ops, to the `neuron_fuse` plugin hook (neuron-compile runs the graph itself, or
  compiles it with Inductor under `NEURON_COMPILE_HOST_CODE=inductor`); its callable then runs the whole run and the timeline is charged one fused kernel, whose HBM
  traffic is only the run's inputs and its live outputs. Results nobody references any more are never written.

Errors a kernel raises only when it reads values (integer division by zero) surface at the flush, as asynchronous
device errors do on an accelerator. Writes into device memory that bypass `host_alias` (DLPack export of a
`neuron` tensor, raw `data_ptr` access) do not flush: call `flush()` first.
"""

from __future__ import annotations

import functools
import itertools
import operator
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from .. import allocator, envvars, plugins
from .. import barrier as _barrier
from .. import numerics as _numerics
from .. import storage as _storage
from .. import topology as _topology
from ..ops import fastpath as _fastpath
from ..ops import host_numerics as _host_numerics
from ..ops.call import OverloadRecord, walk
from ..ops.catalogue import OpInfo
from ..simulation import ledger as _ledger

__all__ = [
    "BUFFER_SIZE_ENV",
    "ENABLE_ENV",
    "FUSED_KERNEL_NAME",
    "FUSE_AFTER",
    "LOW_THRESHOLD_ENV",
    "flush",
    "install",
    "is_enabled",
    "pending_ops",
    "record",
    "set_enabled",
    "stats",
]

ENABLE_ENV = envvars.ADAPTIVE_EAGER.name
BUFFER_SIZE_ENV = envvars.ADAPTIVE_EAGER_BUFFER_SIZE.name
LOW_THRESHOLD_ENV = envvars.ADAPTIVE_EAGER_LOW_THRESHOLD.name
FUSED_KERNEL_NAME = "neuron::concatenated_kernel"

FUSE_AFTER = 2  # a run is compiled the second time its structure is seen
_ADOPT_BYTES = 64 << 10  # a live output at least this large takes its result's memory instead of a copy of it
_MAX_RUNS = 4096  # structures remembered; beyond this the table starts over (a workload whose runs never repeat)

# Their CPU kernels check index values (an out-of-range index raises): they run at once, so the error does too.
_READS_INDEX_VALUES = frozenset({
    "index", "index_select", "gather", "embedding", "embedding_dense_backward", "nll_loss_forward",
    "nll_loss_backward",
})


enabled: bool = envvars.read_at_import(envvars.ADAPTIVE_EAGER)  # `record` wraps the fast path while on
buffer_size_limit: int = envvars.read_at_import(envvars.ADAPTIVE_EAGER_BUFFER_SIZE)  # ops queued before the queue flushes itself
low_threshold: int = envvars.read_at_import(envvars.ADAPTIVE_EAGER_LOW_THRESHOLD)  # shorter runs always execute op by op


class _External(NamedTuple):
    """A tensor argument from outside the run: the run's input number `index`."""

    index: int


class _Queued(NamedTuple):
    """A tensor argument that is output `output` of queued op `entry`, or a view of it: (sizes, strides, offset)."""

    entry: int
    output: int
    view: tuple | None


class _Spec(NamedTuple):
    """What the probe run of one signature told: each output's (sizes, strides, dtype), and the op's work."""

    outputs: tuple[tuple[tuple[int, ...], tuple[int, ...], torch.dtype], ...]
    single: bool  # the op returns one tensor (else a tuple)
    work: _ledger.Work
    spares: tuple[list[torch.Tensor], ...]  # per output: host buffers of flushed results, free to reuse (`_spare`)


class _Entry:
    """One queued op: what to call, its arguments (tensors replaced by `_External`/`_Queued`), its outputs, and
    its number (`_numbers`: equal numbers, equal op, signature and references to the run)."""

    __slots__ = ("args", "call", "kwargs", "number", "outputs", "record", "spec")

    def __init__(self, call, args, kwargs, record: OverloadRecord, spec, number: int) -> None:
        self.call, self.args, self.kwargs, self.record = call, args, kwargs, record
        self.spec, self.number = spec, number
        self.outputs: list[tuple[torch.Tensor, weakref.ref | None]] = []  # (host buffer, ref to device storage)


class _NotNow(Exception):
    """`_argument`'s verdict on an argument the run cannot refer to: the op runs now, after a flush if `flush`."""

    def __init__(self, flush: bool) -> None:
        super().__init__()
        self.flush = flush


# `_Queued(...)` without the Python frame of a named tuple's `__new__`: one per queued tensor argument
_queued_reference = functools.partial(tuple.__new__, _Queued)


class _Input(NamedTuple):
    """An external tensor as it was when first recorded (its metadata may change in place before the flush)."""

    tensor: torch.Tensor
    storage: torch.UntypedStorage
    size: torch.Size
    stride: tuple[int, ...]
    offset: int

    def same(self, tensor: torch.Tensor, storage: torch.UntypedStorage, size: torch.Size, stride: tuple) -> bool:
        return (storage is self.storage and size == self.size and stride == self.stride
                and tensor.storage_offset() == self.offset)

    def host(self) -> torch.Tensor:
        """The host form the flush's kernels read (queued ops only read their inputs: `storage.kernel_input`, the
        host twin itself for a tensor laid out as it; the flush runs inside the barrier, so none is passed here)."""
        tensor = self.tensor
        if not self.same(tensor, tensor.untyped_storage(), tensor.shape, tensor.stride()):
            # e.g. `x.unsqueeze_(0)` after x was queued: read x as the op saw it
            tensor = torch.empty(0, dtype=tensor.dtype, device=tensor.device).set_(
                self.storage, self.offset, self.size, self.stride)
        return _storage.kernel_input(tensor)


class _Run:
    """What is known about one run structure: times seen, and its compiled form once fused."""

    __slots__ = ("compiled", "names", "number", "seconds", "seen", "tried", "work")

    def __init__(self, number: int) -> None:
        self.number = number
        self.seen = 0
        self.tried = False
        self.compiled: Callable | None = None
        self.seconds = 0.0
        self.work: _ledger.Work | None = None
        self.names: frozenset[str] = frozenset()


_lock = threading.RLock()
_queue: list[_Entry] = []
_inputs: list[_Input] = []
_input_ids: dict[int, int] = {}  # id(tensor) -> input number, for the tensors in `_inputs`
_externals: list[_External] = []  # _External(n) for every input number used so far (made once)
_queued: dict[int, tuple] = {}  # id of a queued output's storage -> (storage ref, entry, output, spec)
_device = -1
_specs: dict[tuple, _Spec | None] = {}  # op signature -> its spec, None if it cannot be queued
# op signature with the references of its tensor arguments (`_record`'s key) -> (its spec, its number): one lookup
# per queued op, and the run's structure is a tuple of numbers (never reused: `_runs` may outlive this table)
_numbers: dict[tuple, tuple[_Spec | None, int]] = {}
_next_number = itertools.count()
_parts: list = []  # the key `_record` builds: `_argument` appends each tensor argument's sizes, strides and dtype
_NO, _YES, _MATMUL = 0, 1, 2
_kinds: dict[OverloadRecord, int] = {}  # -> _NO, _YES or _MATMUL (`_kind`)
_runs: dict[tuple, _Run] = {}
_counters = dict.fromkeys(("recorded", "flushes", "op_by_op_runs", "fused_runs", "compiled", "fuse_failures"), 0)

aten = torch.ops.aten
_AUTOCAST_CPU = torch._C.DispatchKey.AutocastCPU
_CPU_AUTOCAST = torch._C.DispatchKeySet(_AUTOCAST_CPU)
_autocast_excluded = torch._C._dispatch_tls_is_dispatch_key_excluded
_Tensor = torch.Tensor
_matmul_precision = torch._C._get_fp32_precision_getter
_deterministic = torch._C._get_deterministic_algorithms  # `torch.are_deterministic_algorithms_enabled`, minus a frame
_IEEE = ("none", "ieee")
_PROBE_BYTES = 16 << 20  # inputs larger than this are not queued: learning their op's layout would copy them
_SPARE_BYTES = 64 << 20  # host buffers of flushed results kept for the next queued results of their signatures
_spare_bytes = 0


def is_enabled() -> bool:
    """Whether eager ops are being queued (adaptive eager)."""
    return enabled


def set_enabled(flag: bool) -> bool:
    """Switch adaptive eager on or off at run time (switching off flushes the queue); return the previous state."""
    global enabled
    previous = enabled
    if not flag:
        flush()
    enabled = bool(flag)
    _fastpath.set_recorder(record if enabled else None)
    return previous


def install() -> None:
    """At registration: with `TORCH_NEURONX_ENABLE_CONCATENATION=1` the fast path's calls go through `record`."""
    _fastpath.set_recorder(record if enabled else None)


def pending_ops() -> int:
    """Number of ops queued and not yet executed."""
    return len(_queue)


def stats() -> dict[str, int]:
    """Counters since start-up: ops recorded, flushes, runs executed op by op / fused, runs compiled, failures."""
    return dict(_counters)


def _kind(overload: OverloadRecord) -> int:
    """`_NO` unless a functional overload (fresh results, no input written) whose CPU kernel does not check index
    values; `_MATMUL` for an op whose CPU kernel follows the host's float32 matmul precision."""
    schema = overload.op._schema
    name = schema.name.partition("::")[2]
    if any(a.alias_info is not None for a in schema.arguments) or name in _READS_INDEX_VALUES:
        kind = _NO
    else:
        kind = _MATMUL if overload.info.engine == "tensor" or "attention" in name else _YES
    _kinds[overload] = kind
    return kind


def _key(value: Any) -> Any:
    """A hashable form of a non-tensor argument that tells apart what the op tells apart: lists become tuples, a
    float its bits (-0.0 is not 0.0, and a NaN equals itself: a compiled run bakes its numbers in), a bool is not
    the int it equals (`x + True` keeps a bool tensor's dtype, `x + 1` does not)."""
    kind = type(value)
    if kind is float:
        return (float, value.hex())
    if kind is list or kind is tuple:
        return tuple(_key(v) for v in value)
    if kind is bool:
        return (bool, value)
    if kind is complex:
        return (complex, value.real.hex(), value.imag.hex())
    return value


def _unreferenced(value: Any) -> Any:
    """`value` (part of `_record`'s key) with its references to the run blanked: what the op's spec depends on."""
    kind = type(value)
    if kind is _External or kind is _Queued:
        return None
    if kind is tuple:
        return tuple(_unreferenced(v) for v in value)
    return value


def _probe(value: Any) -> Any:
    """A zero-filled CPU tensor with `value`'s sizes, strides and dtype (lists and tuples element by element)."""
    if isinstance(value, _Tensor):
        shape, stride = value.shape, value.stride()
        return torch.zeros(allocator._extent(shape, stride, 1), dtype=value.dtype).as_strided(shape, stride)
    if type(value) is list or type(value) is tuple:
        return type(value)(_probe(v) for v in value)
    return value


def _spec(signature: tuple, call: torch._ops.OpOverload, info: OpInfo, args: tuple,
          kwargs: dict) -> _Spec | None:
    """Run `call` once, with its CPU kernel, on zeros laid out like `args`: the outputs' metadata and the op's
    work, or None (the op is then never queued). The CPU kernel, not the op's meta function: what plain eager
    returns is what a queued result must look like, and meta functions do not always agree with CPU kernels
    (`native_layer_norm`'s statistics are float32 for bfloat16 input on meta, bfloat16 on the CPU)."""
    spec = result = None
    if sum(t.nbytes for t in _ledger.flat_tensors(args)) <= _PROBE_BYTES:
        probes = _probe(args)
        try:
            with _HostContext():
                result = call(*probes, **kwargs)
        except Exception:  # torch raises it again, with the same message, when the op runs unqueued
            result = None
    single = isinstance(result, _Tensor)
    outputs = (result,) if single else result
    if type(outputs) is tuple and outputs and all(isinstance(t, _Tensor) for t in outputs):
        metadata = tuple((tuple(t.shape), t.stride(), t.dtype) for t in outputs)
        spec = _Spec(metadata, single, _ledger.op_work(info, probes, kwargs, result), tuple([] for _ in outputs))
    _specs[signature] = spec
    return spec


def _argument(value: _Tensor) -> _External | _Queued:
    """The run's reference to tensor argument `value`; its part of the op's signature (sizes, strides, dtype) goes
    to `_parts`. Raises `_NotNow` for a lazy conjugate or negative bit (the fast path handles those) and for a dtype
    view of a queued result (flush first: it is then an input)."""
    shape, stride, dtype = value.shape, value.stride(), value.dtype
    _parts.append((shape, stride, dtype))
    if dtype.is_complex and (value.is_conj() or value.is_neg()):  # the bits only complex tensors get
        raise _NotNow(False)
    storage = value.untyped_storage()  # one Python object per storage while it lives (its `__dict__` holds state)
    found = _queued.get(id(storage))
    if found is not None and found[0]() is storage:
        _, entry, output, metadata = found
        if dtype != metadata[2]:
            raise _NotNow(True)
        offset = value.storage_offset()
        if offset == 0 and shape == metadata[0] and stride == metadata[1]:
            return _queued_reference((entry, output, None))
        return _queued_reference((entry, output, (tuple(shape), stride, offset)))
    number = _input_ids.get(id(value))
    if number is None or not _inputs[number].same(value, storage, shape, stride):
        number = len(_inputs)
        _inputs.append(_Input(value, storage, shape, stride, value.storage_offset()))
        _input_ids[id(value)] = number
        if number == len(_externals):
            _externals.append(_External(number))
    return _externals[number]


def record(overload: OverloadRecord, args: tuple, kwargs: dict):
    """Queue one call of a fast-path op and return its not-yet-computed result; None if the op must run now.

    Installed in front of the fast path's direct call while adaptive eager is on (`set_enabled`,
    `fastpath.set_recorder`): called before it touches any data; the op runs now when this returns None.
    """
    kind = _kinds.get(overload, -1)
    if kind < 0:
        kind = _kind(overload)
    if not kind or _numerics.downcast_64bit:
        return None
    if kind == _MATMUL and _matmul_precision("mkldnn", "matmul") not in _IEEE:
        return None  # a flush computes float32 matmuls in IEEE float32, as eager does under the neuron numerics
    if _deterministic():
        flush()
        return None
    for value in kwargs.values():
        if isinstance(value, _Tensor):
            return None
    with _lock:
        known = len(_inputs)
        outcome = None
        try:
            outcome = _record(overload, args, kwargs)
            if outcome is False:  # an argument cannot refer to the queue as it is: flush, then it is an input
                _forget_inputs(known)  # what the attempt registered is no input of the run being flushed
                flush()
                known = 0
                outcome = _record(overload, args, kwargs)
        finally:
            if (outcome is None or outcome is False) and len(_inputs) > known:
                _forget_inputs(known)  # the op is not queued: what it registered must not stay alive
        return None if outcome is False else outcome


def _forget_inputs(known: int) -> None:
    for item in _inputs[known:]:
        _input_ids.pop(id(item.tensor), None)
    del _inputs[known:]


def _record(overload: OverloadRecord, args: tuple, kwargs: dict):
    """`record` under the lock: the result, None (run the op now), or False (flush, then try again)."""
    global _device, _spare_bytes
    _parts.clear()
    try:
        walked = walk(overload, args, _argument)  # the fast path's walk: tensors become references to the run
    except _NotNow as verdict:
        return False if verdict.flush else None
    if walked is None:
        return None
    template, index, host_call = walked
    if _queue and index != _device:
        return False
    # The key: `_argument`'s (sizes, strides, dtype) per tensor, then the arguments with tensors as references to
    # the run and numbers by their bits, the op by its C callable (an `OpOverload` hashes in Python), the kwargs.
    key = _parts
    for position, value in enumerate(template):
        kind = type(value)
        if kind is list or kind is tuple:
            if not value and position in overload.tensor_positions:
                return None
            value = _key(value)
        elif kind is float or kind is bool or kind is complex:
            value = _key(value)
        key.append(value)
    key.append(host_call)
    if kwargs:
        key.append(tuple([(k, _key(v)) for k, v in kwargs.items()]))
    key = tuple(key)
    call = overload.op if host_call is overload.call else overload.scalar_op
    known = _numbers.get(key)
    if known is None:
        known = _numbers[key] = (_spec_of(key, call, overload, args, kwargs), next(_next_number))
    spec, number = known
    if spec is None:
        return None
    position = len(_queue)
    entry = _Entry(call, template, kwargs, overload, spec, number)
    outputs = entry.outputs
    results = None if spec.single else []
    spares = spec.spares
    for output, metadata in enumerate(spec.outputs):
        size, stride, dtype = metadata
        spare = spares[output]
        if spare:
            host = spare.pop()
            _spare_bytes -= host.nbytes
        else:
            host = torch.empty_strided(size, stride, dtype=dtype)
        try:  # the flush gives the storage its host twin if it is still alive then (`_written`)
            result = allocator.track(_storage.adopt_untwinned(host, index), index)
        except allocator.OutOfMemoryError:
            if _queue:
                return False  # the queue holds inputs alive: flush it and try again
            raise
        storage = result.untyped_storage()
        if storage.nbytes():
            ref = weakref.ref(storage)
            _queued[id(storage)] = (ref, position, output, metadata)
        else:
            ref = None  # nothing to write
            _storage.give_twin(storage, host)
        outputs.append((host, ref))
        if results is not None:
            results.append(result)
    _queue.append(entry)
    _device = index
    _counters["recorded"] += 1
    _ledger.count_call(overload.name)
    if not position:  # the queue's first op: from now on the flush barrier runs it
        _barrier.set_pending(flush)
    if len(_queue) >= buffer_size_limit:
        flush()
    return result if results is None else tuple(results)


def _spec_of(key: tuple, call: torch._ops.OpOverload, overload: OverloadRecord, args: tuple,
             kwargs: dict) -> _Spec | None:
    """The spec of the op `_record`'s `key` names (probed once per signature: the key also names references)."""
    signature = _unreferenced(key)
    spec = _specs.get(signature, False)
    if spec is False:
        spec = _spec(signature, call, overload.info, args, kwargs)
    return spec


def flush() -> None:
    """Execute every queued op, in order (a no-op when nothing is queued)."""
    global _device
    with _lock:
        queue = _queue[:]
        if not queue:  # nothing queued, or a host read inside this thread's own flush
            return
        inputs = _inputs[:]
        index = _device
        _queue.clear()
        _inputs.clear()
        _input_ids.clear()
        _queued.clear()
        _device = -1
        _counters["flushes"] += 1
        try:
            _execute(queue, inputs, index)
        except BaseException:
            _twin_the_rest(queue)  # what a failed flush left unwritten may still be read (values undefined)
            raise
        finally:
            _barrier.set_pending(flush if _queue else None)
        _spare(queue)


def _spare(queue: list[_Entry]) -> None:
    """Keep the host buffers of the flushed results that no device storage holds any more (the result died, or
    took the fused run's memory: `_write`) for the next queued results of their op's signature: a buffer per queued
    result, allocated at the record and freed at the flush, was the costliest part of both after the allocator's
    accounting. Not inference tensors (a copy into one outside `inference_mode` raises); `_SPARE_BYTES` at most."""
    global _spare_bytes
    for entry in queue:
        spares = entry.spec.spares
        for output, (host, ref) in enumerate(entry.outputs):
            if ref is None or _spare_bytes >= _SPARE_BYTES:
                continue
            storage = ref()
            if (storage is None or storage.data_ptr() != host.data_ptr()) and not host.is_inference():
                spares[output].append(host)
                _spare_bytes += host.nbytes


class _HostContext:
    """Host kernels of a flush run as they would have when queued: outside `torch.autocast("cpu")` regions and
    dispatch modes that happen to be active where the flush is triggered, with IEEE float32 matmuls (queued
    matmuls were recorded under them: `record`), in inference mode (so outputs recorded inside `inference_mode` can
    be written outside it; host aliases never need autograd)."""

    def __enter__(self) -> None:
        # Each guard only where it changes something (a flush follows a kernel that evicted the host's caches, where
        # each costs several microseconds): autocast's key is excluded unless a `torch.autocast("cpu")` region is
        # open, and oneDNN's precision "none" is IEEE float32 (its getter resolves the settings it inherits; "none"
        # only if none is set, and no `ieee_host_matmul` user is inside, which sets "ieee")
        self._autocast = None if _autocast_excluded(_AUTOCAST_CPU) else torch._C._ExcludeDispatchKeyGuard(_CPU_AUTOCAST)
        if self._autocast is not None:
            self._autocast.__enter__()
        self._ieee = None if _matmul_precision("mkldnn", "matmul") == "none" else _host_numerics.ieee_host_matmul()
        if self._ieee is not None:
            self._ieee.__enter__()
        self._inference = torch._C._InferenceMode(True)  # `torch.inference_mode()`, minus its Python frames:
        # outputs recorded in inference mode are inference tensors
        self._inference.__enter__()
        self._modes = None
        if torch._C._len_torch_dispatch_stack():
            from torch.utils._python_dispatch import _disable_current_modes

            self._modes = _disable_current_modes()
            self._modes.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self._modes is not None:
            self._modes.__exit__(*exc)
        self._inference.__exit__(*exc)
        if self._ieee is not None:
            self._ieee.__exit__(*exc)
        if self._autocast is not None:
            self._autocast.__exit__(*exc)


def _execute(queue: list[_Entry], inputs: list[_Input], index: int) -> None:
    outputs = [output for entry in queue for output in entry.outputs]  # (host buffer, ref) of every output, in order
    # whether each is still referenced, in one flat tuple: each op's signature fixes its number of outputs
    live = tuple([ref is not None and ref() is not None for _, ref in outputs])
    structure = (tuple([entry.number for entry in queue]), live)
    run = _runs.get(structure)
    if run is None:
        if len(_runs) >= _MAX_RUNS:
            _runs.clear()
            _numbers.clear()  # numbers are not reused: the queue's entries keep theirs
        run = _runs[structure] = _Run(len(_runs))
    run.seen += 1
    hosts = [item.host() for item in inputs]
    with _HostContext():
        if not run.tried and run.seen >= FUSE_AFTER and len(queue) >= low_threshold:
            run.tried = True
            _compile(run, queue, hosts, live)
        if run.compiled is None:
            _counters["op_by_op_runs"] += 1
            _op_by_op(queue, hosts, live, index)
            return
        _counters["fused_runs"] += 1
        results = run.compiled(*hosts)
    written = (output for output, alive in zip(outputs, live, strict=True) if alive)
    taken: set[int] = set()
    for (host, ref), result in zip(written, results, strict=True):
        _write(host, ref, result, taken)
    _ledger.mark_executed(run.names)  # the ops ran, inside one kernel
    _ledger.record_kernel(FUSED_KERNEL_NAME, index, run.number, run.seconds, run.work)


def _write(host: torch.Tensor, ref: weakref.ref, result: torch.Tensor, taken: set[int]) -> None:
    """Give a queued output its value: the result's own memory when it is large, laid out alike and not given to
    another output yet (`taken`: data pointers given), else a copy into the output's memory (`host`), which then
    gets its host twin (`_record` adopts it without one)."""
    storage = ref()
    if storage is None:
        return
    nbytes = storage.nbytes()
    pointer = result.data_ptr()
    if (nbytes < _ADOPT_BYTES or pointer in taken or result.storage_offset() or result.stride() != host.stride()
            or result.untyped_storage().nbytes() != nbytes or result.is_conj() or result.is_neg()):
        host.copy_(result)
        _storage.give_twin(storage, host)
        return
    taken.add(pointer)
    # The storage keeps its identity (views, allocator accounting); only its memory becomes the result's.
    _storage.take_memory(storage, result)


def _twin(host: torch.Tensor, ref: weakref.ref | None) -> None:
    """Give a live output written in place (`host`) its host twin, unless it has one."""
    storage = None if ref is None else ref()
    if storage is not None:
        _storage.give_twin(storage, host)


def _twin_the_rest(queue: list[_Entry]) -> None:
    for entry in queue:
        for host, ref in entry.outputs:
            _twin(host, ref)


def _resolve(value: Any, hosts: list, values: list) -> Any:
    kind = type(value)
    if kind is _External:
        return hosts[value.index]
    if kind is _Queued:
        tensor = values[value.entry][value.output]
        return tensor if value.view is None else tensor.as_strided(*value.view)
    if kind is list:
        return [_resolve(v, hosts, values) for v in value]
    return value


def _op_by_op(queue: list[_Entry], hosts: list, live: tuple, index: int) -> None:
    """Each op with its own CPU kernel, as plain eager runs it; live outputs are written to device memory."""
    values: list[list[torch.Tensor]] = []
    taken: set[int] = set()
    flags = iter(live)
    for entry in queue:
        args = [_resolve(v, hosts, values) for v in entry.args]
        result = entry.call(*args, **entry.kwargs)
        produced = []
        for (host, ref), output in zip(entry.outputs, (result,) if entry.spec.single else result):
            alive = next(flags)
            if output.stride() != host.stride() or output.storage_offset() or output.shape != host.shape:
                output = host.copy_(output)  # later views of it are relative to the device layout: read it there
                if alive:
                    _twin(host, ref)
            elif alive:
                _write(host, ref, output, taken)
            produced.append(output)
        values.append(produced)
        _ledger.charge(entry.record, index, args, entry.kwargs, result)


def _compile(run: _Run, queue: list[_Entry], hosts: list, live: tuple) -> None:
    """Build the run's FX graph and hand it to the fuser plugin; on success `run` gets the callable and its cost."""
    try:
        graph_module = _graph(queue, len(hosts), live)
    except NotImplementedError:
        return
    try:
        compiled = plugins.fuse(graph_module, hosts)
    except Exception as error:
        _counters["fuse_failures"] += 1
        warnings.warn(f"adaptive eager: fusing a run of {len(queue)} ops failed, it runs op by op: "
                      f"{type(error).__name__}: {error}", RuntimeWarning, stacklevel=2)
        return
    if compiled is None:
        return
    _counters["compiled"] += 1
    run.compiled = compiled
    run.names = frozenset(entry.record.name for entry in queue)
    run.work = _fused_work(queue, hosts, live)
    run.seconds = run.work.seconds(_topology.topology().target)


def _graph(queue: list[_Entry], inputs: int, live: tuple) -> torch.fx.GraphModule:
    """The run as an FX graph of CPU ATen ops: inputs are the external tensors, outputs the live results."""
    graph = torch.fx.Graph()
    placeholders = [graph.placeholder(f"input_{n}") for n in range(inputs)]
    nodes: list[list[torch.fx.Node]] = []

    def lower(value: Any) -> Any:
        kind = type(value)
        if kind is _External:
            return placeholders[value.index]
        if kind is _Queued:
            node = nodes[value.entry][value.output]
            if value.view is None:
                return node
            size, stride, _ = queue[value.entry].spec.outputs[value.output]
            if tuple(stride) != _contiguous(size):
                # The view's strides count in the result's memory order: lay the result out in that order first
                # (a host code free to lay out intermediates its own way, Inductor's, needs it; one that runs the
                # same CPU kernels as eager reads the result as it is: `plugins.RELAYOUT`)
                order = _memory_order(size, stride)
                node = graph.call_function(aten.permute.default, (node, order))
                node = graph.call_function(aten.clone.default, (node,), {"memory_format": torch.contiguous_format})
                node.meta[plugins.RELAYOUT] = True
            return graph.call_function(aten.as_strided.default, (node, *value.view))
        if kind is list:
            return [lower(v) for v in value]
        return value

    for entry in queue:
        node = graph.call_function(entry.call, tuple(lower(v) for v in entry.args), dict(entry.kwargs))
        if entry.spec.single:
            nodes.append([node])
        else:
            nodes.append([graph.call_function(operator.getitem, (node, n)) for n in range(len(entry.spec.outputs))])
    graph.output(tuple(node for node, alive in zip((n for outputs in nodes for n in outputs), live, strict=True)
                       if alive))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _contiguous(size: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for extent in reversed(size):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


def _memory_order(size: tuple[int, ...], stride: tuple[int, ...]) -> list[int]:
    """The permutation of dims that makes a dense result of these sizes and strides contiguous."""
    order = sorted(range(len(size)), key=lambda d: (-stride[d], -size[d]))
    permuted = [size[d] for d in order]
    if any(size[d] > 1 and stride[d] != s for d, s in zip(order, _contiguous(permuted), strict=True)):
        raise NotImplementedError(f"a view of a queued result with a non-dense layout {stride} for sizes {size}")
    return order


def _fused_work(queue: list[_Entry], hosts: list, live: tuple) -> _ledger.Work:
    """The run as one kernel: every op's engine work, HBM traffic only across the run's boundary."""
    work: dict[str, float] = {}
    for entry in queue:
        for engine, amount in entry.spec.work.engines:
            work[engine] = work.get(engine, 0.0) + amount
    nbytes = sum(h.numel() * h.element_size() for h in hosts)
    outputs = (output for entry in queue for output in entry.outputs)
    nbytes += sum(host.numel() * host.element_size() for (host, _), alive in zip(outputs, live, strict=True) if alive)
    return _ledger.Work(tuple(work.items()), nbytes, queue[0].spec.work.dtype)
