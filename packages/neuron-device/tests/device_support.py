"""Helpers shared by neuron-device's tests (imported by name: each test folder's helper modules have names of their
own, so all folders can run in one pytest process)."""

from __future__ import annotations

import atexit
import builtins
import importlib.machinery
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import types
from multiprocessing import context, forkserver, popen_forkserver, reduction, spawn, util
from pathlib import Path

import torch

# Read by the interpreter or by torch's own modules when they are imported: a run whose environment gives one of them
# another value than the fork server's starts a fresh interpreter. `TORCH_NEURONX_*` (like `NEURON_*`) are
# neuron-device's own, read when the child loads it after the fork (`envvars.py`, read at use).
# The same rule as neuron-distributed's tests/launcher.py (a later merge can share both servers' code).
_READ_AT_IMPORT = re.compile(r"^(?!TORCH_NEURONX_)(TORCH|PYTORCH|PYTHON|OMP_|MKL_|KMP_|LD_)")
_AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"


class _Server:
    """A fork server of this test process's own (not multiprocessing's global one, which neuron-distributed's
    launcher preloads with other modules): torch imported with the device backends not loaded, the environment it
    starts with (this process's at the first run), and the `sys.path` a fresh `python -c` has there."""

    def __init__(self) -> None:
        self.environ = dict(os.environ)
        probe = [sys.executable, "-c",
                 "import json, subprocess, sys; print(json.dumps([sys.path, subprocess._args_from_interpreter_flags()]))"]
        self.path, self.fresh_flags = json.loads(subprocess.run(probe, capture_output=True, text=True,
                                                                check=True).stdout)
        self.forkserver = forkserver.ForkServer()
        self.forkserver.set_forkserver_preload(["torch"])

    def start(self) -> None:
        """Start the server process at the first fork (a test file whose runs are all fresh does not pay it)."""
        if self.forkserver._forkserver_pid is not None:
            return
        current = dict(os.environ)
        os.environ.clear()  # the server's environment, read when it starts: the one `forks` compares with
        os.environ.update(self.environ, **{_AUTOLOAD: "0"})
        try:
            self.forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(current)
        # the server's CPU time (and its children's) is counted in this process's once it is waited for
        atexit.register(self.forkserver._stop)

    def forks(self, env: dict[str, str]) -> bool:
        """Whether a run in `env` behaves in a forked child as in a fresh interpreter: no variable read at import
        differs from the server's, and this interpreter has the flags a fresh `python -c` has (the server has this
        interpreter's: a command-line flag such as `python -B -m pytest` is not `python -c`'s, while one the
        environment sets, e.g. `-B` from PYTHONDONTWRITEBYTECODE, is both's)."""
        names = set(env) | set(self.environ)
        changed = [name for name in names if env.get(name) != self.environ.get(name) and _READ_AT_IMPORT.match(name)]
        return not changed and subprocess._args_from_interpreter_flags() == self.fresh_flags


_server: _Server | None = None


class _Popen(popen_forkserver.Popen):
    """multiprocessing's forkserver launch (`popen_forkserver.Popen._launch`) from `_server`, preparing the child as
    `python -c` starts: argv `['-c']`, the caller's working directory, not re-importing the test process's
    `__main__` (`sys.path` is this process's until the child has unpickled its target from this module)."""

    def _launch(self, process_obj) -> None:
        prep_data = spawn.get_preparation_data(process_obj._name)
        for key in ("init_main_from_name", "init_main_from_path"):
            prep_data.pop(key, None)
        prep_data.update(sys_argv=["-c"], dir=os.getcwd())
        buf = io.BytesIO()
        context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            context.set_spawning_popen(None)
        self.sentinel, w = _server.forkserver.connect_to_new_process(self._fds)
        parent_w = os.dup(w)  # the child's sentinel of its parent, as in `_launch`
        self.finalizer = util.Finalize(self, util.close_fds, (parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class _Process(context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj):
        return _Popen(process_obj)


def _exit_code(stop: SystemExit) -> int:
    """The exit status the interpreter gives `SystemExit` (a non-integer code is printed, status 1)."""
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code & 0xFF
    print(stop.code, file=sys.stderr)
    return 1


def _run_code(code: str, env: dict[str, str], path: list[str], stdout: str, stderr: str) -> None:
    """A forked child: what `python -c code` does with `env`, its stdout and stderr into the files named."""
    for fd, name in ((1, stdout), (2, stderr)):
        with open(name, "w") as sink:
            os.dup2(sink.fileno(), fd)
    status = 1
    try:
        os.environ.clear()
        os.environ.update(env)
        sys.path[:] = path
        main = types.ModuleType("__main__")  # the namespace `python -c` runs in
        main.__dict__.update(__loader__=importlib.machinery.BuiltinImporter, __annotations__={},
                             __builtins__=builtins)
        sys.modules["__main__"] = main
        if torch._is_device_backend_autoload_enabled():  # what `import torch` does after the fork
            torch._import_device_backends()
        exec(compile(code, "<string>", "exec"), main.__dict__)
        status = 0
    except SystemExit as stop:
        status = _exit_code(stop)
    except BaseException as error:
        # the interpreter's report of an uncaught exception, without this function's frame
        error.__traceback__ = error.__traceback__.tb_next or error.__traceback__
        sys.excepthook(type(error), error, error.__traceback__)
    finally:
        threading._shutdown()  # the interpreter's exit: non-daemon threads are joined, then atexit runs
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def run_python(
    code: str, *, env: dict[str, str] | None = None, timeout: float = 120, fresh: bool = False
) -> subprocess.CompletedProcess:
    """Run `code` as `python -c code` would, with this environment updated by `env`, in a process of its own (a
    crash cannot affect this session).

    The process is forked from a server that imported torch (a fresh interpreter pays about 2 s of CPU for it), and
    loads the device backends after taking its environment, as `import torch` would; it runs fresh when `env` gives
    a variable read at import (see `_READ_AT_IMPORT`) or `fresh` is set: code that tests the interpreter's start or
    `import torch` itself (its code runs before torch is imported, e.g. it imports our module first or hooks imports).
    """
    global _server
    full_env = {**os.environ, **(env or {})}
    args = [sys.executable, "-c", code]
    if _server is None and not fresh:
        _server = _Server()
    if fresh or not _server.forks(full_env):
        return subprocess.run(args, capture_output=True, text=True, env=full_env, timeout=timeout, check=False)
    _server.start()
    with tempfile.TemporaryDirectory(prefix="run-python-") as outputs:
        stdout, stderr = Path(outputs) / "stdout", Path(outputs) / "stderr"
        child = _Process(target=_run_code, args=(code, full_env, _server.path, str(stdout), str(stderr)))
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(args, timeout, output=stdout.read_text(), stderr=stderr.read_text())
        return subprocess.CompletedProcess(args, child.exitcode, stdout.read_text(), stderr.read_text())


def elapsed_ms(fn) -> float:
    """Simulated milliseconds that `fn`'s ops take on the current stream (events around it)."""
    torch.neuron.synchronize()
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    return start.elapsed_time(end)
