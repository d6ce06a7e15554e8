"""Compile time (`services.compiling`): the ops a compiler runs on the device (Inductor's pattern examples, its
constant folding) are the compiler's, which on Trainium runs on the host. They run, and charge the program no time,
no op-ledger entry (executed ops and their call counts included), no CPU fallback and no memory; the program's own
work around and beside them is charged as ever."""

from __future__ import annotations

import gc
import threading
import warnings

import pytest
import torch

from neuron_device import services
from neuron_device.adaptive_eager import queue as adaptive_eager
from neuron_device.simulation import ledger

DEVICE = 3  # a device the other tests of the process leave alone


def _figures(index: int = DEVICE) -> dict:
    """Everything of device `index` a program's report reads: its streams' clocks, busy time and host position,
    the allocator's statistics, and the op ledger's launches (all devices')."""
    line = services.timeline(index)  # (flushes adaptive eager's queue)
    launches = sorted((launch.name, launch.calls, launch.seconds) for launch in ledger.launches())
    return {"clocks": dict(line.clocks), "busy": dict(line.busy), "host": line.host, "launches": launches,
            "memory": torch.neuron.memory_stats(index)}


def test_device_work_at_compile_time_runs_and_charges_nothing():
    gc.collect()
    device = f"neuron:{DEVICE}"
    before = _figures()
    with services.compiling():
        made = torch.tensor([1.0, 2.0, 3.0], device=device)  # as Inductor's pattern examples are made
        doubled = made * 2
        doubled.fill_(4.0)  # as constant folding fills a uniform value
        assert doubled.sum().item() == 12.0
        big = torch.empty(1 << 20, device=device)  # a new segment, in a real run
        assert torch.equal(made.cpu(), torch.tensor([1.0, 2.0, 3.0]))
    assert _figures() == before
    del doubled, big
    gc.collect()
    assert _figures() == before  # freeing what compile time made frees nothing of the program's
    made + 1  # the program's op on it, after the block: charged
    after = _figures()
    assert after["busy"].get(0, 0.0) > before["busy"].get(0, 0.0) and after["launches"] != before["launches"]


def _tracking() -> tuple:
    """The op ledger's records of which ops ran: call counts, executed ops, CPU fallbacks."""
    return dict(ledger.executed_ops), ledger.get_executed_ops(), ledger.get_fallback_ops()


@pytest.mark.parametrize("strict", [False, True], ids=["fallback_enabled", "fallback_disabled"])
def test_ops_at_compile_time_are_no_executed_ops_and_no_fallbacks(monkeypatch, strict):
    """A compiler's op on the device, native (a copy, a clone) or one that falls back to the CPU in a program, counts
    no call, is no executed op, and is no fallback: no record, no warning, and no error in strict mode."""
    if strict:
        monkeypatch.setenv("NEURON_FALLBACK_ENABLED", "0")
    ledger.clear_op_tracking()
    device = f"neuron:{DEVICE}"
    matrix = torch.tensor([[2.0, 1.0], [1.0, 3.0]], device=device)
    before = _tracking()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback's warning fails the test
        with services.compiling():
            values, _ = torch.kthvalue(matrix, 1)  # a CPU fallback in a program (test_fallback_reporting.py)
            clone = matrix.clone()
            assert torch.equal(values.cpu(), torch.tensor([1.0, 1.0])) and torch.equal(clone.cpu(), matrix.cpu())
    assert _tracking() == before
    matrix.clone()  # the program's op, after the block: counted
    calls, executed, _ = _tracking()
    assert calls.get("aten::clone", 0) == before[0].get("aten::clone", 0) + 1 and "aten::clone" in executed


def test_the_programs_memory_freed_at_compile_time_is_freed():
    gc.collect()
    base = torch.neuron.memory_allocated(DEVICE)
    program = torch.empty(1000, device=f"neuron:{DEVICE}")
    assert torch.neuron.memory_allocated(DEVICE) == base + 4096
    with services.compiling():
        del program
        gc.collect()
    assert torch.neuron.memory_allocated(DEVICE) == base


def test_another_threads_ops_during_compile_time_are_charged():
    """Compile time is the compiling thread's (a context variable), not the process's."""
    before = _figures()
    entered, done = threading.Event(), threading.Event()

    def program() -> None:
        entered.wait()
        torch.ones(8, device=f"neuron:{DEVICE}") * 3
        done.set()

    worker = threading.Thread(target=program)
    worker.start()
    with services.compiling():
        entered.set()
        assert done.wait(60)
    worker.join()
    after = _figures()
    assert after["busy"].get(0, 0.0) > before["busy"].get(0, 0.0)
    assert torch.neuron.memory_stats(DEVICE)["allocation.all.allocated"] > before["memory"]["allocation.all.allocated"]


@pytest.mark.all_wheels  # adaptive eager hands repeated runs to neuron-compile's fuser when it is installed
def test_ops_queued_before_compile_time_are_the_programs_and_those_queued_in_it_are_not(queued):
    a = torch.ones(64, device=f"neuron:{DEVICE}")
    before = _figures()
    b = a + a
    assert adaptive_eager.pending_ops() == 1
    with services.compiling():
        assert adaptive_eager.pending_ops() == 0  # run, and charged, at the start of the block
        charged, tracked = _figures(), _tracking()
        c = a * 3
        assert adaptive_eager.pending_ops() == 1
    assert adaptive_eager.pending_ops() == 0  # run, uncharged, at its end
    assert charged["busy"].get(0, 0.0) > before["busy"].get(0, 0.0)
    assert _figures() == charged and _tracking() == tracked  # the queued op counted no call either
    assert torch.equal(b.cpu(), torch.full((64,), 2.0)) and torch.equal(c.cpu(), torch.full((64,), 3.0))
