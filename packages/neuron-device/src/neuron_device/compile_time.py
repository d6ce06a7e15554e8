"""Compile time: what a compiler does on the device while it compiles a graph is not the program's work.

On Trainium the compiler (neuronx-cc) runs on the host: nothing of a compilation runs on a NeuronCore or holds its
HBM. neuron-compile is PyTorch code, and parts of it run real ops on the graph's device: Inductor's joint-graph
passes build their pattern library from example tensors made on the inputs' device (`torch.tensor(..., device=)`)
and fold uniform-value constants with real ops (copies, fills, a read). Charged, they were figures of the program,
which a compile served from a cache (that skips them) did not have: a plan's TTFT and TPOT depended on the state of
AOTAutograd's cache.

Inside `compiling()`, an op on `neuron` runs as usual but charges no device time (`timeline.charge`), is not in the
op ledger (`simulation.ledger`: launches, kernel compilations, executed ops and their call counts, the report), is
no CPU fallback (`fallback`: no record, no warning, no error in strict mode: the compiler's work is the host's), and
a storage it makes is not charged to the allocator (`allocator.track`, `allocator.empty`) for its whole life; each
of them asks `now()`. What the program does before the block (work adaptive eager queued) is charged first, and
what the compiler queued is executed before the block ends.

A leaf, like `barrier`: the timeline, the ledger and the allocator read it without importing each other.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator

from .barrier import flush_barrier

__all__ = ["compiling", "now"]

_compiling: contextvars.ContextVar[bool] = contextvars.ContextVar("neuron_compiling", default=False)
# How many `compiling` blocks are open in any thread: while none is, `now()` reads no context variable (it is
# asked for every op). Read only through `now()`, the one test of compile time.
_open_blocks = 0
_lock = threading.Lock()


@contextlib.contextmanager
def compiling() -> Iterator[None]:
    """The block is compile time: device work in it charges no time, no ledger entry and no memory."""
    global _open_blocks
    flush_barrier()  # the program's queued ops are the program's
    with _lock:
        _open_blocks += 1
    token = _compiling.set(True)
    try:
        yield
        flush_barrier()  # the compiler's queued ops run, uncharged, before the program's next op
    finally:
        _compiling.reset(token)
        with _lock:
            _open_blocks -= 1


def now() -> bool:
    """Whether this thread (this context) is inside a `compiling` block."""
    return _open_blocks > 0 and _compiling.get()
