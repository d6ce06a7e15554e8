"""The service interface of neuron-device: everything the sibling wheels (neuron-compile, neuron-distributed,
neuron-nki) may use of it. They import nothing else of ``neuron_device`` (``tests/test_layering.py``, run by
``nox -s lint``, fails otherwise); to give a sibling something new, export it here.

Device memory
    `adopt` (a CPU tensor's memory becomes a `neuron` tensor's, no copy), `adopt_tracked` (the same, charged to the
    device allocator: it counts against HBM), `adopt_charged` (the same, or sharing the charge of a host storage
    charged already: a compiled graph's result that its backward keeps too), `host_alias` (a CPU view of a `neuron`
    tensor's memory), `device_allocator` (one device's caching allocator: malloc/free of workspace, its
    `segment_tracker`), `allocating_from` / `allocation_source` (what a block's allocations are made for: a compiled
    graph's output and the source line of the node that made it), `track_storage` (below).
Kernels
    `register_kernel` (a `neuron` kernel for an op; plugins get the registry through `neuron_register`),
    `registered_kernels` / `builtin_kernels` / `composite_kernels` (which ops have a direct kernel, which of them
    are neuron-device's own, which are made of other ops on the device), `plugin_estimator` (the seconds a plugin's
    kernel charges for a call), `op_info` (the op catalogue: an op's engine and FLOPs), `scattered_elements` (the
    elements a scatter writes into its first argument), `fused_attention_decompositions` (SDPA's fused op and its
    backward as the flash op their kernels run: a compiler's lowering of them).
Running on the host
    `flat_tensors` (every tensor in nested lists and tuples), `run_on_host` (the CPU fallback: any op on `neuron` tensors), `seeded_call` (call a random op with the device's
    generator).
Simulated time
    `charge` (queue device seconds on the current stream, or a given one), `current_stream_id` (this thread's
    current stream of a device), `record_kernel` (account one launch of a kernel: the
    compile cache, the report), `estimate_kernel` (the cost model), `matmul_array_flops` (a matmul's Tensor-engine occupancy as it tiles onto
    the 128 x 128 array), `LAUNCH_SECONDS` (the runtime's launch of one kernel), `topology` (the simulated machine; its
    figures are the hardware spec's, `neuron_spec.hardware`, which siblings import directly), `timeline` (one
    device's stream clocks), `set_charge_recorder` (see every charge: a profiler, a planner), `compiling` (compile
    time: device work in the block is a compiler's, on the host on Trainium, and charges no time, ledger entry or
    memory).
Plan mode
    `LOCAL_RANK` (the launcher's variable the device reads, for a planner that sets it),
    `account_planned_op` (charge an op that ran on fake tensors as its real kernel would: time and HBM),
    `track_storage` (charge a storage to the allocator model: a fake's, or a host buffer a compiled graph returns),
    `resize_planned_storage` (its block follows an in-place resize), `flex_attention` (flex attention's flash-kernel
    charge, `charge_kernel`, and the fraction of score tiles a block mask visits, `visible_fraction`, for a planned
    call).
Plugins
    `hookimpl` (mark an implementation of a `neuron_device.plugins` hook), `FUSE_RELAYOUT` (the meta key of the
    relayout clones in `neuron_fuse`'s graphs, which a fuser running eager's own CPU kernels may skip), `memo` (a
    plugin's costly estimates by key, which a planned rank hands back to its zygote for the ranks forked after it:
    `memo_additions`, `forget_memo_additions`, `merge_memos`; `memos`).
Process end
    `at_exit` (a cleanup of this process's own, run at its exit, also a forked child's `os._exit` path's),
    `run_at_exit` (run them now: what such a path calls before `os._exit`).
"""

from __future__ import annotations

from .allocator import adopt_charged, adopt_tracked, allocating_from, allocation_source
from .allocator import device as device_allocator
from .compile_time import compiling
from .envvars import LOCAL_RANK
from .exits import at_exit
from .exits import run as run_at_exit
from .fallback import run_on_host
from .memos import additions as memo_additions
from .memos import forget_additions as forget_memo_additions
from .memos import memo
from .memos import merge as merge_memos
from .ops import flex_attention
from .ops.attention import fused_attention_decompositions
from .ops.catalogue import OpInfo, breakdown_part, op_info, scattered_elements
from .ops.registry import builtin as builtin_kernels
from .ops.registry import composite as composite_kernels
from .ops.registry import kernels as registered_kernels
from .ops.registry import plugin_estimator
from .ops.registry import register as register_kernel
from .ops.seeded import seeded_call
from .plugins import RELAYOUT as FUSE_RELAYOUT
from .plugins import hookimpl
from .simulation.costmodel import LAUNCH_SECONDS, KernelEstimate, estimate_kernel, matmul_array_flops
from .simulation.ledger import Work, flat_tensors, record_kernel
from .simulation.planned import account as account_planned_op
from .simulation.planned import resize_storage as resize_planned_storage
from .simulation.planned import track_storage
from .storage import adopt, host_alias
from .timeline import Part as ChargePart
from .timeline import charge, current_stream_id, host_code_device, running_host_code, timeline
from .timeline import set_recorder as set_charge_recorder
from .topology import Topology, topology

__all__ = [
    "FUSE_RELAYOUT",
    "LAUNCH_SECONDS",
    "LOCAL_RANK",
    "ChargePart",
    "KernelEstimate",
    "OpInfo",
    "Topology",
    "Work",
    "account_planned_op",
    "adopt",
    "adopt_charged",
    "adopt_tracked",
    "allocating_from",
    "allocation_source",
    "at_exit",
    "breakdown_part",
    "builtin_kernels",
    "charge",
    "compiling",
    "composite_kernels",
    "current_stream_id",
    "device_allocator",
    "estimate_kernel",
    "flat_tensors",
    "flex_attention",
    "forget_memo_additions",
    "fused_attention_decompositions",
    "hookimpl",
    "host_alias",
    "host_code_device",
    "matmul_array_flops",
    "memo",
    "memo_additions",
    "merge_memos",
    "op_info",
    "plugin_estimator",
    "record_kernel",
    "register_kernel",
    "registered_kernels",
    "resize_planned_storage",
    "run_at_exit",
    "run_on_host",
    "running_host_code",
    "scattered_elements",
    "seeded_call",
    "set_charge_recorder",
    "timeline",
    "topology",
    "track_storage",
]
