"""Every Gloo work this package issues stays referenced here until Gloo's worker let go of it: then it is dropped
on a Python thread, so no work dies on a Gloo worker with the Python objects it holds.

Why. A Gloo collective runs on a `pt_gloo_runloop` worker, which drops its references to the work right after
completing it (`work.wait()` returns before that); if those are the last, the work dies there, with the tensors, the
TLS snapshot (modes, hooks) and the future it holds. torch 2.13 keeps a tensor's Python object alive while C++ holds
the tensor, and a C++ release that leaves only the Python object's reference (2 -> 1) decrefs that object under the
GIL on the releasing thread, even while Python still holds the tensor. A process group destroyed by a thread holding
the GIL (DDP's Reducer, freed at a script's end) joins the worker: both wait forever (gdb: the main thread in
`~ProcessGroupGloo` joining `pt_gloo_runloop`, which waits for the GIL in `decref_pyobject` under
`~AsyncAllreduceWork`). About one real 2-rank DDP run in 20 hung so.

How. `issue` keeps each work it issues; `prune` (each `issue`) and `drain` (a group's shutdown) drop a work once it is
complete and no C++ code holds it any more, read from the work's reference count (`_cxx_references`; Python has no
API for it, so the layout is checked at import). Dropping it then destroys it on this thread (or leaves it to its
Python holders), and while it is kept, the worker's release is never the last. Gloo's barrier takes references to
the works issued before it while it runs, so no work older than an unsettled barrier is dropped.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._C._distributed_c10d import Work, _create_work_from_future

__all__ = ["drain", "issue", "outstanding", "prune", "without_autograd_context"]

# What `torch.autograd.graph._engine_run_backward` stashes in the thread's TLS for the length of a backward
_AUTOGRAD_CONTEXT = "context"
# How long `drain` waits for the worker to let go of a completed work (it does right after completing it, needing
# no GIL); a work still held after that stays here, so the worker's release is not the last, and goes in a later
# `prune`
_SETTLE = datetime.timedelta(seconds=1)

# A pybind11 instance of a class with a simple layout (Work's): the object header, the C++ object's address, then
# its holder (an intrusive_ptr: the same address). A c10 intrusive_ptr_target: the vtable pointer, then the combined
# reference count, whose low 32 bits are the strong references.
_VALUE_OFFSET = object.__basicsize__
_HOLDER_OFFSET = _VALUE_OFFSET + ctypes.sizeof(ctypes.c_void_p)
_COUNT_OFFSET = ctypes.sizeof(ctypes.c_void_p)
_STRONG = (1 << 32) - 1


def _cxx_references(work: Work) -> int:
    """The strong C++ references to `work`'s C++ object: its Python wrapper's holder is one (however many Python
    references the wrapper has); each other one is C++ code's (the queue, a worker, a caller)."""
    address = ctypes.c_void_p.from_address(id(work) + _VALUE_OFFSET).value
    return ctypes.c_uint64.from_address(address + _COUNT_OFFSET).value & _STRONG


def _check_layout() -> None:
    """The reading's assumptions, checked once on a real Work: holder and object at the same address, one reference
    from the wrapper, one more while a boxed copy lives."""
    work = _create_work_from_future(torch.futures.Future())
    address = ctypes.c_void_p.from_address(id(work) + _VALUE_OFFSET).value
    boxed = work.boxed()
    expected = (
        address is not None
        and ctypes.c_void_p.from_address(id(work) + _HOLDER_OFFSET).value == address
        and _cxx_references(work) == 2
    )
    del boxed
    if not (expected and _cxx_references(work) == 1):
        raise ImportError(
            "neuron_distributed.gloo_refs: unexpected pybind11 instance or intrusive_ptr layout"
        )


_check_layout()


class _Entry:
    """One issued Gloo work, kept until complete and let go of by C++; the ids of the objects it was issued for."""

    __slots__ = ("barrier", "owners", "work")

    def __init__(self, owner: Any, work: Work, barrier: bool) -> None:
        self.owners, self.work, self.barrier = {id(owner)}, work, barrier

    def settled(self) -> bool:
        """Complete, and only Python holds it: dropping it now cannot leave its last reference to a Gloo thread."""
        return self.work.is_completed() and _cxx_references(self.work) == 1


_entries: list[_Entry] = []  # in issue order
_lock = threading.Lock()


@contextlib.contextmanager
def without_autograd_context() -> Iterator[None]:
    """Issue Gloo work without autograd's stashed `contextvars` context in this thread's TLS: a work's TLS snapshot
    would hold it (DDP's all-reduces are issued during the backward), and Gloo's transport needs none."""
    if not torch._C._is_key_in_tls(_AUTOGRAD_CONTEXT):
        yield
        return
    context = torch._C._get_obj_in_tls(_AUTOGRAD_CONTEXT)
    torch._C._remove_obj_from_tls(_AUTOGRAD_CONTEXT)
    try:
        yield
    finally:
        torch._C._stash_obj_in_tls(_AUTOGRAD_CONTEXT, context)


def _work_of(result: Any) -> Work | None:
    """The Work a Gloo method or a `c10d::*` op returned (alone, or last of a tuple; boxed for an op), or None for a
    call that returned none (`monitored_barrier_`: done when it returns)."""
    work = result[-1] if isinstance(result, tuple) and result else result
    if isinstance(work, torch.ScriptObject):
        work = Work.unbox(work)
    return work if isinstance(work, Work) else None


def issue(owner: Any, call: Callable[..., Any], *args: Any, barrier: bool = False, **kwargs: Any) -> Any:
    """`call(*args, **kwargs)` (a Gloo method, or a `c10d::*` op that reaches Gloo), its work kept until settled;
    returns what `call` returns. `owner`: the group or Gloo backend `drain` names; `barrier`: a Gloo barrier."""
    prune()
    with without_autograd_context():
        result = call(*args, **kwargs)
    work = _work_of(result)
    if work is not None:
        with _lock:
            _entries.append(_Entry(owner, work, barrier))
    return result


def prune() -> None:
    """Drop, on this thread, every settled work not older than an unsettled barrier (which may still take a reference
    to it on its worker)."""
    kept: list[_Entry] = []
    released: list[_Entry] = []
    with _lock:
        barrier_pending = False
        for entry in reversed(_entries):
            if not barrier_pending and entry.settled():
                released.append(entry)
            else:
                kept.append(entry)
                barrier_pending = barrier_pending or entry.barrier
        _entries[:] = kept[::-1]
    released.clear()  # outside the lock: a work's release may run Python code that issues work


def drain(*owners: Any, wait: bool = True) -> None:
    """At a group's shutdown (`wait`; abort: not): wait for each work issued for `owners` (its errors are its
    waiter's to see), then drop each once Gloo let go of it. A work still held after that stays until a later
    `prune`, forgotten by `owners`: kept here, it cannot die on the group's workers when they are joined."""
    ids = {id(owner) for owner in owners}
    with _lock:
        mine = [entry for entry in _entries if entry.owners & ids]
    for entry in mine if wait else []:
        with contextlib.suppress(RuntimeError):
            entry.work.wait()
    deadline = time.monotonic() + _SETTLE.total_seconds()
    while (
        not all(entry.settled() for entry in mine if entry.work.is_completed())
        and time.monotonic() < deadline
    ):
        time.sleep(0.001)  # GIL released: the worker needs none to let go
    for entry in mine:
        entry.owners = set()
    prune()


def outstanding(owner: Any = None) -> int:
    """Works kept (issued for `owner`, or all)."""
    with _lock:
        return sum(owner is None or id(owner) in entry.owners for entry in _entries)
