"""The simulation report: its numbers are the runtime's counters, in text and JSON, on demand and at exit."""

from __future__ import annotations

import json
import math
import textwrap
import warnings

import pytest
import torch

from neuron_device import allocator as _allocator
from neuron_device import timeline, topology
from neuron_device.simulation import ledger, report

# the report takes neuron-compile's graph counters when it is installed (all session)
pytestmark = pytest.mark.all_wheels


@pytest.fixture
def workload():
    """A small training step with a fallback and two signatures of `addmm` (a recompilation)."""
    ledger.clear_op_tracking()
    ledger.clear_compilation_cache()
    model = torch.nn.Linear(32, 16).to("neuron")
    for batch in (4, 4, 8):
        model(torch.ones(batch, 32, device="neuron")).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.linalg.inv(torch.eye(3, device="neuron") * 2)
    torch.neuron.synchronize()
    yield
    ledger.clear_op_tracking()


def test_op_times_are_calls_times_seconds_per_signature(workload):
    data = report.collect()
    expected: dict[str, float] = {}
    calls: dict[str, int] = {}
    for launch in ledger.launches():
        expected[launch.name] = expected.get(launch.name, 0.0) + launch.calls * launch.seconds
        calls[launch.name] = calls.get(launch.name, 0) + launch.calls
    assert {op["name"]: op["seconds"] for op in data["ops"]} == expected
    assert {op["name"]: op["calls"] for op in data["ops"]} == calls
    assert data["ops_seconds"] == sum(op["seconds"] for op in data["ops"])
    seconds = [op["seconds"] for op in data["ops"]]
    assert seconds == sorted(seconds, reverse=True)


def test_stream_times_are_the_timelines_busy_time(workload):
    data = report.collect()
    rows = {(row["device"], row["stream"]): row for row in data["streams"]}
    line = timeline.timeline(0)
    assert rows[(0, 0)]["busy_seconds"] == line.busy[0]
    assert rows[(0, 0)]["completes_at_seconds"] == line.clocks[0]
    assert data["device_seconds"] == sum(row["busy_seconds"] for row in data["streams"])


def test_fallbacks_compilations_and_recompilations_are_the_trackers(workload):
    data = report.collect()
    stats = ledger.compilation_stats()
    assert set(data["fallbacks"]) == set(ledger.get_fallback_ops())
    assert data["fallbacks"]["aten::linalg_inv_ex.inverse"] == 1
    assert data["kernels_compiled"] == stats["total_compilations"]
    assert data["kernel_cache_hits"] == stats["in_memory_hits"]
    assert data["kernels_compiled_per_op"] == stats["compilations_per_op"]
    assert data["recompiled_ops"]["aten::addmm"] == stats["compilations_per_op"]["aten::addmm"] - 1 == 1


def test_the_simulated_target_re_estimates_to_the_charged_time(workload):
    data = report.collect()
    chosen = data["by_target"][topology.topology().target.name]
    assert math.isclose(chosen["ops_seconds"], data["ops_seconds"], rel_tol=1e-12)
    # trn1's HBM is slower than trn2's: memory-bound eager ops take longer there
    assert data["by_target"]["trn1"]["ops_seconds"] > data["by_target"]["trn3"]["ops_seconds"]


def test_peak_memory_and_verdicts(workload):
    row = next(row for row in report.collect()["memory"] if row["device"] == 0)
    assert row["peak_allocated_bytes"] == torch.neuron.max_memory_allocated(0)
    assert row["capacity_bytes"] == _allocator.device(0).capacity
    assert row["verdict"] == "fits"
    assert report._fit(10 * 2**30, 4 * 2**30) == "needs 3 cores with FSDP"


def test_text_and_json_formats(workload):
    text = report.report("text")
    assert "Neuron simulation report: target trn2" in text
    assert "aten::addmm" in text and "aten::linalg_inv_ex.inverse: 1" in text
    assert "trn1:" in text and "trn3:" in text
    assert json.loads(report.report("json"))["fallbacks"] == report.collect()["fallbacks"]
    with pytest.raises(ValueError, match="unknown report format"):
        report.report("xml")


def test_report_at_exit(python, tmp_path):
    code = textwrap.dedent("""
        import torch
        x = torch.ones(4, 4, device="neuron")
        (x @ x).sum().item()
    """)
    path = tmp_path / "report.json"
    result = python(code, env={"NEURON_SIM_REPORT": "json", "NEURON_SIM_REPORT_FILE": str(path)})
    assert result.returncode == 0, result.stderr
    data = json.loads(path.read_text())
    assert "aten::mm" in {op["name"] for op in data["ops"]}
    result = python(code, env={"NEURON_SIM_REPORT": "1"})
    assert "Neuron simulation report" in result.stderr
    result = python(code, env={"NEURON_SIM_REPORT": "yaml"})
    assert result.returncode != 0 and "NEURON_SIM_REPORT='yaml' is invalid" in result.stderr
