"""Simulated time of collectives: what the interconnect (reference/hardware.md) would take, charged on the stream.

Data really moves through Gloo on host memory; the device's clock must instead advance as if NeuronLink carried it,
so profiles and `Event.elapsed_time` show what a Trainium job would see. The model is the bandwidth term of ring
algorithms (the ones the Neuron collectives library uses inside a node) plus a fixed latency per step.
"""

from __future__ import annotations

import torch

from neuron_device import services
from neuron_spec.hardware import resolve_target

__all__ = ["STEP_LATENCY_SECONDS", "charge", "collective_seconds"]

# Per-hop latency of one ring step (DMA descriptor + link), a typical figure for NeuronLink-class fabrics.
STEP_LATENCY_SECONDS = 2e-6

# How many times each byte of the (per-rank) payload crosses a link, as a function of the group size n, for the
# ring algorithm of each collective; point-to-point and rooted collectives move the payload once.
_TRAFFIC: dict[str, tuple[str, ...]] = {
    "ring_reduce": ("allreduce", "allreduce_coalesced"),
    "ring_half": (
        "allgather",
        "all_gather_single",
        "allgather_coalesced",
        "allgather_into_tensor_coalesced",
        "reduce_scatter",
        "reduce_scatter_single",
        "reduce_scatter_tensor_coalesced",
        "alltoall",
        "alltoall_base",
    ),
}


def _factor(kind: str, group_size: int) -> tuple[float, int]:
    """(link crossings per payload byte, ring steps) of collective `kind` in a group of `group_size`."""
    n = max(group_size, 1)
    if kind in _TRAFFIC["ring_reduce"]:
        return 2.0 * (n - 1) / n, 2 * (n - 1)
    if kind in _TRAFFIC["ring_half"]:
        return (n - 1) / n, n - 1
    return 1.0, 1


def collective_seconds(kind: str, payload_bytes: int, group_size: int, target: str | None = None) -> float:
    """Simulated seconds of one collective `kind` whose per-rank payload (the larger of input and output) is given."""
    spec = services.topology().target if target is None else resolve_target(target)
    crossings, steps = _factor(kind, group_size)
    if group_size <= 1:
        return 0.0
    # the chip-to-chip interconnect (NeuronLink-v2 / v3 / v4) bandwidth per chip, from the hardware spec
    return crossings * payload_bytes / spec.neuronlink_bytes_per_second + steps * STEP_LATENCY_SECONDS


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def charge(kind: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor], group_size: int) -> None:
    """Queue the collective's simulated time on the current stream of each `neuron` device it touches."""
    devices = {t.device.index or 0 for t in (*inputs, *outputs) if t.device.type == "neuron"}
    if not devices:
        return
    seconds = collective_seconds(kind, max(_nbytes(inputs), _nbytes(outputs)), group_size)
    for index in devices:
        services.charge(index, seconds, f"c10d::{kind}")  # the name labels the collective in a profiler trace
