"""`torch.neuron` streams and events, the twins of `torch.cuda.Stream` / `torch.cuda.Event`, on simulated time.

torch 2.13's C++ device guard for a Python backend has only dummy streams (every `torch.Stream` is stream 0 and
events do nothing), so streams and events live here. They subclass `torch.Stream` / `torch.Event`, so code that
type-checks or passes them to torch keeps working, and they drive the simulated timeline (`neuron_device.timeline`):
every op is charged to the current stream of its device, `wait_stream`/`wait_event` order streams, and
`Event.elapsed_time` reports simulated milliseconds.

Streams come from a pool per device and priority, as CUDA's do: `Stream()` hands out the pool's streams round-robin,
so two `Stream` objects may share one underlying stream (and its clock). Stream 0 is the default stream.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import torch

from .. import timeline as _timeline
from ..device import _check_index, _get_device_index, current_device, set_device
from ..ops.registry import kernel

__all__ = [
    "Event",
    "Stream",
    "StreamContext",
    "current_stream",
    "default_stream",
    "query",
    "record_event",
    "recorded_streams",
    "set_stream",
    "stream",
    "synchronize",
    "wait_event",
    "wait_stream",
]

_DEVICE_TYPE = int(torch._C._autograd.DeviceType.PrivateUse1)
_POOL_SIZE = 32  # streams per device and priority, as in CUDA's stream pool
_PRIORITIES = (0, -1)  # lowest, highest: a lower number is a higher priority, as in CUDA
_pool_cursors: dict[tuple[int, int], itertools.count] = {}


def _device_index(device: Any) -> int:
    return _check_index(_get_device_index(device))


def _clamp_priority(priority: int) -> int:
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise TypeError(f"Stream priority must be an int, got {type(priority).__name__}")
    return min(max(priority, _PRIORITIES[1]), _PRIORITIES[0])


def _pooled_stream_id(index: int, priority: int) -> int:
    level = _PRIORITIES.index(priority)
    cursor = _pool_cursors.setdefault((index, level), itertools.count())
    return 1 + level * _POOL_SIZE + next(cursor) % _POOL_SIZE


class Stream(torch.Stream):
    """A queue of device work with its own simulated clock (`torch.cuda.Stream`'s twin).

    Args:
        device: the stream's device (default: the current device).
        priority: 0 (default) or negative for higher priority; clamped to `priority_range()` as in CUDA. Priority
            is recorded but does not change simulated time (streams never contend in the model).
    """

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> Stream:
        if kwargs:  # an existing stream by its ids, as torch.cuda.Stream(stream_id=..., device_index=..., ...)
            return super().__new__(cls, **kwargs)
        index = _device_index(device)
        stream_id = _pooled_stream_id(index, _clamp_priority(priority))
        return super().__new__(cls, stream_id=stream_id, device_index=index, device_type=_DEVICE_TYPE)

    @staticmethod
    def priority_range() -> tuple[int, int]:
        """(lowest, highest) priority, as `torch.cuda.Stream.priority_range()`."""
        return _PRIORITIES

    @property
    def priority(self) -> int:
        if self.stream_id == 0:
            return 0
        return _PRIORITIES[(self.stream_id - 1) // _POOL_SIZE]

    def wait_event(self, event: Event) -> None:
        """Make later work on this stream wait for `event` (returns immediately on the host)."""
        event.wait(self)

    def wait_stream(self, stream: torch.Stream) -> None:
        """Make later work on this stream wait for all work queued so far on `stream`."""
        self.wait_event(_as_stream(stream).record_event())

    def record_event(self, event: Event | None = None) -> Event:
        """Record `event` (a new one if None) on this stream and return it."""
        event = Event() if event is None else event
        event.record(self)
        return event

    def query(self) -> bool:
        """Whether all work on this stream is done, in simulated time.

        The host stands still on the simulated timeline unless it waits, so a query that finds work pending moves
        the host to the moment the work completes (polling takes time): a polling loop ends at its second query.
        """
        return _poll(self.device_index, _timeline.timeline(self.device_index).clocks.get(self.stream_id, 0.0))

    def synchronize(self) -> None:
        """The host waits until all work on this stream is done."""
        timeline = _timeline.timeline(self.device_index)
        timeline.host_wait(timeline.clocks.get(self.stream_id, 0.0))

    def __enter__(self) -> Stream:
        context = StreamContext(self)
        context.__enter__()
        self.__dict__.setdefault("_contexts", []).append(context)
        return self

    def __exit__(self, *exc: object) -> None:
        self._contexts.pop().__exit__(*exc)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, torch.Stream) and super().__eq__(other)

    def __hash__(self) -> int:
        return hash((self.stream_id, self.device_index, self.device_type))

    def __repr__(self) -> str:
        return f"<torch.neuron.Stream device=neuron:{self.device_index} stream_id={self.stream_id} priority={self.priority}>"


def _poll(index: int, when: float) -> bool:
    """Whether the host has reached simulated time `when` on device `index`; if not, it moves there (a poll takes
    time), so the next poll succeeds."""
    timeline = _timeline.timeline(index)
    if when <= timeline.host:
        return True
    timeline.host_wait(when)
    return False


def _as_stream(stream: torch.Stream) -> Stream:
    """A `torch.neuron.Stream` for any `torch.Stream` naming a neuron stream (e.g. one from `torch.accelerator`)."""
    if isinstance(stream, Stream):
        return stream
    if not isinstance(stream, torch.Stream):
        raise TypeError(f"expected a torch.neuron.Stream, got {type(stream).__name__}")
    if stream.device_type != _DEVICE_TYPE:
        raise ValueError(f"expected a neuron stream, got a stream of device {stream.device}")
    return Stream(stream_id=stream.stream_id, device_index=stream.device_index, device_type=_DEVICE_TYPE)


class Event(torch.Event):
    """A marker in a stream, for ordering streams and timing (`torch.cuda.Event`'s twin), in simulated time.

    Args:
        enable_timing: whether `elapsed_time` may be asked of this event.
        blocking: accepted for compatibility; the host never blocks in wall-clock time in the simulator.
        interprocess: sharing events between processes is not supported by the simulator (raises).
    """

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> Event:
        if interprocess:
            raise NotImplementedError(
                "torch.neuron.Event(interprocess=True): events cannot be shared between processes on the simulated "
                "neuron device"
            )
        device = torch.device("neuron", current_device())
        return super().__new__(cls, device=device, enable_timing=enable_timing, blocking=blocking)

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self._enable_timing = enable_timing
        self._time: float | None = None  # simulated completion time of the work before the event, once recorded
        self._index: int | None = None

    def record(self, stream: torch.Stream | None = None) -> None:
        """Mark the point reached by `stream` (default: the current stream)."""
        stream = current_stream() if stream is None else _as_stream(stream)
        self._index = stream.device_index
        self._time = _timeline.timeline(stream.device_index).ready(stream.stream_id)

    def wait(self, stream: torch.Stream | None = None) -> None:
        """Make later work on `stream` (default: the current stream) wait for this event; a no-op if unrecorded."""
        if self._time is None:
            return
        stream = current_stream() if stream is None else _as_stream(stream)
        # Another device's event may be waited on, as on CUDA: every device's clock counts simulated time from the
        # same start, so the waiting stream starts its later work no earlier than the event's time.
        _timeline.timeline(stream.device_index).wait_until(stream.stream_id, self._time)

    def query(self) -> bool:
        """Whether the work before the event is done, in simulated time (see `Stream.query` on polling)."""
        return self._time is None or _poll(self._index, self._time)

    def synchronize(self) -> None:
        """The host waits until the work before the event is done."""
        if self._time is not None:
            _timeline.timeline(self._index).host_wait(self._time)

    def elapsed_time(self, end_event: Event) -> float:
        """Simulated milliseconds between this event and `end_event` (both recorded, with timing enabled)."""
        if not isinstance(end_event, Event):
            raise TypeError(f"elapsed_time expects a torch.neuron.Event, got {type(end_event).__name__}")
        if not (self._enable_timing and end_event._enable_timing):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if self._time is None or end_event._time is None:
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        if self._index != end_event._index:
            raise ValueError("Both events must be recorded on the same device to calculate elapsed time.")
        return (end_event._time - self._time) * 1e3

    def ipc_handle(self) -> None:
        raise NotImplementedError("torch.neuron.Event.ipc_handle: events cannot be shared between processes")

    def __repr__(self) -> str:
        state = "unrecorded" if self._time is None else f"recorded on neuron:{self._index}"
        return f"<torch.neuron.Event {state}>"


def current_stream(device: Any = None) -> Stream:
    """This thread's current stream on `device` (default: the current device)."""
    index = _device_index(device)
    return Stream(stream_id=_timeline.current_stream_id(index), device_index=index, device_type=_DEVICE_TYPE)


def default_stream(device: Any = None) -> Stream:
    """The default stream (stream 0) of `device`."""
    return Stream(stream_id=0, device_index=_device_index(device), device_type=_DEVICE_TYPE)


def set_stream(stream: torch.Stream | None) -> None:
    """Make `stream` current on its device and make that device current (as `torch.cuda.set_stream`)."""
    if stream is None:
        return
    stream = _as_stream(stream)
    set_device(stream.device_index)
    _timeline.set_current_stream_id(stream.device_index, stream.stream_id)


class StreamContext:
    """Context manager that makes `stream` current (`torch.cuda.StreamContext`'s twin); None is a no-op."""

    def __init__(self, stream: torch.Stream | None) -> None:
        self.stream = None if stream is None else _as_stream(stream)
        self.src_prev_stream: Stream | None = None
        self.dst_prev_stream: Stream | None = None

    def __enter__(self) -> None:
        if self.stream is None:
            return
        self.src_prev_stream = current_stream()
        if self.src_prev_stream.device_index != self.stream.device_index:
            self.dst_prev_stream = current_stream(self.stream.device_index)
        set_stream(self.stream)

    def __exit__(self, *exc: object) -> None:
        if self.stream is None:
            return
        if self.dst_prev_stream is not None:
            set_stream(self.dst_prev_stream)
        set_stream(self.src_prev_stream)


def stream(stream: torch.Stream | None) -> StreamContext:
    """Context manager selecting `stream` (`torch.cuda.stream`'s twin)."""
    return StreamContext(stream)


def synchronize(device: Any = None) -> None:
    """The host waits for all streams of `device`: its simulated time moves to the latest stream clock."""
    _timeline.timeline(_device_index(device)).synchronize()


def wait_stream(stream: torch.Stream) -> None:
    """Make the current stream wait for `stream` (TorchNeuron's module-level shortcut)."""
    current_stream().wait_stream(stream)


def wait_event(event: Event) -> None:
    """Make the current stream wait for `event`."""
    current_stream().wait_event(event)


def record_event(event: Event | None = None) -> Event:
    """Record an event on the current stream."""
    return current_stream().record_event(event)


def query() -> bool:
    """Whether all work on the current stream is done (see `Stream.query`)."""
    return current_stream().query()


_recorded: weakref.WeakKeyDictionary[torch.UntypedStorage, set[Stream]] = weakref.WeakKeyDictionary()


@kernel("aten::record_stream")
def record_stream(self: torch.Tensor, s: torch.Stream) -> None:
    """`Tensor.record_stream(stream)`: the tensor's memory is in use by `stream` until the work queued there is done.

    torch has no PrivateUse1 kernel for it. The streams are kept per storage for the allocator (`recorded_streams`).
    """
    target = _as_stream(s)
    if target.device_index != self.device.index:
        raise RuntimeError(
            f"record_stream: the stream is on neuron:{target.device_index} but the tensor is on {self.device}"
        )
    _recorded.setdefault(self.untyped_storage(), set()).add(target)


def recorded_streams(tensor: torch.Tensor) -> frozenset[Stream]:
    """The streams recorded with `Tensor.record_stream` on the memory of `tensor`."""
    return frozenset(_recorded.get(tensor.untyped_storage(), ()))
