"""Simulated time of collectives, charged on the stream: the Neuron runtime's algorithms over the group's path.

Data really moves through Gloo on host memory; the device's clock must instead advance as if the chip's fabric
carried it, so profiles and `Event.elapsed_time` show what a Trainium job would see. The model
(`calibration.md` C1/C2/C4; SDK@HEAD `neuron-runtime/explore/{intranode,internode}-collective-comm.rst`):

    time = COLLECTIVE_LAUNCH_SECONDS + step latencies + bytes on each path / (path bandwidth x LINK_EFFICIENCY)

The launch is a standalone collective's: an eager c10d call (and each op nccom-test times, C1/C2) is an execution of
its own. A collective a compiled graph traced runs inside the graph's execution: the compiler emits a trigger
instruction (PTC2) in the engines' program, the runtime turns it into a write to the CC core at load time, and the
CC core advances through DMA rings built at load (SDK@HEAD `neuron-runtime/explore/compute-comm-overlap.rst`,
"Background"); it pays the step latencies and bytes, not the launch (`in_graph`).

Inside an instance (the group on one chip or one instance):

* a standalone collective's phase (an all-reduce has two: reduce-scatter, all-gather; the others one) moves each
  rank's n - 1 chunks one after another, each one DMA (the target's fixed DMA cost, 1.3 us, calibration.md §2) and
  one hop (`HOP_SECONDS_INSIDE_NODE`, C4), whatever the algorithm the runtime picks by size (`algorithm`: mesh
  below 1 MB, recursive halving-doubling to 56 MB, ring above): the points measured standalone (nccom-test on
  SDK 2.10: C1, C2, the 32-rank all-gather at 149-179 us) show no drop where a 32-rank stage changes algorithm;
* inside a compiled graph (the runtime's current collectives: the same all-gather in SDK 2.24's nccom-test docs,
  June 2025, 6.2-23 us; from SDK 2.28 the page says it runs its ops inside NEFFs it generates), all-reduce, all-gather and reduce-scatter take the algorithm's own steps
  (`_in_graph_phase_seconds`: mesh two steps a phase, a routed write through the rank's DMA queue and an
  intra-chip exchange; halving-doubling 1 + log2(chips); ring n - 1); all-to-all keeps n - 1 steps;
* the path is one NeuronLink link of a rank's chip (the chip's NeuronLink bandwidth over its `LINKS_PER_CHIP` torus
  links). Ranks on one chip: no published figure separates their path from a neighbour link, so it is priced as one
  (assumption; C1, the two cores of chip 0, is what it is checked on).

Across instances (X instances with Y ranks each), the runtime runs collectives hierarchically: an all-reduce is an
intra-node reduce-scatter over Y ranks, an inter-node all-reduce on Y parallel groups of X ranks (each on its 1/Y
of the buffer) and an intra-node all-gather; an all-gather runs the inter-node stage first, a reduce-scatter last;
an all-to-all regroups inside the instance and sends (X - 1)/X of each rank's buffer off it. The Y groups share the
instance's EFA: their bytes add up on its bandwidth, and their messages leave it one after another, each paying
the ~15 us inter-node hop (`HOP_SECONDS_ACROSS_NODES`, C4), so an inter-node phase costs Y x (X - 1) hops (C2: 8 B
cost 520 us = launch + 32 hops). Small all-reduces take the single-step mesh (each rank exchanges its whole buffer
with its counterparts, one inter-node phase, then the instance all-reduces) while its extra EFA bytes take less
than one hop, the runtime's rule; a buffer of fewer elements than the group has ranks is all-reduced in that one
inter-node phase alone (C2: 8-128 B cost 520-553 us; at 256 B, one element per rank, the intra-node stages
appear). On trn1 the flat ring over all ranks (channels over every EFA interface, 2 (n - 1) inter-node hops) is
taken where cheaper: large messages. Point-to-point, broadcast and reduce across instances leave through the
sending chip's EFA interface ("each EFA interface is connected to a different Trainium chip": the instance's EFA
over its chips).

As TorchNeuron's collectives, a payload moves in buckets of at most `TORCH_NEURONX_COLLECTIVE_BUCKETSIZE_IN_MB`
(default 512), at least `TORCH_NEURONX_COLLECTIVE_MIN_BUCKETS` of them; each bucket is a pass of its own, so it adds
one set of step latencies (the bandwidth term is the same). `NEURON_USE_SPLIT_ALLGATHER=0` /
`NEURON_USE_SPLIT_REDUCE_SCATTER=0` move an all-gather / reduce-scatter in one pass.
"""

from __future__ import annotations

import math

import torch

from neuron_device import services
from neuron_spec.hardware import INSTANCE_TYPES, Instance, Target, resolve_target

from . import envvars

__all__ = ["COLLECTIVE_LAUNCH_SECONDS", "HOP_SECONDS_ACROSS_NODES", "HOP_SECONDS_INSIDE_NODE", "LABEL_PREFIX",
           "LINK_EFFICIENCY", "TRANSFER_STREAM", "algorithm", "buckets", "charge", "charge_transfer",
           "collective_seconds", "is_collective_charge", "placement", "placement_of_ranks", "ranks_on_each_instance",
           "transfer_seconds"]

# Fitted on C1's plateau: a 2-rank fp32 all-reduce of 1-256 KiB takes 58-60 us whatever its size, minus its two
# transfers (one DMA and one hop each); C2's 8-64 B floor (520-525 us) is this plus 32 inter-node hops (+2.4 %).
COLLECTIVE_LAUNCH_SECONDS = 52.4e-6
# C4: 1-2 us per hop inside a node (the middle), ~15 us across nodes (EFA).
HOP_SECONDS_INSIDE_NODE = 1.5e-6
HOP_SECONDS_ACROSS_NODES = 15e-6
# Chips of trn1/trn2 instances are linked in a 2-D torus (trn{1,2}-arch.rst): four neighbours, one link each;
# a rank's traffic to one neighbour uses one link, a quarter of the chip's NeuronLink bandwidth (assumption).
LINKS_PER_CHIP = 4
# The share of a path's bandwidth a collective achieves (reduction, DMA descriptors, synchronisation), the same for
# NeuronLink and EFA. Fitted on the bandwidth-bound points of C1 (4 MiB - 1 GiB: 57-85 GB/s of a 96 GB/s trn1
# link) and C2 (16 MiB - 1 GiB: the flat ring over 800 Gbps EFA) together, balancing their largest errors
# (C1 4 MiB +17 %, C2 512 MiB -16.5 %).
LINK_EFFICIENCY = 0.65
# A collective's charge is named LABEL_PREFIX + its kind: a profiler's "collective" lane, a plan's communication.
LABEL_PREFIX = "c10d::"
# The stream of a device's point-to-point transfers: its DMA queue to other devices, apart from the compute streams
# (a negative id: `torch.neuron.Stream`'s pool never hands it out).
TRANSFER_STREAM = -1
MESH_BELOW_BYTES = 1_000_000  # C4: mesh below 1 MB ...
RING_ABOVE_BYTES = 56_000_000  # ... recursive halving-doubling up to 56 MB, ring above
FLAT_RING_TARGETS = frozenset({"trn1"})  # internode-collective-comm.rst: "We only enable Flat Ring on Trn1"

_ALLREDUCE = frozenset({"allreduce", "allreduce_coalesced"})
_ALLGATHER = frozenset({"allgather", "all_gather_single", "allgather_coalesced", "allgather_into_tensor_coalesced"})
_REDUCE_SCATTER = frozenset({"reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor_coalesced"})
_ALLTOALL = frozenset({"alltoall", "alltoall_base"})


def algorithm(payload_bytes: int) -> str:
    """The algorithm the Neuron runtime picks for a message of `payload_bytes` (C4)."""
    if payload_bytes < MESH_BELOW_BYTES:
        return "mesh"
    return "halving-doubling" if payload_bytes <= RING_ABOVE_BYTES else "ring"


_SPLIT = {envvars.SPLIT_ALLGATHER: tuple(_ALLGATHER), envvars.SPLIT_REDUCE_SCATTER: tuple(_REDUCE_SCATTER)}


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


def _machine() -> tuple[int, int]:
    """Logical cores per chip and per instance of this process's simulated machine."""
    topo = services.topology()
    per_chip = max(1, topo.target.physical_cores_per_chip // topo.lnc)
    inst = INSTANCE_TYPES.get(topo.instance_type or "")
    return per_chip, per_chip * (inst.chips if inst is not None else topo.chips)


def placement_of_ranks(ranks: list[int] | tuple[int, ...], cores_per_chip: int | None = None,
                       cores_per_instance: int | None = None) -> str:
    """Where the given global ranks live (torchrun's placement: consecutive ranks fill a chip, then an instance):
    one chip, one instance, or across instances. The sizes default to this process's simulated machine."""
    if cores_per_chip is None or cores_per_instance is None:
        cores_per_chip, cores_per_instance = _machine()
    if len({r // cores_per_chip for r in ranks}) == 1:
        return "chip"
    return "instance" if len({r // cores_per_instance for r in ranks}) == 1 else "network"


def ranks_on_each_instance(ranks: list[int] | tuple[int, ...], cores_per_instance: int | None = None) -> int:
    """The most ranks of the group on one instance (the Y of the runtime's hierarchical algorithms; groups are
    symmetric, internode-collective-comm.rst). `cores_per_instance` defaults to this process's simulated machine."""
    if cores_per_instance is None:
        cores_per_instance = _machine()[1]
    per_instance: dict[int, int] = {}
    for r in ranks:
        per_instance[r // cores_per_instance] = per_instance.get(r // cores_per_instance, 0) + 1
    return max(per_instance.values())


def _intra_phase_seconds(n: int, spec: Target) -> float:
    """Step latency of one standalone phase (reduce-scatter, all-gather, ...) over `n` ranks inside an instance, and
    of a hierarchical collective's intra-node stages: a rank moves its n - 1 chunks one after another, each one DMA
    (the target's fixed cost, calibration.md §2) and one hop (C4), whatever the algorithm (C2 shows no drop where a
    32-rank stage leaves mesh for halving-doubling at 1 MB)."""
    return (n - 1) * _step_seconds(spec)


def _step_seconds(spec: Target) -> float:
    """One step of a phase inside an instance: one DMA (the target's fixed cost, calibration.md §2) and one hop (C4)."""
    return spec.dma_fixed_ns * 1e-9 + HOP_SECONDS_INSIDE_NODE


def _link(spec: Target) -> float:
    """Effective bandwidth of a rank's NeuronLink path: one of its chip's torus links."""
    return spec.neuronlink_bytes_per_second / LINKS_PER_CHIP * LINK_EFFICIENCY


def _ring_seconds(n: int, phases: int, passes: int, step: float, payload_bytes: float, bandwidth: float,
                  launch: float = 0.0) -> float:
    """A ring collective over `n` ranks after `launch`: `phases` phases (an all-reduce's reduce-scatter and
    all-gather: 2) in `passes` buckets, each phase n - 1 steps of `step` seconds, and each phase moving (n - 1) / n of
    the payload at `bandwidth`. A standalone collective inside an instance (a step: one DMA and one hop), and trn1's
    flat ring over all ranks across instances (a step: one inter-node hop; the instance's EFA)."""
    return launch + passes * (phases * ((n - 1) * step)) + phases * (n - 1) / n * payload_bytes / bandwidth


def _in_graph_phase_seconds(chunk: float, n: int, per_chip: int, spec: Target) -> float:
    """One phase (reduce-scatter or all-gather; chunk: a rank's share of the buffer) over `n` consecutive ranks of
    one instance, inside a compiled graph, by the algorithm the runtime picks for the phase's buffer (C4,
    intranode-collective-comm.rst), each step one DMA (§2) and one hop (C4):

    * mesh (below 1 MB): a routed write to every other chip of the group (the rank writes its chip's chunks to
      its share of them, (chips - 1) chunks, through its one DMA queue: the target's per-engine bandwidth), then an
      intra-chip exchange of the chunks received, (ranks per chip - 1) x chips chunks over the on-chip path; a
      group on one chip has the exchange alone;
    * halving-doubling (to 56 MB): the intra-chip step and log2(chips) exchanges along the torus axes;
    * ring (above): n - 1 steps (the standalone model's).
    The last two move (n - 1) chunks over one link, as the standalone model does."""
    per_chip = min(per_chip, n)
    chips = math.ceil(n / per_chip)
    step = _step_seconds(spec)
    exchange = (per_chip - 1) * chips * chunk / _link(spec)
    kind = algorithm(round(chunk * n))
    if kind == "mesh":
        if chips == 1:
            return step + exchange
        queue = spec.dma_bytes_per_ns_per_engine * 1e9
        return 2 * step + (chips - 1) * chunk / queue + exchange
    steps = 1 + math.ceil(math.log2(chips)) if kind == "halving-doubling" else n - 1
    return steps * step + (n - 1) * chunk / _link(spec)


def _inter_phase_seconds(x: int, y: int) -> float:
    """Step latency of one phase over `x` instances run by `y` parallel groups: each rank sends its x - 1 chunks
    across, and the instance's messages leave it one after another, one inter-node hop each (C2, C4)."""
    return y * (x - 1) * HOP_SECONDS_ACROSS_NODES


def _across_seconds(kind: str, payload_bytes: int, n: int, y: int, spec: Target, inst: Instance,
                    itemsize: int) -> float:
    """Seconds of a collective over `n` ranks on n / y instances, y ranks each, without the launch."""
    x = max(2, math.ceil(n / y))
    y = min(y, math.ceil(n / x))
    link = _link(spec)
    efa = inst.efa_gbps * 1e9 / 8 * LINK_EFFICIENCY  # the instance's whole EFA, shared by its ranks
    passes = buckets(kind, payload_bytes)
    b = payload_bytes
    if kind in _ALLREDUCE:
        if b < n * itemsize:  # fewer elements than ranks: one inter-node step, no intra-node stage (C2)
            return passes * _inter_phase_seconds(x, y) + y * (x - 1) * b / efa
        intra = 2 * (passes * _intra_phase_seconds(y, spec) + (y - 1) / y * b / link)
        hierarchical = intra + passes * 2 * _inter_phase_seconds(x, y) + 2 * (x - 1) / x * b / efa
        # single-step: every rank's whole buffer to its counterparts (one step), then the instance all-reduces
        single = intra + passes * _inter_phase_seconds(x, y) + y * (x - 1) * b / efa
        extra = (y * (x - 1) - 2 * (x - 1) / x) * b / efa
        best = single if extra < HOP_SECONDS_ACROSS_NODES else hierarchical
        if spec.name in FLAT_RING_TARGETS:
            flat = _ring_seconds(n, 2, passes, HOP_SECONDS_ACROSS_NODES, b, efa)
            best = min(best, flat)
        return best
    if kind in _ALLGATHER or kind in _REDUCE_SCATTER:  # payload: the larger of input and output, n chunks
        return (passes * (_intra_phase_seconds(y, spec) + _inter_phase_seconds(x, y))
                + (y - 1) / y * b / link + (x - 1) / x * b / efa)
    if kind in _ALLTOALL:  # regroup inside the instance, then one message to each other instance per rank
        return (passes * (_intra_phase_seconds(y, spec) + _inter_phase_seconds(x, y))
                + (y - 1) / n * b / link + y * (x - 1) / x * b / efa)
    # broadcast, reduce, point-to-point: the payload crosses once, through the sender chip's EFA interface
    chip = min(spec.neuronlink_bytes_per_second / LINKS_PER_CHIP, inst.efa_gbps * 1e9 / 8 / inst.chips)
    return HOP_SECONDS_ACROSS_NODES + b / (chip * LINK_EFFICIENCY)


def collective_seconds(kind: str, payload_bytes: int, group_size: int, target: str | None = None,
                       where: str | None = None, instance: str | None = None,
                       ranks_per_instance: int | None = None, itemsize: int = 1, in_graph: bool = False) -> float:
    """Simulated seconds of one collective `kind` whose per-rank payload (the larger of input and output) is given.

    `where` ("chip", "instance" or "network") defaults to the placement of `group_size` ranks on this process's
    simulated machine; `instance` (an instance type) supplies the EFA bandwidth of network paths. Across instances,
    `ranks_per_instance` is the group's ranks on each instance (default: consecutive ranks filling instances, one
    rank per logical core) and `itemsize` the bytes of one element (a buffer of fewer elements than ranks is
    all-reduced in one step). `in_graph`: the collective runs inside a compiled graph's execution (triggered by
    its engines, module docstring), so it pays no launch of its own.
    """
    if group_size <= 1:
        return 0.0
    topo = services.topology()
    spec = topo.target if target is None else resolve_target(target)
    lnc = topo.lnc if spec is topo.target else spec.default_lnc
    per_chip = max(1, spec.physical_cores_per_chip // lnc)
    inst = INSTANCE_TYPES.get(instance or topo.instance_type or "")
    chips = inst.chips if inst is not None else topo.chips
    if where is None:
        where = placement(group_size, per_chip, per_chip * chips)
    n = group_size
    launch = 0.0 if in_graph else COLLECTIVE_LAUNCH_SECONDS
    if where == "network":
        if inst is None or inst.efa_gbps is None:
            raise RuntimeError(f"a collective over {n} ranks spans instances, but no EFA bandwidth is known for "
                               f"instance type {instance or topo.instance_type!r}; set NEURON_SIM_INSTANCE_TYPE "
                               "to an instance listed in neuron_spec.hardware.INSTANCE_TYPES")
        y = ranks_per_instance if ranks_per_instance is not None else min(per_chip * chips, max(1, n // 2))
        return launch + _across_seconds(kind, payload_bytes, n, y, spec, inst, itemsize)
    if where not in ("chip", "instance"):
        raise ValueError(f"where must be 'chip', 'instance' or 'network', got {where!r}")
    passes = buckets(kind, payload_bytes)
    if kind in _ALLREDUCE or kind in _ALLGATHER or kind in _REDUCE_SCATTER or kind in _ALLTOALL:
        phases = 2 if kind in _ALLREDUCE else 1
        if in_graph and kind not in _ALLTOALL:
            return passes * phases * _in_graph_phase_seconds(payload_bytes / passes / n, n, per_chip, spec)
        return _ring_seconds(n, phases, passes, _step_seconds(spec), payload_bytes, _link(spec), launch)
    # broadcast, reduce, point-to-point: the payload crosses once
    return launch + passes * HOP_SECONDS_INSIDE_NODE + payload_bytes / _link(spec)


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def charge(kind: str, inputs: list[torch.Tensor], outputs: list[torch.Tensor], group_size: int,
           ranks: list[int] | None = None) -> None:
    """Queue the collective's simulated time on the current stream of each `neuron` device it touches; `ranks`
    (the group's global ranks, when known) place it, else a group of `group_size` consecutive ranks is assumed."""
    devices = {t.device.index or 0 for t in (*inputs, *outputs) if t.device.type == "neuron"}
    in_graph = services.host_code_device() is not None  # a compiled graph's collective: inside its execution
    if not devices and in_graph:  # on host aliases
        devices = {services.host_code_device()}
    if not devices:
        return
    where = placement_of_ranks(ranks) if ranks else None
    per_instance = ranks_on_each_instance(ranks) if where == "network" else None
    itemsize = max((t.element_size() for t in (*inputs, *outputs)), default=1)
    seconds = collective_seconds(kind, max(_nbytes(inputs), _nbytes(outputs)), group_size, where=where,
                                 ranks_per_instance=per_instance, itemsize=itemsize, in_graph=in_graph)
    for index in devices:
        services.charge(index, seconds, LABEL_PREFIX + kind)


def transfer_seconds(nbytes: int, ranks: tuple[int, int] | None) -> float:
    """One point-to-point transfer of `nbytes` between two global ranks (placed as torchrun places them; None: two
    neighbouring ranks), the cost model's send; nothing between a rank and itself."""
    if ranks is not None and ranks[0] == ranks[1]:
        return 0.0
    return collective_seconds("send", nbytes, 2, where=placement_of_ranks(ranks) if ranks is not None else None)


def charge_transfer(tensors: list[torch.Tensor], ranks: tuple[int, int] | None) -> tuple[int, float] | None:
    """Queue a point-to-point transfer of `tensors` (the sender's) on its device's `TRANSFER_STREAM`, after the
    work the current stream has queued (the data's producer) and the transfers queued before; return (device
    index, completion time), or None for tensors on no `neuron` device (they have no timeline)."""
    devices = {t.device.index or 0 for t in tensors if t.device.type == "neuron"}
    if not devices:
        return None
    (index,) = devices  # Gloo's send takes one tensor
    line = services.timeline(index)
    line.wait_until(TRANSFER_STREAM, line.ready(services.current_stream_id(index)))
    seconds = transfer_seconds(_nbytes(tensors), ranks)
    return index, services.charge(index, seconds, LABEL_PREFIX + "send", stream=TRANSFER_STREAM)


def is_collective_charge(name: str) -> bool:
    """Whether a charge named `name` (as a charge recorder sees it) is a collective's (`charge`)."""
    return name.startswith(LABEL_PREFIX)
