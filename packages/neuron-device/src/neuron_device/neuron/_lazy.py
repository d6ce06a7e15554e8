"""Lazy initialisation of the simulated runtime, and the fork rule (as `torch.cuda._lazy_init`)."""

from __future__ import annotations

import os
import threading

from .. import envvars as _envvars
from .. import topology as _topology

_initialized = False
_in_bad_fork = False
_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _initialized, _in_bad_fork
    if _initialized:
        _in_bad_fork = True
        _initialized = False


os.register_at_fork(after_in_child=_after_fork_in_child)


def is_initialized() -> bool:
    """Whether the Neuron runtime has been initialised in this process."""
    return _initialized and not _in_bad_fork


def _is_in_bad_fork() -> bool:
    return _in_bad_fork


def lazy_init() -> None:
    """Initialise the runtime on first use; refuse to run in a child forked after the parent initialised it."""
    global _initialized
    if _initialized:
        return
    if _in_bad_fork:
        raise RuntimeError(
            "Cannot re-initialize Neuron in forked subprocess. To use Neuron with multiprocessing, "
            "you must use the 'spawn' start method"
        )
    with _lock:
        if not _initialized:
            _envvars.raise_deferred()  # a bad value seen while `import torch` ran, named now
            _topology.topology()  # validates the environment; raises a clear error on bad values
            _initialized = True
            # neuron-top, neuron-monitor and neuron-ls see this process from now on
            from .. import livestats

            livestats.start()
