"""Simulated time of collectives, charged on the stream: the Neuron runtime's algorithms over the group's path.

Data really moves through Gloo on host memory; the device's clock must instead advance as if the chip's fabric
carried it, so profiles and `Event.elapsed_time` show what a Trainium job would see. The model
(`calibration.md` C1/C4; SDK@HEAD `neuron-runtime/explore/{intranode,internode}-collective-comm.rst`):

    time = COLLECTIVE_LAUNCH_SECONDS + hops x hop latency + link crossings x payload / path bandwidth

* the algorithm is the runtime's choice by message size: mesh below 1 MB (every rank talks to every other
  directly: one hop per phase), recursive halving-doubling from 1 to 56 MB (log2 n hops per phase), ring above
  (n - 1 hops per phase); an all-reduce has two phases (reduce-scatter, all-gather), the others one;
* a hop costs `HOP_SECONDS_INSIDE_NODE` inside an instance and `HOP_SECONDS_ACROSS_NODES` over EFA;
* the path is decided by where the group's ranks are (same chip, same instance, across instances): inside an
  instance one NeuronLink link of a rank's chip (the chip's NeuronLink bandwidth over its `LINKS_PER_CHIP`
  torus links), across instances the chip's share of the instance's EFA bandwidth; both at `LINK_EFFICIENCY`.
  Ranks on one chip: no published figure separates their path from a neighbour link, so it is priced as one
  (assumption; C1, two ranks of one trn1 instance, i.e. the two cores of chip 0, is what it is checked on).

As TorchNeuron's collectives, a payload moves in buckets of at most `TORCH_NEURONX_COLLECTIVE_BUCKETSIZE_IN_MB`
(default 512), at least `TORCH_NEURONX_COLLECTIVE_MIN_BUCKETS` of them; each bucket is a pass of its own, so it adds
one set of hop latencies (the bandwidth term is the same). `NEURON_USE_SPLIT_ALLGATHER=0` /
`NEURON_USE_SPLIT_REDUCE_SCATTER=0` move an all-gather / reduce-scatter in one pass.
"""

from __future__ import annotations

import math

import torch

from neuron_device import services
from neuron_spec.hardware import INSTANCE_TYPES, resolve_target

from . import envvars

__all__ = ["COLLECTIVE_LAUNCH_SECONDS", "HOP_SECONDS_ACROSS_NODES", "HOP_SECONDS_INSIDE_NODE", "LABEL_PREFIX",
           "LINK_EFFICIENCY", "algorithm", "buckets", "charge", "collective_seconds", "is_collective_charge",
           "placement", "placement_of_ranks"]

# Fitted on C1's plateau: a 2-rank fp32 all-reduce of 1-64 KiB takes 58 us whatever its size (minus two hops).
COLLECTIVE_LAUNCH_SECONDS = 55e-6
# C4: 1-2 us per hop inside a node (the middle), ~15 us across nodes (EFA).
HOP_SECONDS_INSIDE_NODE = 1.5e-6
HOP_SECONDS_ACROSS_NODES = 15e-6
# Chips of trn1/trn2 instances are linked in a 2-D torus (trn{1,2}-arch.rst): four neighbours, one link each;
# a rank's traffic to one neighbour uses one link, a quarter of the chip's NeuronLink bandwidth (assumption).
LINKS_PER_CHIP = 4
# Fitted on C1's bandwidth-bound points (16 MiB - 1 GiB: ~57 GB/s of a 96 GB/s trn1 link): the share of a
# link's bandwidth a collective achieves (reduction, DMA descriptors, synchronisation); the same for every path.
LINK_EFFICIENCY = 0.6
# A collective's charge is named LABEL_PREFIX + its kind: a profiler's "collective" lane, a plan's communication.
LABEL_PREFIX = "c10d::"
MESH_BELOW_BYTES = 1_000_000  # C4: mesh below 1 MB ...
RING_ABOVE_BYTES = 56_000_000  # ... recursive halving-doubling up to 56 MB, ring above

# How many times each byte of the (per-rank) payload crosses a link, and how many phases, by collective kind.
_REDUCE_PHASES = {"allreduce": 2, "allreduce_coalesced": 2}
_ONE_PHASE = frozenset({
    "allgather", "all_gather_single", "allgather_coalesced", "allgather_into_tensor_coalesced", "reduce_scatter",
    "reduce_scatter_single", "reduce_scatter_tensor_coalesced", "alltoall", "alltoall_base",
})


def algorithm(payload_bytes: int) -> str:
    """The algorithm the Neuron runtime picks for a message of `payload_bytes` (C4)."""
    if payload_bytes < MESH_BELOW_BYTES:
        return "mesh"
    return "halving-doubling" if payload_bytes <= RING_ABOVE_BYTES else "ring"


_SPLIT = {envvars.SPLIT_ALLGATHER: ("allgather", "all_gather_single", "allgather_coalesced",
                                    "allgather_into_tensor_coalesced"),
          envvars.SPLIT_REDUCE_SCATTER: ("reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor_coalesced")}


def buckets(kind: str, payload_bytes: int) -> int:
    """How many buckets (ring passes) collective `kind` moves `payload_bytes` in."""
    for switch, kinds in _SPLIT.items():
        if kind in kinds and not switch.read():
            return 1
    by_size = math.ceil(payload_bytes / (envvars.BUCKET_MB.read() * 2**20))
    return max(by_size, envvars.MIN_BUCKETS.read(), 1)


def placement(group_size: int, cores_per_chip: int, cores_per_instance: int) -> str:
    """Where a group of `group_size` consecutive ranks (one per logical core, as torchrun places them) lives."""
    if group_size <= cores_per_chip:
        return "chip"
    return "instance" if group_size <= cores_per_instance else "network"


def placement_of_ranks(ranks: list[int] | tuple[int, ...], cores_per_chip: int | None = None,
                       cores_per_instance: int | None = None) -> str:
    """Where the given global ranks live (torchrun's placement: consecutive ranks fill a chip, then an instance):
    one chip, one instance, or across instances. The sizes default to this process's simulated machine."""
    if cores_per_chip is None or cores_per_instance is None:
        topo = services.topology()
        cores_per_chip = max(1, topo.target.physical_cores_per_chip // topo.lnc)
        inst = INSTANCE_TYPES.get(topo.instance_type or "")
        cores_per_instance = cores_per_chip * (inst.chips if inst is not None else topo.chips)
    if len({r // cores_per_chip for r in ranks}) == 1:
        return "chip"
    return "instance" if len({r // cores_per_instance for r in ranks}) == 1 else "network"


def _hops(algo: str, n: int) -> int:
    if algo == "mesh":
        return 1
    return math.ceil(math.log2(n)) if algo == "halving-doubling" else n - 1


def collective_seconds(kind: str, payload_bytes: int, group_size: int, target: str | None = None,
                       where: str | None = None, instance: str | None = None) -> float:
    """Simulated seconds of one collective `kind` whose per-rank payload (the larger of input and output) is given.

    `where` ("chip", "instance" or "network") defaults to the placement of `group_size` ranks on this process's
    simulated machine; `instance` (an instance type) supplies the EFA bandwidth of network paths.
    """
    if group_size <= 1:
        return 0.0
    topo = services.topology()
    spec = topo.target if target is None else resolve_target(target)
    lnc = topo.lnc if spec is topo.target else spec.default_lnc
    per_chip = max(1, spec.physical_cores_per_chip // lnc)
    inst = INSTANCE_TYPES.get(instance or topo.instance_type or "")
    if where is None:
        chips = inst.chips if inst is not None else topo.chips
        where = placement(group_size, per_chip, per_chip * chips)
    n = group_size
    if kind in _REDUCE_PHASES or kind in _ONE_PHASE:
        phases = _REDUCE_PHASES.get(kind, 1)
        crossings = phases * (n - 1) / n
        hops = phases * _hops(algorithm(payload_bytes), n)
    else:  # broadcast, reduce, point-to-point: the payload crosses once
        crossings, hops = 1.0, 1
    link = spec.neuronlink_bytes_per_second / LINKS_PER_CHIP
    hop = HOP_SECONDS_INSIDE_NODE
    if where == "network":
        if inst is None or inst.efa_gbps is None:
            raise RuntimeError(f"a collective over {n} ranks spans instances, but no EFA bandwidth is known for "
                               f"instance type {instance or topo.instance_type!r}; set NEURON_SIM_INSTANCE_TYPE "
                               "to an instance listed in neuron_spec.hardware.INSTANCE_TYPES")
        link = min(link, inst.efa_gbps * 1e9 / 8 / inst.chips)
        hop = HOP_SECONDS_ACROSS_NODES
    elif where not in ("chip", "instance"):
        raise ValueError(f"where must be 'chip', 'instance' or 'network', got {where!r}")
    return (COLLECTIVE_LAUNCH_SECONDS + buckets(kind, payload_bytes) * hops * hop
            + crossings * payload_bytes / (link * LINK_EFFICIENCY))


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def charge(kind: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor], group_size: int,
           ranks: list[int] | None = None) -> None:
    """Queue the collective's simulated time on the current stream of each `neuron` device it touches; `ranks`
    (the group's global ranks, when known) place it, else a group of `group_size` consecutive ranks is assumed."""
    devices = {t.device.index or 0 for t in (*inputs, *outputs) if t.device.type == "neuron"}
    if not devices:
        return
    where = placement_of_ranks(ranks) if ranks else None
    seconds = collective_seconds(kind, max(_nbytes(inputs), _nbytes(outputs)), group_size, where=where)
    for index in devices:
        services.charge(index, seconds, LABEL_PREFIX + kind)


def is_collective_charge(name: str) -> bool:
    """Whether a charge named `name` (as a charge recorder sees it) is a collective's (`charge`)."""
    return name.startswith(LABEL_PREFIX)
