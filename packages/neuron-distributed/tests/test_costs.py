"""The collective cost model: the runtime's algorithm by size, the path by placement (calibration.md C1/C4)."""

from __future__ import annotations

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
    assert small == pytest.approx(costs.COLLECTIVE_LAUNCH_SECONDS + 2 * costs.HOP_SECONDS_INSIDE_NODE, rel=1e-3)
    link = 384e9 / costs.LINKS_PER_CHIP * costs.LINK_EFFICIENCY
    buckets = costs.buckets("allreduce", 1 << 30)  # 1 GiB moves in two 512 MiB buckets, two hops each
    assert big == pytest.approx(costs.COLLECTIVE_LAUNCH_SECONDS + buckets * 2 * costs.HOP_SECONDS_INSIDE_NODE
                                + (1 << 30) / link)


def test_across_instances_pays_efa_hops_and_bandwidth():
    inside = costs.collective_seconds("allreduce", 64 << 20, 64, target="trn1", where="instance",
                                      instance="trn1.32xlarge")
    across = costs.collective_seconds("allreduce", 64 << 20, 64, target="trn1", where="network",
                                      instance="trn1.32xlarge")
    assert across > inside
    with pytest.raises(RuntimeError, match="no EFA bandwidth"):
        costs.collective_seconds("allreduce", 1024, 64, target="trn1", where="network", instance="trn1.2xlarge")
    with pytest.raises(ValueError, match="where must be"):
        costs.collective_seconds("allreduce", 1024, 2, target="trn1", where="moon")


def test_one_rank_costs_nothing():
    assert costs.collective_seconds("allreduce", 1 << 20, 1) == 0.0
