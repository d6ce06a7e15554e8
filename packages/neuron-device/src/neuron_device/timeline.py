"""Simulated device time: a clock per stream of each device, and where the host stands on that device's timeline.

The simulator executes every op on the host, synchronously; device time is a model (`costmodel`). Each stream of a
device has a clock: the simulated time (seconds since the device was first used) at which the work queued on that
stream so far completes. The host is modelled as infinitely fast: it moves along a device's timeline only when it
waits for the device (`synchronize`, a device-to-host copy, `Event.synchronize`, a query that finds work pending).
An op issued on a stream starts once the stream's earlier work is done and the host has issued it:
``start = max(stream clock, host time)``. Streams do not slow each other down (see docs/simulated-time.md).

Which stream is current is per thread and per device, as in CUDA; stream 0 is each device's default stream.

`NEURON_LAUNCH_BLOCKING=1` (read once per process, at the first charge) makes every launch synchronous, as TorchNeuron's sync mode: the
host waits for each op to finish, so host and device time no longer overlap.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator, Mapping

from . import compile_time as _compile_time
from . import envvars
from .barrier import flush_barrier

__all__ = ["DeviceTimeline", "Part", "Recorder", "charge", "current_stream_id", "host_code_device", "running_host_code", "set_current_stream_id", "set_recorder",
           "timeline"]

# What a charge's time went to (`ops.catalogue.breakdown_part`): one part's name, or seconds by part for a charge
# made of several (a compiled graph's kernels); None when unknown.
Part = str | Mapping[str, float] | None
# Called for every charge while a profiler listens: (name, device index, stream id, start, end, part), seconds.
Recorder = Callable[[str, int, int, float, float, Part], None]
_recorder: Recorder | None = None
_launch_blocking: bool | None = None  # NEURON_LAUNCH_BLOCKING, read at the first charge (never at `import torch`)


class DeviceTimeline:
    """The clocks of one device's streams and the host's position on them (seconds)."""

    __slots__ = ("_lock", "busy", "clocks", "host")

    def __init__(self) -> None:
        self.clocks: dict[int, float] = {0: 0.0}
        self.busy: dict[int, float] = {}  # stream id -> seconds of work charged to it (clocks also count idle time)
        self.host = 0.0
        self._lock = threading.Lock()

    def ready(self, stream_id: int) -> float:
        """When work issued now on `stream_id` could start (everything queued on it before is done)."""
        clock = self.clocks.get(stream_id, 0.0)
        return clock if clock > self.host else self.host

    def wait_until(self, stream_id: int, when: float) -> None:
        """Later work on `stream_id` starts no earlier than `when` (a stream waiting for an event)."""
        with self._lock:
            if when > self.ready(stream_id):
                self.clocks[stream_id] = when

    def host_wait(self, when: float) -> None:
        """The host blocks until simulated time `when`."""
        with self._lock:
            if when > self.host:
                self.host = when

    def synchronize(self) -> float:
        """The host waits for every stream of the device; return the time it resumes."""
        with self._lock:
            self.host = max(self.host, *self.clocks.values())
            return self.host


_timelines: dict[int, DeviceTimeline] = {}


def timeline(index: int) -> DeviceTimeline:
    """The timeline of device `neuron:index` (created on first use)."""
    flush_barrier()  # adaptive eager: queued ops reach the clocks before anyone reads them
    found = _timelines.get(index)
    if found is None:
        found = _timelines.setdefault(index, DeviceTimeline())
    return found


class _CurrentStreams(threading.local):
    def __init__(self) -> None:
        self.ids: dict[int, int] = {}  # device index -> current stream id of this thread


_current = _CurrentStreams()
# False until a thread first makes a stream other than the default current: until then every thread's current stream
# is stream 0, and `charge` reads no thread-local state (about a microsecond per op once other work evicts caches)
_streams_set = False


def current_stream_id(index: int) -> int:
    """Id of this thread's current stream on device `index` (0, the default stream, unless set)."""
    return _current.ids.get(index, 0)


def set_current_stream_id(index: int, stream_id: int) -> None:
    """Make `stream_id` this thread's current stream on device `index`."""
    global _streams_set
    flush_barrier()  # queued ops are charged to the stream they were issued on
    _current.ids[index] = stream_id
    _streams_set = True


def set_recorder(recorder: Recorder | None) -> Recorder | None:
    """Install `recorder` (None: none) to see every charge with its name, e.g. a profiler; return the previous one."""
    global _recorder
    previous, _recorder = _recorder, recorder
    return previous


def _read_launch_blocking(found: DeviceTimeline, end: float) -> None:
    """The first charge reads `NEURON_LAUNCH_BLOCKING` (never `import torch`) and applies it to itself."""
    global _launch_blocking
    _launch_blocking = envvars.LAUNCH_BLOCKING.read()
    if _launch_blocking:
        found.host_wait(end)


def charge(index: int, seconds: float, name: str = "device work", part: Part = None, *,
           stream: int | None = None) -> float:
    """Queue `seconds` of work named `name` on this thread's current stream of device `index` (or on stream id
    `stream`: a queue of the device's own, such as its point-to-point transfers'); return its completion time.
    `name` and `part` (what the time went to) reach only an installed recorder (a profiler's device lane, a
    planner's breakdown). At compile time (`compile_time`) nothing is queued: it completes when issued."""
    found = _timelines.get(index) or timeline(index)
    if _compile_time.now():
        return found.host
    if stream is not None:
        stream_id = stream
    else:
        stream_id = _current.ids.get(index, 0) if _streams_set else 0
    with found._lock:  # the stream's work queued (`DeviceTimeline.ready`, inlined: this runs for every op)
        clocks, busy = found.clocks, found.busy
        clock, host = clocks.get(stream_id, 0.0), found.host
        end = (clock if clock > host else host) + seconds
        clocks[stream_id] = end
        busy[stream_id] = busy.get(stream_id, 0.0) + seconds
    if _launch_blocking:
        found.host_wait(end)
    elif _launch_blocking is None:
        _read_launch_blocking(found, end)
    if _recorder is not None:
        _recorder(name, index, stream_id, end - seconds, end, part)
    return end


# The device whose compiled graph's host code is running (its ops run on host aliases of the device's tensors).
_host_code_device: contextvars.ContextVar[int | None] = contextvars.ContextVar("neuron_host_code_device",
                                                                              default=None)


@contextlib.contextmanager
def running_host_code(index: int) -> Iterator[None]:
    """A compiled graph of device `index` runs its host code in the block: work it hands to the device on host
    tensors (the functional collectives a graph traced) is charged to that device (`host_code_device`)."""
    token = _host_code_device.set(index)
    try:
        yield
    finally:
        _host_code_device.reset(token)


def host_code_device() -> int | None:
    """The device whose compiled graph's host code is running, or None."""
    return _host_code_device.get()
