"""Memory statistics (`torch.neuron.memory_*`): real accounting of device storage."""

from __future__ import annotations

import gc

import torch


def test_allocation_and_free_are_counted():
    gc.collect()
    base = torch.neuron.memory_allocated()
    t = torch.empty(1024, dtype=torch.float32, device="neuron")
    assert torch.neuron.memory_allocated() == base + 4096
    del t
    gc.collect()
    assert torch.neuron.memory_allocated() == base


def test_peak_and_reset():
    gc.collect()
    base = torch.neuron.memory_allocated()
    torch.neuron.reset_peak_memory_stats()
    assert torch.neuron.max_memory_allocated() == base
    big = torch.zeros(10_000, device="neuron")
    del big
    gc.collect()
    assert torch.neuron.max_memory_allocated() >= base + 40_000
    torch.neuron.reset_peak_memory_stats()
    assert torch.neuron.max_memory_allocated() == torch.neuron.memory_allocated()


def test_stats_are_per_device():
    gc.collect()
    before = [torch.neuron.memory_allocated(i) for i in range(2)]
    t = torch.empty(256, dtype=torch.uint8, device="neuron:1")
    assert torch.neuron.memory_allocated(0) == before[0]
    assert torch.neuron.memory_allocated("neuron:1") == before[1] + 256
    del t


def test_op_results_are_counted():
    gc.collect()
    a = torch.ones(1000, device="neuron")
    base = torch.neuron.memory_allocated()
    b = a * 2
    assert torch.neuron.memory_allocated() == base + 4000
    del b
    gc.collect()
    assert torch.neuron.memory_allocated() == base


def test_empty_cache_keeps_live_memory():
    t = torch.ones(100, device="neuron")
    before = torch.neuron.memory_allocated()
    torch.neuron.empty_cache()
    assert torch.neuron.memory_allocated() == before
    assert torch.equal(t.cpu(), torch.ones(100))
