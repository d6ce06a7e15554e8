"""The collective cost model: the runtime's algorithm by size, the path by placement (calibration.md C1/C4)."""

from __future__ import annotations

import itertools

import pytest

from neuron_distributed import costs


def test_algorithm_follows_the_runtime_thresholds():
    assert costs.algorithm(64 * 1024) == "mesh"
    assert costs.algorithm(4 << 20) == "halving-doubling"
    assert costs.algorithm(64 << 20) == "ring"


def test_placement_by_group_size():
    assert costs.placement(2, cores_per_chip=2, cores_per_instance=32) == "chip"
    assert costs.placement(16, cores_per_chip=2, cores_per_instance=32) == "instance"
    assert costs.placement(64, cores_per_chip=2, cores_per_instance=32) == "network"


def test_placement_by_the_group_s_ranks():
    """A strided group is placed by where its ranks are: a 3-D mesh's DP group (every 256th rank) spans instances
    though it has 4 ranks; its TP group (32 consecutive ranks) is one instance."""
    assert costs.placement_of_ranks([0, 256, 512, 768], cores_per_chip=2, cores_per_instance=32) == "network"
    assert costs.placement_of_ranks(list(range(32, 64)), cores_per_chip=2, cores_per_instance=32) == "instance"
    assert costs.placement_of_ranks([6, 7], cores_per_chip=2, cores_per_instance=32) == "chip"
    assert costs.placement_of_ranks([7, 8], cores_per_chip=2, cores_per_instance=32) == "instance"


def test_small_all_reduce_is_launch_bound_and_large_one_bandwidth_bound():
    small = costs.collective_seconds("allreduce", 1024, 2, target="trn1", where="chip")
    big = costs.collective_seconds("allreduce", 1 << 30, 2, target="trn1", where="chip")
    transfer = 1.3e-6 + costs.HOP_SECONDS_INSIDE_NODE  # a mesh write to the one peer: one DMA and one hop
    assert small == pytest.approx(costs.COLLECTIVE_LAUNCH_SECONDS + 2 * transfer, rel=1e-3)
    link = 384e9 / costs.LINKS_PER_CHIP * costs.LINK_EFFICIENCY
    buckets = costs.buckets("allreduce", 1 << 30)  # 1 GiB moves in two 512 MiB buckets, two hops each
    assert big == pytest.approx(costs.COLLECTIVE_LAUNCH_SECONDS + buckets * 2 * transfer
                                + (1 << 30) / link)


def test_across_instances_pays_efa_hops_and_bandwidth():
    inside = costs.collective_seconds("allreduce", 64 << 20, 32, target="trn1", where="instance",
                                      instance="trn1.32xlarge")
    across = costs.collective_seconds("allreduce", 64 << 20, 64, target="trn1", where="network",
                                      instance="trn1.32xlarge")
    assert across > inside
    with pytest.raises(ValueError, match="where must be"):
        costs.collective_seconds("allreduce", 1024, 2, target="trn1", where="moon")


@pytest.mark.parametrize("kind", ["allreduce", "allgather", "reduce_scatter", "alltoall", "send"])
def test_spanning_instances_without_an_efa_figure_is_refused(kind: str):
    with pytest.raises(RuntimeError, match=r"no EFA bandwidth is known for instance type 'trn1\.2xlarge'"):
        costs.collective_seconds(kind, 1024, 64, target="trn1", where="network", instance="trn1.2xlarge")


def _across(kind: str, nbytes: int, n: int = 64, per_instance: int | None = 32, **kw) -> float:
    return costs.collective_seconds(kind, nbytes, n, target="trn1", where="network", instance="trn1.32xlarge",
                                    ranks_per_instance=per_instance, **kw)


SIZES = [4 << k for k in range(0, 29, 2)]  # 4 B ... 1 GiB


@pytest.mark.parametrize("kind", ["allreduce", "allgather", "reduce_scatter", "alltoall", "send"])
def test_across_instances_grows_with_size(kind: str):
    times = [_across(kind, size, itemsize=4) for size in SIZES]
    assert all(a <= b for a, b in itertools.pairwise(times)), times
    assert times[-1] > 10 * times[0]  # a GiB is bandwidth-bound, 4 B latency-bound


def test_all_reduce_across_instances_uses_the_whole_efa_not_one_chip_s_share():
    """The old pricing sent every byte of the 64-rank all-reduce through one chip's 1/16 of the instance's EFA:
    at least 2 (n-1)/n x 1 GiB / (100 GB/s / 16) = 0.34 s. The hierarchical algorithm moves 1 GiB over each
    instance's whole EFA (plus NeuronLink inside), and is bounded below by that alone."""
    gib = 1 << 30
    efa = 800e9 / 8
    one_chip_share = 2 * 63 / 64 * gib / (efa / 16)
    seconds = _across("allreduce", gib)
    assert gib / efa < seconds < one_chip_share / 4


def test_inter_node_steps_are_paid_per_rank_of_the_instance():
    """An inter-node step's messages leave the instance one after another: a tiny all-reduce (fewer elements than
    ranks: one step) costs one 15 us hop per rank of the instance."""
    tiny = {y: _across("allreduce", 8, n=2 * y, per_instance=y, itemsize=4) for y in (1, 8, 32)}
    assert tiny[32] - tiny[8] == pytest.approx(24 * costs.HOP_SECONDS_ACROSS_NODES, rel=1e-3)
    assert tiny[1] == pytest.approx(costs.COLLECTIVE_LAUNCH_SECONDS + costs.HOP_SECONDS_ACROSS_NODES, rel=1e-3)


def test_all_reduce_across_instances_switches_to_two_inter_node_steps_when_single_step_costs_more_than_a_hop():
    """Single-step sends every rank's whole buffer across; once its extra EFA bytes take longer than one hop, the
    runtime runs reduce-scatter + all-gather across (two steps of 32 messages each)."""
    small, large = _across("allreduce", 1024, itemsize=4), _across("allreduce", 256 << 10, itemsize=4)
    assert large - small == pytest.approx(32 * costs.HOP_SECONDS_ACROSS_NODES, rel=0.05)


def test_all_gather_and_reduce_scatter_across_instances_cost_the_same_and_less_than_all_reduce():
    for size in (64 << 10, 64 << 20):
        gather, scatter = _across("allgather", size), _across("reduce_scatter", size)
        assert gather == pytest.approx(scatter)
        assert gather < _across("allreduce", size, itemsize=4)


def test_all_to_all_across_instances_sends_half_of_each_buffer_over_the_shared_efa():
    """Each of the instance's 32 ranks sends (X-1)/X = 1/2 of its 1 GiB off the instance: 16 GiB over its EFA."""
    gib = 1 << 30
    seconds = _across("alltoall", gib)
    efa = 800e9 / 8 * costs.LINK_EFFICIENCY
    assert seconds == pytest.approx(32 * gib / 2 / efa, rel=0.05)


def test_point_to_point_across_instances_uses_the_sender_chip_s_interface():
    """A pipeline stage's send to the next instance: one 15 us hop and its chip's 1/16 of the instance's EFA."""
    nbytes = 64 << 20
    seconds = costs.collective_seconds("send", nbytes, 2, target="trn1", where="network", instance="trn1.32xlarge")
    chip = 800e9 / 8 / 16 * costs.LINK_EFFICIENCY
    assert seconds == pytest.approx(costs.COLLECTIVE_LAUNCH_SECONDS + costs.HOP_SECONDS_ACROSS_NODES + nbytes / chip)


def test_strided_group_has_one_rank_per_instance():
    """A data-parallel group of every 256th rank has one rank on each instance: no intra-node stage."""
    assert costs.ranks_on_each_instance([0, 256, 512, 768], cores_per_instance=32) == 1
    assert costs.ranks_on_each_instance(list(range(64)), cores_per_instance=32) == 32
    mib = 1 << 20  # 4 instances, one rank each: two inter-node phases of 3 hops, 2 x 3/4 MiB over the EFA
    efa = 800e9 / 8 * costs.LINK_EFFICIENCY
    expected = costs.COLLECTIVE_LAUNCH_SECONDS + 2 * 3 * costs.HOP_SECONDS_ACROSS_NODES + 2 * 3 / 4 * mib / efa
    assert _across("allreduce", mib, n=4, per_instance=1) == pytest.approx(expected)


def test_one_rank_costs_nothing():
    assert costs.collective_seconds("allreduce", 1 << 20, 1) == 0.0


def test_charge_places_a_group_by_its_ranks_across_instances(monkeypatch):
    """`charge` with the group's global ranks: 64 consecutive ranks on trn1.32xlarge are 2 instances of 32 (the
    hierarchical all-reduce), every 32nd rank is one rank per instance; each is charged its own time."""
    import torch

    from neuron_spec.machine import read_topology

    monkeypatch.setattr(costs.services, "topology", lambda: read_topology({"NEURON_SIM_INSTANCE_TYPE": "trn1.32xlarge"}))
    charged = []
    monkeypatch.setattr(costs.services, "charge", lambda index, seconds, name: charged.append((seconds, name)))
    grad = torch.empty(1 << 20, device="neuron")  # 4 MiB fp32
    costs.charge("allreduce", [grad], [grad], 64, list(range(64)))
    costs.charge("allreduce", [grad], [grad], 2, [0, 32])
    (packed, name), (strided, _) = charged
    assert name == "c10d::allreduce"
    assert packed == pytest.approx(_across("allreduce", 4 << 20, n=64, per_instance=32, itemsize=4))
    assert strided == pytest.approx(_across("allreduce", 4 << 20, n=2, per_instance=1, itemsize=4))


def test_collective_inside_a_compiled_graph_pays_no_launch_of_its_own(monkeypatch):
    """A collective a compiled graph traced is triggered by the graph's engines inside the graph's execution
    (compute-comm-overlap.rst: PTC2 -> a write to the CC core, DMA rings built at load): it pays its steps and
    bytes but not the standalone launch an eager c10d call (or an nccom-test op) pays; placed the same way."""
    import torch

    from neuron_spec.machine import read_topology

    topology = read_topology({"NEURON_SIM_INSTANCE_TYPE": "trn1.32xlarge"})
    monkeypatch.setattr(costs.services, "topology", lambda: topology)
    eager = costs.collective_seconds("allreduce", 8192, 64, target="trn1", where="network", instance="trn1.32xlarge",
                                     itemsize=2)
    graph = costs.collective_seconds("allreduce", 8192, 64, target="trn1", where="network", instance="trn1.32xlarge",
                                     itemsize=2, in_graph=True)
    assert eager - graph == pytest.approx(costs.COLLECTIVE_LAUNCH_SECONDS)
    charged = []
    monkeypatch.setattr(costs.services, "charge", lambda index, seconds, name: charged.append(seconds))
    hidden = torch.empty(4096, dtype=torch.bfloat16)  # a host alias, as a compiled graph's host code holds it
    for ranks in (list(range(32)), list(range(64))):
        with costs.services.running_host_code(0):
            costs.charge("allreduce", [hidden], [hidden], len(ranks), ranks)
        costs.charge("allreduce", [hidden.to("neuron")], [hidden.to("neuron")], len(ranks), ranks)
    inside_graph, inside_eager, across_graph, across_eager = charged
    assert inside_graph == pytest.approx(costs.collective_seconds("allreduce", 8192, 32, target="trn1",
                                                                  where="instance", in_graph=True))
    assert inside_eager == pytest.approx(costs.collective_seconds("allreduce", 8192, 32, target="trn1",
                                                                  where="instance"))
    assert across_eager - across_graph == pytest.approx(costs.COLLECTIVE_LAUNCH_SECONDS)


STEP = 1.3e-6 + costs.HOP_SECONDS_INSIDE_NODE  # one DMA (calibration.md §2) and one hop inside a node (C4)
LINK = 384e9 / costs.LINKS_PER_CHIP * costs.LINK_EFFICIENCY  # one trn1 NeuronLink link, effective
QUEUE = 17e9  # one trn1 DMA engine (nki-dma-bandwidth-guide.rst)


def _inside(kind: str, nbytes: int, n: int, in_graph: bool) -> float:
    return costs.collective_seconds(kind, nbytes, n, target="trn1", where="instance" if n > 2 else "chip",
                                    instance="trn1.32xlarge", in_graph=in_graph)


def test_standalone_collective_inside_an_instance_moves_its_chunks_one_after_another():
    """A standalone collective (eager c10d call, nccom-test's 2023 runs: C1, the 32-rank all-gather at 149-179 us)
    keeps the launch and n - 1 steps a phase, whatever the algorithm."""
    assert _inside("allreduce", 8192, 32, in_graph=False) == pytest.approx(
        costs.COLLECTIVE_LAUNCH_SECONDS + 2 * 31 * STEP + 2 * 31 / 32 * 8192 / LINK)
    assert _inside("allgather", 1024, 32, in_graph=False) == pytest.approx(
        costs.COLLECTIVE_LAUNCH_SECONDS + 31 * STEP + 31 / 32 * 1024 / LINK)


def test_small_collective_in_a_compiled_graph_runs_the_mesh_steps():
    """Inside a graph the runtime's mesh runs (intranode-collective-comm.rst): a phase is a routed write to the
    other chips (a rank writes (chips - 1) chunks through its DMA queue) and an intra-chip exchange, two steps
    whatever the ranks; E4's 8 KiB all-reduce over 32 ranks (16 chips): 4 steps, not 62, and no launch."""
    chunk = 8192 / 32
    phase = 2 * STEP + 15 * chunk / QUEUE + 16 * chunk / LINK
    assert _inside("allreduce", 8192, 32, in_graph=True) == pytest.approx(2 * phase)
    assert _inside("allreduce", 8192, 32, in_graph=False) - _inside("allreduce", 8192, 32, in_graph=True) > (
        costs.COLLECTIVE_LAUNCH_SECONDS + 50 * STEP)
    # O(1) latency: 8 and 32 ranks differ only by their bytes
    assert _inside("allreduce", 64, 8, in_graph=True) == pytest.approx(_inside("allreduce", 64, 32, in_graph=True),
                                                                       rel=1e-3)
    # on one chip the exchange alone: one step a phase
    assert _inside("allreduce", 1024, 2, in_graph=True) == pytest.approx(2 * (STEP + 512 / LINK))


def test_in_graph_all_gather_rises_with_the_routed_writes_of_one_dma_queue():
    """nccom-test's 32-rank all-gather inside NEFFs (SDK 2.24's docs: 6.16 / 8.17 / 23.16 us at 1 / 64 / 512 KiB) is
    flat where the two steps dominate and rises by a rank's routed writes, 15 chunks through one DMA engine."""
    small, mid, big = (_inside("allgather", size, 32, in_graph=True) for size in (1024, 64 * 1024, 512 * 1024))
    assert small == pytest.approx(6.16e-6, rel=0.10)
    assert big - mid == pytest.approx(15 * (16384 - 2048) / QUEUE + 16 * (16384 - 2048) / LINK)
    assert big == pytest.approx(23.16e-6, rel=0.10)


def test_mid_size_collective_in_a_compiled_graph_runs_halving_doubling():
    """1-56 MB: the intra-chip step and log2(chips) exchanges a phase (O(log n)), the bytes over one link."""
    nbytes = 4 << 20
    for n, steps in ((32, 1 + 4), (8, 1 + 2)):
        assert _inside("reduce_scatter", nbytes, n, in_graph=True) == pytest.approx(
            steps * STEP + (n - 1) / n * nbytes / LINK)
    ring = 64 << 20  # above 56 MB: the ring's n - 1 steps, as standalone, without the launch
    assert _inside("allreduce", ring, 32, in_graph=True) == pytest.approx(
        _inside("allreduce", ring, 32, in_graph=False) - costs.COLLECTIVE_LAUNCH_SECONDS)
