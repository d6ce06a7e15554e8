"""Every Gloo work this package issues, and what it was handed, released on a Python thread, never on Gloo's worker.

Why. A Gloo collective runs on a `pt_gloo_runloop` worker, which drops its reference to the work when the work is
done; if that is the last one, the work dies there, with the tensors and the TLS snapshot it holds. torch 2.13 keeps
a tensor's Python object alive while C++ holds the tensor, and a C++ holder's release that leaves only the Python
object (a refcount 2 -> 1) decrefs that object, under the GIL, on the releasing thread: even while Python still holds
the tensor. A process group destroyed by a thread holding the GIL (DDP's Reducer, freed at a script's end) joins the
worker: both wait forever (gdb: the main thread in `~ProcessGroupGloo` joining `pt_gloo_runloop`, which waits for
the GIL in `~AsyncAllreduceWork`, `decref_pyobject`). About one real 2-rank DDP run in 20 hung so.

How. `issue` hands Gloo fresh tensors (`detach`: new TensorImpls over the same memory, that nothing else holds) and
keeps a second C++ reference to each (a `torch.ScriptList`), so the worker's release of a work never leaves a Python
object's last C++ reference. An entry is released (its Python objects freed on the releasing Python thread) once its
work is complete and no one but the entry holds its tensors: the work is gone, from the worker and from its users.
`issue` prunes released entries before issuing, `drain` at a group's shutdown. The issuing thread's TLS snapshot
carries no autograd context (`without_autograd_context`), the other Python object a work held in that hang.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._C._distributed_c10d import Work

__all__ = ["drain", "issue", "outstanding", "prune", "without_autograd_context"]

# What `torch.autograd.graph._engine_run_backward` stashes in the thread's TLS for the length of a backward
_AUTOGRAD_CONTEXT = "context"
_OURS = 2  # references to an issued tensor besides Gloo's: its Python object's and the entry's ScriptList
# How long `drain` waits for a completed work's last Gloo reference to go (the worker drops it right after completing
# it, needing no GIL); a work still referenced after that is its caller's, which releases it on a thread of its own
_SETTLE = datetime.timedelta(seconds=1)


class _Entry:
    """One issued Gloo work: the work (until complete), the tensors Gloo got, a C++ reference to each, its owner."""

    __slots__ = ("keep", "owner", "tensors", "work")

    def __init__(self, owner: Any, work: Work, tensors: list[torch.Tensor]) -> None:
        self.owner, self.work, self.tensors = owner, work, tensors
        self.keep = torch.ScriptList(tensors) if tensors else None

    def settled(self) -> bool:
        """True once the work is complete and let go (`prune` drops it first) and only this entry holds its tensors:
        the work is gone, from the worker and from its callers."""
        return self.work is None and all(t._use_count() == _OURS for t in self.tensors)


_entries: list[_Entry] = []
_lock = threading.Lock()


@contextlib.contextmanager
def without_autograd_context() -> Iterator[None]:
    """Issue Gloo work without autograd's stashed `contextvars` context in this thread's TLS: a work's TLS snapshot
    held it (DDP's all-reduces are issued during the backward), a Python object released with the work. Gloo's
    transport needs no context."""
    if not torch._C._is_key_in_tls(_AUTOGRAD_CONTEXT):
        yield
        return
    context = torch._C._get_obj_in_tls(_AUTOGRAD_CONTEXT)
    torch._C._remove_obj_from_tls(_AUTOGRAD_CONTEXT)
    try:
        yield
    finally:
        torch._C._stash_obj_in_tls(_AUTOGRAD_CONTEXT, context)


def _fresh(value: Any, tensors: list[torch.Tensor]) -> Any:
    """`value` with every tensor (also inside lists and tuples, nested) replaced by a detached alias, appended to
    `tensors`: a TensorImpl only Gloo and the entry hold, so its use count says when Gloo let go."""
    if isinstance(value, torch.Tensor):
        tensors.append(value.detach())
        return tensors[-1]
    if isinstance(value, (list, tuple)):
        return type(value)(_fresh(item, tensors) for item in value)
    return value


def _work_of(result: Any) -> Work | None:
    """The Work a Gloo method or a `c10d::*` op returned (alone, or last of a tuple; boxed for an op), or None for a
    call that returned none (`monitored_barrier_`: done when it returns)."""
    work = result[-1] if isinstance(result, tuple) and result else result
    if isinstance(work, torch.ScriptObject):
        work = Work.unbox(work)
    return work if isinstance(work, Work) else None


def issue(owner: Any, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`call(*args, **kwargs)` (a Gloo method, or a `c10d::*` op that reaches Gloo) with fresh tensors, recorded
    until released; returns what `call` returns. `owner` (the group or its Gloo backend) stays alive as long as the
    entry, so its workers are joined only after the entry is released."""
    prune()
    tensors: list[torch.Tensor] = []
    args, kwargs = _fresh(args, tensors), {name: _fresh(value, tensors) for name, value in kwargs.items()}
    with without_autograd_context():
        result = call(*args, **kwargs)
    work = _work_of(result)
    if work is not None:
        entry = _Entry(owner, work, tensors)
        with _lock:
            _entries.append(entry)
    return result


def prune() -> None:
    """Release, on this thread, every entry whose work is complete and gone. A work is dropped outside the lock (its
    release may run Python code that issues work), before its entry can settle (it holds the entry's tensors)."""
    completed: list[Work] = []
    with _lock:
        for entry in _entries:
            if entry.work is not None and entry.work.is_completed():
                completed.append(entry.work)
                entry.work = None
    completed.clear()  # may destroy works here; the rest die on the worker, GIL-free (the entries' ScriptLists)
    kept: list[_Entry] = []
    released: list[_Entry] = []
    with _lock:
        for entry in _entries:
            (released if entry.settled() else kept).append(entry)
        _entries[:] = kept
    released.clear()  # the tensors' Python objects die here, on this thread, after the lock


def drain(*owners: Any, wait: bool = True) -> None:
    """At a group's shutdown (`wait`; abort: not): wait for each work of `owners` (errors are the waiter's to see),
    then release its entry once Gloo lets go. An entry whose work a caller still holds (or, without `wait`, is not
    done) outlives this, without `owner`, so the group and its workers can go: its tensors keep their second
    reference until the work is gone, and `prune` releases it later."""
    with _lock:
        mine = [entry for entry in _entries if any(entry.owner is owner for owner in owners)]
    for work in [entry.work for entry in mine] if wait else []:
        if work is not None:
            with contextlib.suppress(RuntimeError):
                work.wait()
    prune()
    deadline = time.monotonic() + _SETTLE.total_seconds()
    while not all(entry.settled() for entry in mine if entry.work is None) and time.monotonic() < deadline:
        time.sleep(0.001)  # GIL released: the worker needs none to drop the work
    for entry in mine:
        entry.owner = None
    prune()


def outstanding(owner: Any = None) -> int:
    """Entries not yet released (of `owner`, or all): what tests check."""
    with _lock:
        return sum(owner is None or entry.owner is owner for entry in _entries)
