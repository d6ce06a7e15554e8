"""NeuronProfiler with neuron-distributed: a collective appears on its stream lane and on the collective lane."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("neuron_distributed")

from neuron_device.simulation.profiler import DEVICE_PID_BASE, NeuronProfiler


def test_all_reduce_gets_a_collective_lane(tmp_path):
    dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
    try:
        t = torch.ones(1024, device="neuron")
        with NeuronProfiler() as prof:
            dist.all_reduce(t)
            t.sum().item()
    finally:
        dist.destroy_process_group()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("pid") == DEVICE_PID_BASE]
    lanes = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    collective = [e for e in events if e["ph"] == "X" and e["name"] == "c10d::allreduce"]
    assert {lanes[e["tid"]] for e in collective} == {"stream 0", "engine: collective"}
    assert all(e["args"]["engine"] == "collective" for e in collective)
