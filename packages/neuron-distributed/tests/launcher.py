"""Launch a worker script on N local ranks (torchrun's environment, a free port) and collect per-rank markers.

Each worker prints `CHECK <name> OK` or `CHECK <name> FAIL <reason>` per check; a rank that crashes, hangs past
the deadline or exits without its markers shows up as a missing marker, never as a pass.

Ranks are forked from a server that imported torch and torch.distributed once (multiprocessing's forkserver, its
modules preloaded): a fresh interpreter pays about 7 s of CPU for those imports, per rank, and the launches of this
folder start some 200 ranks. What a fork inherits is only what a fresh process would import anyway, in the state
the same environment gives: the server imports with the device backends' autoload off, and each rank sets its own
environment before it loads them (`neuron_device` reads its variables then), as `import torch` would have. An
environment that torch itself reads at import (`TORCH*`, `PYTORCH*`, `PYTHON*` but the warnings filter, thread
counts) cannot be given to an imported torch, so such a launch starts fresh interpreters instead. `run_code` runs
a `python -W ignore -c code` the same way (the planning tests' single processes).
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import re
import runpy
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from multiprocessing import forkserver
from pathlib import Path

WORKERS = Path(__file__).parent / "workers"
_MARKER = re.compile(r"^CHECK (\S+) (OK|FAIL)(?: (.*))?$")
# Read by the interpreter or by torch's own modules when they are imported: a rank given one of these runs fresh.
_READ_AT_IMPORT = re.compile(r"^(TORCH|PYTORCH|PYTHON|OMP_|MKL_|KMP_|LD_)")
_PRELOAD = ["torch", "torch.distributed", "torch.distributed.tensor", "torch.distributed.fsdp",
            "torch.distributed.pipelining"]
_forked: multiprocessing.context.ForkServerContext | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fork_context() -> multiprocessing.context.ForkServerContext:
    """The forkserver, started once per test process with torch imported and the device backends not loaded."""
    global _forked
    if _forked is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(_PRELOAD)
        autoload = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD")
        os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # the server's environment: read when it starts
        try:
            forkserver.ensure_running()
        finally:
            if autoload is None:
                del os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"]
            else:
                os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = autoload
        _forked = context
    return _forked


def _run_rank(script: str, args: list[str], env: dict[str, str], output: str, errors: str | None = None) -> None:
    """A forked rank: what `python script args` does with `env`, its output into `output` (stderr into `errors`
    when given, else there too)."""
    code = 1
    with open(output, "w") as sink:
        os.dup2(sink.fileno(), 1)
    with open(errors or output, "a") as sink:
        os.dup2(sink.fileno(), 2)
    try:
        os.environ.clear()
        os.environ.update(env)
        warnings.resetwarnings()
        warnings.simplefilter("ignore")  # the launch's PYTHONWARNINGS=ignore
        sys.argv = [script, *args]
        sys.path.insert(0, str(Path(script).parent))
        import torch

        if torch._is_device_backend_autoload_enabled():
            torch._import_device_backends()
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        atexit._run_exitfuncs()  # what the interpreter's exit runs (a forked child leaves by os._exit)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _start(script: Path, args: tuple[str, ...], env: dict[str, str], output: Path, fresh: bool):
    if fresh:
        with open(output, "w") as sink:
            return subprocess.Popen([sys.executable, str(script), *args], env=env, stdout=sink,
                                    stderr=subprocess.STDOUT)
    process = _fork_context().Process(target=_run_rank, args=(str(script), list(args), env, str(output)))
    process.start()
    return process


def _wait(process, deadline: float) -> bool:
    """True if the rank ended before `deadline`; else it is killed."""
    remaining = max(deadline - time.monotonic(), 0.0)
    if isinstance(process, subprocess.Popen):
        try:
            process.wait(timeout=remaining)
            return True
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            return False
    process.join(remaining)
    if process.exitcode is None:
        process.kill()
        process.join()
        return False
    return True


def launch(
    script: str,
    world_size: int,
    *args: str,
    timeout: float = 180.0,
    env: dict[str, str] | None = None,
):
    """Run `workers/<script>` on `world_size` ranks; return ({rank: {check: (status, reason)}}, {rank: output})."""
    port = free_port()
    fresh = any(_READ_AT_IMPORT.match(name) for name in env or {})
    with tempfile.TemporaryDirectory(prefix="launch-") as outputs_dir:
        procs = []
        for rank in range(world_size):
            rank_env = {
                **os.environ,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_WORLD_SIZE": str(world_size),
                "PYTHONWARNINGS": "ignore",
                **(env or {}),
            }
            procs.append(_start(WORKERS / script, args, rank_env, Path(outputs_dir) / f"rank{rank}.out", fresh))
        deadline = time.monotonic() + timeout
        ended = [_wait(proc, deadline) for proc in procs]
        results: dict[int, dict[str, tuple[str, str]]] = {}
        outputs: dict[int, str] = {}
        for rank in range(world_size):
            out = (Path(outputs_dir) / f"rank{rank}.out").read_text(errors="replace")
            if not ended[rank]:
                out += f"\n[rank {rank} killed after {timeout}s]"
            outputs[rank] = out
            results[rank] = {}
            for line in out.splitlines():
                match = _MARKER.match(line.strip())
                if match:
                    results[rank][match.group(1)] = (match.group(2), match.group(3) or "")
    return results, outputs


def run_code(code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 300.0
             ) -> subprocess.CompletedProcess:
    """What `python -W ignore -c code args` returns with this environment updated by `env`, in a process of its own
    forked from the launches' server (torch imported once), or a fresh interpreter when `env` names a variable read
    at import. The code runs as a script's (`__main__`, argv `[script, *args]`)."""
    full_env = {**os.environ, **(env or {})}  # `-W ignore` is the process's own, as `_run_rank` sets it
    fresh = any(_READ_AT_IMPORT.match(name) for name in env or {})
    with tempfile.TemporaryDirectory(prefix="run-code-") as folder:
        script, stdout, stderr = (Path(folder) / name for name in ("main.py", "stdout", "stderr"))
        script.write_text(code)
        if fresh:
            return subprocess.run([sys.executable, "-W", "ignore", "-c", code, *args], capture_output=True, text=True,
                                  timeout=timeout, env=full_env, check=False)
        process = _fork_context().Process(target=_run_rank, args=(str(script), list(args), full_env, str(stdout),
                                                                  str(stderr)))
        process.start()
        if not _wait(process, time.monotonic() + timeout):
            raise subprocess.TimeoutExpired([str(script), *args], timeout, stdout.read_text(), stderr.read_text())
        return subprocess.CompletedProcess([str(script), *args], process.exitcode, stdout.read_text(errors="replace"),
                                           stderr.read_text(errors="replace"))


def assert_check(results, outputs, check: str) -> None:
    """Every rank reported `check` as OK."""
    for rank, checks in results.items():
        status, reason = checks.get(check, ("MISSING", ""))
        assert status == "OK", (
            f"rank {rank}: check {check} {status} {reason}\n--- output ---\n{outputs[rank][-4000:]}"
        )
