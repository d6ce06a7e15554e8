"""Adaptive eager (TorchNeuron's "concatenation", opt-in with ``TORCH_NEURONX_ENABLE_CONCATENATION=1``): eager ops
are queued instead of run, and a run of queued ops that repeats is fused into one kernel.

============== ====================================================================================================
``queue``      the queue: `record` (called by the fast path), `flush`, fusing repeated runs, the public switches
               (`is_enabled`, `set_enabled`, `pending_ops`, `stats`).
this module    the one flush barrier, `flush_barrier()`: the runtime calls it wherever queued work must have
               happened first (a host read of device memory, a storage resize, a timeline read, a stream switch,
               reading the op tracking).
============== ====================================================================================================

Kept import-free so the runtime's lowest modules (storage, allocator, timeline) can call the barrier.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["flush", "flush_barrier", "is_enabled", "pending_ops", "set_enabled", "stats"]

_QUEUE_API = frozenset({"flush", "is_enabled", "pending_ops", "set_enabled", "stats"})

# While ops are queued, the callable that executes them (`queue.flush`); None when the queue is empty.
pending: Callable[[], None] | None = None


def flush_barrier() -> None:
    """Execute every queued op now (nothing to do when adaptive eager is off or its queue is empty)."""
    if pending is not None:
        pending()


def __getattr__(name: str) -> object:
    """The queue's public functions (`neuron_device.adaptive_eager.set_enabled`, ...), loaded on first use: an
    import of the queue here would close an import cycle through the storage module that calls the barrier."""
    if name in _QUEUE_API:
        from . import queue

        return getattr(queue, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
