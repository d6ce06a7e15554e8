"""TorchNeuron's collective variables in the cost model: bucket size, minimum buckets, split all-gather and
reduce-scatter (each bucket is one more pass, so one more set of hop latencies)."""

from __future__ import annotations

import pytest

from neuron_distributed import costs

MB = 2**20


def test_default_is_one_bucket_per_512_mb() -> None:
    assert costs.buckets("allreduce", 100 * MB) == 1
    assert costs.buckets("allreduce", 1025 * MB) == 3


def test_bucket_size_and_minimum_buckets(monkeypatch) -> None:
    one = costs.collective_seconds("allreduce", 64 * MB, 4, where="instance")
    monkeypatch.setenv("TORCH_NEURONX_COLLECTIVE_BUCKETSIZE_IN_MB", "16")
    assert costs.buckets("allreduce", 64 * MB) == 4
    four = costs.collective_seconds("allreduce", 64 * MB, 4, where="instance")
    transfers = 2 * (4 - 1)  # an all-reduce: two phases of n - 1 chunk transfers, one DMA and one hop each
    per_pass = transfers * (1.3e-6 + costs.HOP_SECONDS_INSIDE_NODE)
    assert four - one == pytest.approx(3 * per_pass)  # the bandwidth term is the same
    monkeypatch.setenv("TORCH_NEURONX_COLLECTIVE_MIN_BUCKETS", "8")
    assert costs.buckets("allreduce", 1) == 8


@pytest.mark.parametrize("name, kind", [("NEURON_USE_SPLIT_ALLGATHER", "allgather"),
                                        ("NEURON_USE_SPLIT_REDUCE_SCATTER", "reduce_scatter")])
def test_split_switch_off_moves_the_collective_in_one_pass(name: str, kind: str, monkeypatch) -> None:
    monkeypatch.setenv("TORCH_NEURONX_COLLECTIVE_BUCKETSIZE_IN_MB", "1")
    assert costs.buckets(kind, 10 * MB) == 10
    monkeypatch.setenv(name, "0")
    assert costs.buckets(kind, 10 * MB) == 1
    assert costs.buckets("allreduce", 10 * MB) == 10  # the other collectives still split


def test_bad_bucket_size_names_the_variable(monkeypatch) -> None:
    monkeypatch.setenv("TORCH_NEURONX_COLLECTIVE_BUCKETSIZE_IN_MB", "big")
    with pytest.raises(ValueError, match="TORCH_NEURONX_COLLECTIVE_BUCKETSIZE_IN_MB='big' is invalid"):
        costs.buckets("allreduce", MB)
