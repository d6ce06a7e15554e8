"""Cleanups a process registers for its own end (a temporary directory it made), run when the interpreter exits and
also where a forked child ends by `os._exit`, which runs no `atexit` handler: neuron-plan's zygote and ranks call
`run` before it, and multiprocessing's forked workers run it as one of their `multiprocessing.util` finalizers.

A forked child inherits its parent's handlers, `atexit`'s too: run there, a handler would remove what its parent
still uses (and a child's own were never run at its `os._exit`). So each cleanup here belongs to the process that
registered it, and `run` calls only the calling process's own.

A leaf: it imports nothing of the package.
"""

from __future__ import annotations

import atexit
import multiprocessing.util
import os
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["at_exit", "run"]

_handlers: list[tuple[int, Callable[..., Any], tuple[Any, ...]]] = []  # (registering pid, callback, its arguments)
_finalizer_pid: int | None = None  # the process that gave multiprocessing its finalizer (`at_exit`)


def at_exit(callback: Callable[..., Any], *args: Any) -> None:
    """Call `callback(*args)` when this process ends (not in a process forked from it), last registered first."""
    global _finalizer_pid
    pid = os.getpid()
    _handlers.append((pid, callback, args))
    if _finalizer_pid != pid:  # a multiprocessing worker forked from here runs its own finalizers before `os._exit`
        multiprocessing.util.Finalize(None, run, exitpriority=0)
        _finalizer_pid = pid


def run() -> None:
    """Call this process's cleanups now, each once (an error is printed, as `atexit` does, and the others still
    run); the code that ends a forked child by `os._exit` calls it first."""
    pid = os.getpid()
    mine = [(callback, args) for owner, callback, args in _handlers if owner == pid]
    _handlers[:] = [handler for handler in _handlers if handler[0] != pid]
    for callback, args in reversed(mine):
        try:
            callback(*args)
        except Exception:
            traceback.print_exc()


atexit.register(run)
