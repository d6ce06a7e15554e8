"""NeuronProfiler: the exported Chrome trace is valid trace-event JSON with simulated device lanes aligned to the CPU
ops that launched them."""

from __future__ import annotations

import gzip
import itertools
import json
import math
import warnings

import pytest
import torch

from neuron_device import timeline
from neuron_device.adaptive_eager import queue as adaptive_eager
from neuron_device.simulation.profiler import DEVICE_PID_BASE, NeuronProfiler, device_trace_events

PID = DEVICE_PID_BASE  # neuron:0


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A forward/backward on the default stream, a multiply on a side stream, a fallback and a device->host copy."""
    model = torch.nn.Linear(64, 32).to("neuron")
    x = torch.randn(16, 64, device="neuron")
    side = torch.neuron.Stream()
    busy_before = dict(timeline.timeline(0).busy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with NeuronProfiler() as prof:
            loss = model(x).relu().sum()
            loss.backward()
            with torch.neuron.stream(side):
                x * 2
            torch.linalg.inv(torch.eye(3, device="neuron") * 2)
            loss.item()
    busy_after = dict(timeline.timeline(0).busy)
    path = tmp_path_factory.mktemp("trace") / "trace.json"
    prof.export_chrome_trace(str(path))
    with open(path, encoding="utf-8") as file:  # plain json.load: the file must be valid JSON as written
        trace = json.load(file)
    return trace, prof, side, busy_before, busy_after


def _lanes(trace, ph):
    return [e for e in trace["traceEvents"] if e.get("ph") == ph and e.get("pid") == PID]


def test_lanes_are_named_by_metadata_events(profiled):
    trace, _, side, _, _ = profiled
    metadata = _lanes(trace, "M")
    process = [e["args"]["name"] for e in metadata if e["name"] == "process_name"]
    assert process == ["neuron:0 (simulated trn2)"]
    threads = {e["tid"]: e["args"]["name"] for e in metadata if e["name"] == "thread_name"}
    assert threads[0] == "stream 0"
    assert threads[side.stream_id] == f"stream {side.stream_id}"
    assert {"engine: tensor", "engine: vector", "engine: dma", "engine: host (CPU fallback)"} <= set(threads.values())
    # every lane that holds an event is named
    assert {e["tid"] for e in _lanes(trace, "X")} == set(threads)


def test_device_events_are_complete_events_that_do_not_overlap_in_a_lane(profiled):
    trace, _, _, _, _ = profiled
    events = _lanes(trace, "X")
    assert events
    by_lane: dict[int, list] = {}
    for event in events:
        assert isinstance(event["ts"], float) and event["dur"] > 0 and event["name"]
        by_lane.setdefault(event["tid"], []).append(event)
    for lane in by_lane.values():
        lane.sort(key=lambda e: e["ts"])
        for first, second in itertools.pairwise(lane):
            assert first["ts"] + first["dur"] <= second["ts"] + 1e-6


def test_stream_lanes_hold_the_simulated_time_charged(profiled):
    trace, prof, side, before, after = profiled
    for stream in (0, side.stream_id):
        lane = [e for e in _lanes(trace, "X") if e["tid"] == stream]
        charged = after[stream] - before.get(stream, 0.0)
        assert math.isclose(sum(e["dur"] for e in lane) / 1e6, charged, rel_tol=1e-9)
    assert len([e for e in _lanes(trace, "X") if e["tid"] < 1000]) == len(prof.device_records)
    side_names = {e["name"] for e in _lanes(trace, "X") if e["tid"] == side.stream_id}
    assert side_names == {"aten::mul.Tensor"}


@pytest.mark.skipif(adaptive_eager.is_enabled(), reason="adaptive eager launches queued ops at the flush, after the op")
def test_device_events_start_inside_the_cpu_op_that_launched_them(profiled):
    trace, _, _, _, _ = profiled
    cpu = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"]
    native = [e for e in _lanes(trace, "X") if e["tid"] < 1000 and "(" not in e["name"]]
    assert any(e["name"] == "aten::addmm" for e in native)
    for event in native:
        op = event["name"].split(".")[0]
        launched = event["args"]["launched_at_us"]
        assert any(c["name"] == op and c["ts"] <= launched <= c["ts"] + c["dur"] for c in cpu), event


def test_the_recorder_is_removed_and_gzip_export_works(profiled, tmp_path):
    assert timeline._recorder is None
    x = torch.ones(4, 4, device="neuron")
    with NeuronProfiler() as prof:
        x + x
    path = tmp_path / "trace.json.gz"
    prof.export_chrome_trace(str(path))
    with gzip.open(path, "rt", encoding="utf-8") as file:
        events = json.load(file)["traceEvents"]
    assert [e["name"] for e in events if e.get("pid") == PID and e["ph"] == "X" and e["tid"] == 0] == ["aten::add.Tensor"]


def test_collectives_and_compiled_graphs_get_their_lanes():
    records = [("c10d::allreduce", 1, 0, 0.0, 1e-3, 2_000), ("neuron_compile::graph_forward", 1, 0, 1e-3, 2e-3, 3_000)]
    events = device_trace_events(records, base_ns=1_000)
    names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names == {"stream 0", "engine: collective", "engine: compiled graph"}
    work = [e for e in events if e["ph"] == "X" and e["tid"] == 0]
    assert [(e["ts"], e["dur"]) for e in work] == [(1.0, 1000.0), (1001.0, 1000.0)]  # queued behind the first
    assert {e["pid"] for e in events} == {DEVICE_PID_BASE + 1}
