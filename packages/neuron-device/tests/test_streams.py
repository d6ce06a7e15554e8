"""Streams and events on simulated time: torch.cuda's API on `torch.neuron`, ordering, timing, torch.accelerator."""

from __future__ import annotations

import json
import re
import threading

import pytest
import torch

from neuron_device.neuron.streams import recorded_streams
from neuron_device.simulation import costmodel
from neuron_spec import costs

HBM_PER_CORE = 2.9e12 / 8


def _timed() -> torch.neuron.Event:
    return torch.neuron.Event(enable_timing=True)


def _matmul_seconds(n: int) -> float:
    """What an fp32 n x n x n matmul is charged: the Tensor engine at 20 TFLOPS or HBM traffic (after one DMA queue
    head latency), whichever is longer."""
    memory = costs.DMA_QUEUE_HEAD_NS * 1e-9 + 3 * 4 * n * n / HBM_PER_CORE
    return max(2 * n**3 / 20e12, memory) + costmodel.LAUNCH_SECONDS


# --- the API surface ---------------------------------------------------------------------------------------------


def test_default_and_current_stream():
    current = torch.neuron.current_stream()
    assert current == torch.neuron.default_stream()
    assert current.stream_id == 0 and current.device_index == torch.neuron.current_device()
    assert isinstance(current, torch.Stream) and isinstance(current, torch.neuron.Stream)
    assert current.device == torch.device("neuron", 0)


def test_new_streams_come_from_a_pool_per_priority():
    low, high = torch.neuron.Stream(), torch.neuron.Stream(priority=-1)
    assert low.stream_id != 0 and high.stream_id not in (0, low.stream_id)
    assert (low.priority, high.priority) == (0, -1)
    assert torch.neuron.Stream.priority_range() == (0, -1)
    assert torch.neuron.Stream(priority=-7).priority == -1  # clamped, as CUDA does
    assert torch.neuron.Stream(priority=3).priority == 0
    ids = {torch.neuron.Stream().stream_id for _ in range(64)}
    assert len(ids) == 32  # the pool is reused round-robin


def test_stream_on_another_device():
    stream = torch.neuron.Stream(device="neuron:1")
    assert stream.device_index == 1
    with pytest.raises(RuntimeError, match="Invalid device index 9"):
        torch.neuron.Stream(device=9)
    with pytest.raises(TypeError, match="priority must be an int"):
        torch.neuron.Stream(priority="high")


def test_stream_context_sets_and_restores_the_current_stream():
    side = torch.neuron.Stream()
    with torch.neuron.stream(side):
        assert torch.neuron.current_stream() == side
        inner = torch.neuron.Stream()
        with inner:  # a Stream is its own context manager, like torch.Stream
            assert torch.neuron.current_stream() == inner
        assert torch.neuron.current_stream() == side
    assert torch.neuron.current_stream() == torch.neuron.default_stream()
    with torch.neuron.StreamContext(None):
        assert torch.neuron.current_stream() == torch.neuron.default_stream()


def test_stream_context_on_another_device_restores_both_devices():
    other = torch.neuron.Stream(device=1)
    with torch.neuron.stream(other):
        assert torch.neuron.current_device() == 1
        assert torch.neuron.current_stream() == other
    assert torch.neuron.current_device() == 0
    assert torch.neuron.current_stream(1) == torch.neuron.default_stream(1)


def test_set_stream():
    side = torch.neuron.Stream()
    try:
        torch.neuron.set_stream(side)
        assert torch.neuron.current_stream() == side
        torch.neuron.set_stream(None)  # a no-op, as in torch.cuda
        assert torch.neuron.current_stream() == side
    finally:
        torch.neuron.set_stream(torch.neuron.default_stream())
    with pytest.raises(ValueError, match="expected a neuron stream"):
        torch.neuron.set_stream(torch.Stream(device="cpu"))


def test_current_stream_is_per_thread():
    side = torch.neuron.Stream()
    seen = []
    with torch.neuron.stream(side):
        thread = threading.Thread(target=lambda: seen.append(torch.neuron.current_stream()))
        thread.start()
        thread.join()
    assert seen == [torch.neuron.default_stream()]


def test_event_api():
    event = torch.neuron.Event()
    assert isinstance(event, torch.Event)
    assert event.query()  # nothing recorded yet
    event.wait()  # waiting for an unrecorded event does nothing
    event.synchronize()
    recorded = torch.neuron.record_event()
    assert isinstance(recorded, torch.neuron.Event) and "recorded on neuron:0" in repr(recorded)
    with pytest.raises(NotImplementedError, match="interprocess"):
        torch.neuron.Event(interprocess=True)


def test_elapsed_time_needs_timing_and_recorded_events():
    plain, timed = torch.neuron.Event(), _timed()
    plain.record()
    timed.record()
    with pytest.raises(ValueError, match=re.escape("Both events must be created with argument 'enable_timing=True'.")):
        plain.elapsed_time(timed)
    with pytest.raises(ValueError, match="must be recorded"):
        timed.elapsed_time(_timed())
    other = _timed()
    other.record(torch.neuron.default_stream(1))
    with pytest.raises(ValueError, match="same device"):
        timed.elapsed_time(other)


# --- simulated time ----------------------------------------------------------------------------------------------


def test_elapsed_time_is_the_sum_of_the_charged_op_costs(highest_precision):
    n = 256
    a, b, c = (torch.ones(n, n, device="neuron") for _ in range(3))
    start, end = _timed(), _timed()
    start.record()
    product = a @ b  # Tensor engine
    total = product + c  # Vector engine, HBM-bound: two inputs read, one output written
    end.record()
    # HBM traffic pays one DMA queue head latency first (the calibrated model, issue 17)
    memory = costs.DMA_QUEUE_HEAD_NS * 1e-9 + 3 * 4 * n * n / HBM_PER_CORE
    vector = 2 * n * n / (256 * 0.96e9) + 2 * costs.ACCESS_CYCLES / 0.96e9
    add_seconds = max(memory, vector) + costmodel.LAUNCH_SECONDS
    expected_ms = (_matmul_seconds(n) + add_seconds) * 1e3
    assert start.elapsed_time(end) == pytest.approx(expected_ms)
    assert torch.equal(total.cpu(), torch.full((n, n), n + 1.0))


def test_work_on_a_side_stream_does_not_delay_the_current_stream(highest_precision):
    a = torch.ones(512, 512, device="neuron")
    torch.neuron.synchronize()
    side = torch.neuron.Stream()
    start, end = _timed(), _timed()
    start.record()
    with torch.neuron.stream(side):
        a @ a
    end.record()
    assert start.elapsed_time(end) == 0.0


def test_wait_stream_orders_the_streams(highest_precision):
    a = torch.ones(512, 512, device="neuron")
    torch.neuron.synchronize()
    side, current = torch.neuron.Stream(), torch.neuron.current_stream()
    start = _timed()
    start.record()
    with torch.neuron.stream(side):
        a @ a
    current.wait_stream(side)
    after = current.record_event(_timed())
    assert start.elapsed_time(after) == pytest.approx(_matmul_seconds(512) * 1e3)


def test_wait_event_orders_the_streams(highest_precision):
    a = torch.ones(512, 512, device="neuron")
    torch.neuron.synchronize()
    side = torch.neuron.Stream()
    start = _timed()
    start.record()
    with torch.neuron.stream(side):
        a @ a
        done = torch.neuron.record_event(_timed())
        a @ a  # queued after the event: not waited for
    torch.neuron.wait_event(done)
    after = torch.neuron.record_event(_timed())
    assert start.elapsed_time(after) == pytest.approx(_matmul_seconds(512) * 1e3)
    # the waiting stream's next op starts after the event
    before_add = torch.neuron.record_event(_timed())
    a + a
    assert start.elapsed_time(before_add) == pytest.approx(_matmul_seconds(512) * 1e3)


def test_synchronize_moves_the_host_to_the_latest_stream():
    a = torch.ones(512, 512, device="neuron")
    side = torch.neuron.Stream()
    with torch.neuron.stream(side):
        a @ a
    torch.neuron.synchronize()
    assert side.query() and torch.neuron.query()
    # after a synchronize, new work on any stream starts no earlier than the host
    start = side.record_event(_timed())
    late = torch.neuron.default_stream().record_event(_timed())
    assert start.elapsed_time(late) == 0.0


def _matmul_then_event(side: torch.neuron.Stream, a: torch.Tensor) -> torch.neuron.Event:
    """Queue ``a @ a`` on ``side`` and return an event recorded behind it."""
    with torch.neuron.stream(side):
        a @ a
        return torch.neuron.record_event()


def _idle_device_and_side_stream() -> tuple[torch.Tensor, torch.neuron.Stream]:
    """A 512 x 512 operand on a device with no pending work, and a new side stream."""
    a = torch.ones(512, 512, device="neuron")
    torch.neuron.synchronize()
    return a, torch.neuron.Stream()


def test_query_reports_pending_work_and_a_polling_loop_ends():
    a, side = _idle_device_and_side_stream()
    _matmul_then_event(side, a)
    assert not side.query()  # still running in simulated time
    assert side.query()  # the first query moved the host to the moment the work completes
    event = _matmul_then_event(side, a)
    assert not event.query()
    assert event.query()


def test_event_and_stream_synchronize():
    a, side = _idle_device_and_side_stream()
    event = _matmul_then_event(side, a)
    event.synchronize()
    assert event.query()
    with torch.neuron.stream(side):
        a @ a
    side.synchronize()
    assert side.query()


def test_copy_to_host_waits_for_the_stream():
    a = torch.ones(512, 512, device="neuron")
    torch.neuron.synchronize()
    product = a @ a
    product.cpu()
    assert torch.neuron.query()  # the device-to-host copy made the host wait


def test_ops_are_charged_to_their_own_device():
    a = torch.ones(512, 512, device="neuron:1")
    torch.neuron.synchronize(0)
    torch.neuron.synchronize(1)
    on_0, on_1 = _timed(), _timed()
    on_0.record()
    on_1.record(torch.neuron.current_stream(1))
    a @ a
    assert on_0.elapsed_time(torch.neuron.record_event(_timed())) == 0.0
    after_1 = _timed()
    after_1.record(torch.neuron.current_stream(1))
    assert on_1.elapsed_time(after_1) > 0.0


# --- record_stream, torch.accelerator, FSDP2-style use ----------------------------------------------------------


def test_record_stream():
    tensor = torch.ones(8, device="neuron")
    side = torch.neuron.Stream()
    tensor.record_stream(side)
    tensor[2:].record_stream(torch.neuron.default_stream())
    assert recorded_streams(tensor) == {side, torch.neuron.default_stream()}
    with pytest.raises(RuntimeError, match="stream is on neuron:1 but the tensor is on neuron:0"):
        tensor.record_stream(torch.neuron.Stream(device=1))


def test_torch_accelerator_streams_route_to_torch_neuron():
    side = torch.neuron.Stream()
    assert torch.accelerator.current_stream() == torch.neuron.default_stream()
    try:
        torch.accelerator.set_stream(side)
        assert torch.accelerator.current_stream() == side
        assert torch.neuron.current_stream() == side
    finally:
        torch.accelerator.set_stream(torch.neuron.default_stream())
    a = torch.ones(512, 512, device="neuron")
    with torch.neuron.stream(side):
        a @ a
    torch.accelerator.synchronize()  # torch 2.13 raises here for a Python backend unless patched
    assert side.query()


def test_torch_stream_and_event_constructors_stay_torch_dummies():
    """torch.Stream / torch.Event are immutable C++ types: they work but are not timed (documented limit)."""
    stream, event = torch.Stream(device="neuron"), torch.Event(device="neuron")
    assert stream.stream_id == 0
    event.record(stream)
    assert event.query()


def test_fsdp2_stream_calls():
    """The calls FSDP2 makes through its device handle (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py)."""
    handle = torch.get_device_module("neuron")
    all_gather_stream = handle.Stream(priority=-1)
    copy_in_stream = handle.Stream(priority=-1)
    current = handle.current_stream()
    all_gather_stream.wait_stream(current)
    copy_in_stream.wait_stream(current)
    with handle.stream(copy_in_stream):
        shard = torch.ones(1024, device="neuron") * 2
    event = handle.Event()
    event.record()
    torch.accelerator.current_stream().wait_event(event)
    shard.record_stream(all_gather_stream)
    event.synchronize()
    assert shard.sum().item() == 2048


@pytest.mark.slow
def test_fsdp2_forward_backward_uses_its_streams(python):
    """FSDP2 (fully_shard) on neuron, with torch's fake process group standing in for the collectives: its copy-in
    and all-gather streams (priority -1) carry work on the simulated timeline."""
    result = python(
        "import warnings; warnings.simplefilter('ignore')\n"
        "import json, torch, torch.distributed as dist\n"
        "from torch.testing._internal.distributed.fake_pg import FakeStore\n"
        "from torch.distributed.fsdp import fully_shard\n"
        "from torch.distributed.device_mesh import init_device_mesh\n"
        "from neuron_device import timeline\n"
        "dist.init_process_group('cpu:fake,neuron:fake', store=FakeStore(), rank=0, world_size=2)\n"
        "model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)).to('neuron')\n"
        "mesh = init_device_mesh('neuron', (2,))\n"
        "for layer in model: fully_shard(layer, mesh=mesh)\n"
        "fully_shard(model, mesh=mesh)\n"
        "model(torch.randn(3, 16).to('neuron')).sum().backward()\n"
        "torch.neuron.synchronize()\n"
        "busy = sorted(i for i, clock in timeline.timeline(0).clocks.items() if clock > 0)\n"
        "print(json.dumps([torch.neuron.Stream(stream_id=i, device_index=0, device_type=20).priority for i in busy]))\n"
        "dist.destroy_process_group()\n"
    )
    assert result.returncode == 0, result.stderr
    priorities = json.loads(result.stdout.strip().splitlines()[-1])
    assert 0 in priorities and -1 in priorities  # the default stream and FSDP2's high-priority streams


def test_charges_read_no_thread_state_until_a_stream_is_made_current(monkeypatch):
    """Until some thread makes a stream other than the default current, every op is charged to stream 0 without
    reading the thread-local current streams; from then on each charge goes to its thread's current stream."""
    from neuron_device import timeline

    class Watched(threading.local):
        reads = 0

        def __init__(self) -> None:
            self._ids: dict[int, int] = {}

        @property
        def ids(self) -> dict[int, int]:
            Watched.reads += 1
            return self._ids

    monkeypatch.setattr(timeline, "_current", Watched())
    monkeypatch.setattr(timeline, "_streams_set", False)
    x = torch.ones(4).to("neuron")
    line = timeline.timeline(0)
    x + x
    assert Watched.reads == 0
    timeline.set_current_stream_id(0, 7)
    before = line.clocks.get(7, 0.0)
    x + x
    assert line.clocks[7] > before
    assert Watched.reads >= 2
    timeline.set_current_stream_id(0, 0)
