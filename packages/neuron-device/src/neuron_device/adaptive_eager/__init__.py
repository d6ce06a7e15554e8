"""Adaptive eager (TorchNeuron's "concatenation", opt-in with ``TORCH_NEURONX_ENABLE_CONCATENATION=1``): eager ops
are queued instead of run, and a run of queued ops that repeats is fused into one kernel.

============== ====================================================================================================
``queue``      the queue: `record` (installed in front of the fast path's direct call while on), `flush`, fusing
               repeated runs, the public switches (`is_enabled`, `set_enabled`, `pending_ops`, `stats`).
``barrier``    (`neuron_device.barrier`, a leaf module) the one flush barrier, `flush_barrier()`: the runtime calls
               it wherever queued work must have happened first (a host read of device memory, a storage resize, a
               timeline read, a stream switch, reading the op ledger); the queue registers its `flush` there.
============== ====================================================================================================
"""

from __future__ import annotations

from ..barrier import flush_barrier
from .queue import flush, is_enabled, pending_ops, set_enabled, stats

__all__ = ["flush", "flush_barrier", "is_enabled", "pending_ops", "set_enabled", "stats"]
