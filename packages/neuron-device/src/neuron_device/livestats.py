"""Live counters of this process's simulated devices, published for `neuron-top`, `neuron-monitor` and `neuron-ls`.

On real Trainium those tools ask the driver and runtime which processes use which cores. Here every process that
initialises a `neuron` device publishes a small JSON file, `<pid>.json`, in a per-user runtime directory
(`$NEURON_SIM_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/neuron-sim`, else `<tmp>/neuron-sim-<uid>`). A daemon thread
rewrites it at most `PUBLISH_HZ` times a second and only when a counter moved, so the ops themselves pay nothing;
the file goes at exit, and a reader removes the file of a process that is gone (a crash, a kill).

The counters are cumulative: per device, the simulated busy seconds (work charged to its streams), its simulated
clock (latest stream end), HBM in use, and the busy seconds split by engine; per process, kernel calls, kernels
compiled, CPU fallback calls and the ops that fell back. The engine split is the process-wide mix of the signatures
run (each signature's roofline engine times x calls), applied to each device's busy seconds: exact for the usual
one device per process. Tools turn two readings into rates over their period (`utilisation`).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from . import envvars

__all__ = ["PUBLISH_HZ", "RUNTIME_DIR_ENV", "processes", "publish_tool", "runtime_dir", "snapshot", "start",
           "utilisation"]

RUNTIME_DIR_ENV = envvars.RUNTIME_DIR.name
PUBLISH_HZ = 4
_started = False
_lock = threading.Lock()
_stopped = threading.Event()  # set at exit: the publisher must not write the file again after it is removed
_estimates: dict[int, tuple[Any, dict[str, float], float]] = {}  # id(launch) -> (launch, engine s, memory s)


def runtime_dir() -> Path:
    """The per-user directory where processes publish their counters."""
    explicit = envvars.RUNTIME_DIR.read()
    if explicit:
        return Path(explicit)
    base = envvars.XDG_RUNTIME_DIR.read()
    if base:
        return Path(base) / "neuron-sim"
    return Path(tempfile.gettempdir()) / f"neuron-sim-{os.getuid()}"


def _per_call(launch: Any) -> tuple[dict[str, float], float]:
    """Engine seconds and HBM seconds of one call of a signature (its roofline, computed once)."""
    from .simulation import costmodel

    cached = _estimates.get(id(launch))
    if cached is not None and cached[0] is launch:
        return cached[1], cached[2]
    work = launch.work
    if work is None or work.host_copies or not (work.engines or work.hbm_bytes):
        engines, memory = {}, 0.0
    else:
        estimate = costmodel.estimate_kernel(dict(work.engines), work.hbm_bytes, dtype=work.dtype)
        engines, memory = dict(estimate.engine_seconds), estimate.memory_seconds
    _estimates[id(launch)] = (launch, engines, memory)
    return engines, memory


def snapshot() -> dict[str, Any]:
    """This process's counters (what `<pid>.json` holds). Reads the tracking state without flushing queued ops: it
    runs on the publishing thread."""
    from . import allocator, timeline, topology
    from .simulation import ledger

    topo = topology.topology()
    tracking = ledger.peek()
    launches = tracking.launches
    engine_mix: dict[str, float] = {}
    kernel_calls = fallback_calls = 0
    for launch in launches:
        if launch.work is not None and launch.work.host_copies:
            if launch.name in tracking.fallback_ops:
                fallback_calls += launch.calls
            continue
        kernel_calls += launch.calls
        engines, memory = _per_call(launch)
        for engine, seconds in engines.items():
            engine_mix[engine] = engine_mix.get(engine, 0.0) + seconds * launch.calls
        if memory:
            engine_mix["dma"] = engine_mix.get("dma", 0.0) + memory * launch.calls
    mix_total = sum(engine_mix.values())
    devices = {}
    for index, found in list(timeline._timelines.items()):
        busy = sum(found.busy.values())
        alloc = allocator._devices.get(index)
        devices[str(index)] = {
            "core_id": topo.core_id(index),
            "chip": topo.chip_of(index),
            "busy_seconds": busy,
            "clock_seconds": max(found.clocks.values(), default=0.0),
            "engine_seconds": {e: busy * s / mix_total for e, s in engine_mix.items()} if mix_total else {},
            "hbm_used_bytes": alloc.allocated() if alloc is not None else 0,
            "hbm_total_bytes": topo.hbm_bytes_per_device,
        }
    return {
        "pid": os.getpid(),
        "kind": "runtime",
        "command": " ".join(" ".join(sys.orig_argv).split()),  # one line: a -c script has newlines
        "target": topo.target.name,
        "instance_type": topo.instance_type,
        "lnc": topo.lnc,
        "updated": time.time(),
        "devices": devices,
        "kernel_calls": kernel_calls,
        "kernels_compiled": tracking.kernels_compiled,
        "fallback_calls": fallback_calls,
        "fallback_ops": sorted(tracking.fallback_ops),
    }


def _write(path: Path, data: dict[str, Any]) -> None:
    temporary = path.with_suffix(f".tmp{threading.get_ident()}")
    temporary.write_text(json.dumps(data))
    os.replace(temporary, path)


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def _after_fork_in_child() -> None:
    """A forked child has no publisher thread; its lock must not be one the thread held at the fork."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _stop(path: Path, pid: int) -> None:
    if os.getpid() != pid:  # a forked child inherits atexit handlers: the file is its parent's
        return
    with _lock:
        _stopped.set()
        _remove(path)


def _publish_loop(path: Path) -> None:
    last = None
    while True:
        try:
            data = snapshot()
            counters = {key: value for key, value in data.items() if key != "updated"}
            if counters != last:
                with _lock:
                    if _stopped.is_set():
                        return
                    _write(path, data)
                last = counters
        except (OSError, RuntimeError):  # a full disk, a dict resized mid-read: try again at the next tick
            pass
        time.sleep(1 / PUBLISH_HZ)


def _directory() -> Path:
    directory = runtime_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return directory


def start() -> None:
    """Start publishing this process's counters (once; called when the runtime initialises)."""
    global _started
    with _lock:
        if _started:
            return
        _started = True
    try:
        path = _directory() / f"{os.getpid()}.json"
        processes(include_tools=True)  # sweep the files of processes that died without cleaning up
    except OSError:
        return  # no writable runtime directory: the tools will not see this process, nothing else changes
    atexit.register(_stop, path, os.getpid())
    threading.Thread(target=_publish_loop, args=(path,), name="neuron-livestats", daemon=True).start()


@contextlib.contextmanager
def publish_tool(name: str):
    """Publish a monitoring tool's own entry (`kind: tool`) while it runs: `neuron-ls -a` lists it, as the real
    `neuron-ls -a` lists neuron-monitor and neuron-top."""
    path = _directory() / f"{os.getpid()}.json"
    _write(path, {"pid": os.getpid(), "kind": "tool", "command": " ".join([name, *sys.argv[1:]]),
                  "updated": time.time(), "devices": {}})
    try:
        yield
    finally:
        _remove(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def processes(include_tools: bool = False) -> list[dict[str, Any]]:
    """Every live process's published counters, by pid; removes the files of processes that are gone."""
    directory = runtime_dir()
    found = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            pid = int(path.stem)
        except ValueError:
            continue
        if not _alive(pid):
            _remove(path)
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):  # replaced or removed between glob and read
            continue
        if include_tools or data.get("kind") != "tool":
            found.append(data)
    return sorted(found, key=lambda data: data["pid"])


def utilisation(before: dict[str, Any] | None, after: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per device of one process, in percent of the simulated time that passed between two readings (the whole
    run when `before` is None): busy, and busy by engine."""
    result = {}
    for index, device in after["devices"].items():
        previous = (before or {}).get("devices", {}).get(index, {})
        elapsed = device["clock_seconds"] - previous.get("clock_seconds", 0.0)
        busy = device["busy_seconds"] - previous.get("busy_seconds", 0.0)
        engines = {engine: seconds - previous.get("engine_seconds", {}).get(engine, 0.0)
                   for engine, seconds in device["engine_seconds"].items()}
        scale = 100.0 / elapsed if elapsed > 0 else 0.0
        result[index] = {"busy": min(busy * scale, 100.0),
                         "engines": {engine: min(seconds * scale, 100.0) for engine, seconds in engines.items()}}
    return result
