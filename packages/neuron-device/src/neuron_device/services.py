"""The service interface of neuron-device: everything the sibling wheels (neuron-compile, neuron-distributed,
neuron-nki) may use of it. They import nothing else of ``neuron_device`` (``tests/test_layering.py``, run by
``nox -s lint``, fails otherwise); to give a sibling something new, export it here.

Device memory
    `adopt` (a CPU tensor's memory becomes a `neuron` tensor's, no copy), `adopt_tracked` (the same, charged to the
    device allocator: it counts against HBM), `host_alias` (a CPU view of a `neuron` tensor's memory),
    `device_allocator` (one device's caching allocator: malloc/free of workspace).
Kernels
    `register_kernel` (a `neuron` kernel for an op; plugins get the registry through `neuron_register`),
    `registered_kernels` / `builtin_kernels` (which ops have a direct kernel, and which of them are neuron-device's
    own), `op_info` (the op catalogue: an op's engine and FLOPs).
Running on the host
    `flat_tensors` (every tensor in nested lists and tuples), `run_on_host` (the CPU fallback: any op on `neuron` tensors), `seeded_call` (call a random op with the device's
    generator).
Simulated time
    `charge` (queue device seconds on the current stream), `record_kernel` (account one launch of a kernel: the
    compile cache, the report), `estimate_kernel` (the roofline cost model), `topology` (the simulated machine; its
    figures are the hardware spec's, `neuron_spec.hardware`, which siblings import directly).
Plugins
    `hookimpl` (mark an implementation of a `neuron_device.plugins` hook).
"""

from __future__ import annotations

from .allocator import adopt_tracked
from .allocator import device as device_allocator
from .fallback import run_on_host, seeded_call
from .ops.catalogue import OpInfo, op_info
from .ops.registry import builtin as builtin_kernels
from .ops.registry import kernels as registered_kernels
from .ops.registry import register as register_kernel
from .plugins import hookimpl
from .simulation.costmodel import KernelEstimate, estimate_kernel
from .simulation.kernels import Work, flat_tensors, record_kernel
from .storage import adopt, host_alias
from .timeline import charge
from .topology import Topology, topology

__all__ = [
    "KernelEstimate",
    "OpInfo",
    "Topology",
    "Work",
    "adopt",
    "adopt_tracked",
    "builtin_kernels",
    "charge",
    "device_allocator",
    "estimate_kernel",
    "flat_tensors",
    "hookimpl",
    "host_alias",
    "op_info",
    "record_kernel",
    "register_kernel",
    "registered_kernels",
    "run_on_host",
    "seeded_call",
    "topology",
]
