"""The flush barrier: the one call the runtime makes wherever work queued by adaptive eager
(`adaptive_eager/queue`) must have run first — a host read of device memory, a storage resize, a timeline read, a
stream switch, reading the op ledger.

A leaf: it imports nothing of the package, so the runtime's lowest modules (storage, allocator, timeline, the op
ledger) call it without importing adaptive eager, and adaptive eager imports them without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["flush_barrier", "set_pending"]

# While ops are queued, the callable that executes them (`queue.flush`); None when the queue is empty.
_pending: Callable[[], None] | None = None


def flush_barrier() -> None:
    """Execute every queued op now (nothing to do when adaptive eager is off or its queue is empty)."""
    if _pending is not None:
        _pending()


def set_pending(flush: Callable[[], None] | None) -> None:
    """Adaptive eager's queue names the callable that runs it while ops are queued (None once it is empty)."""
    global _pending
    _pending = flush
