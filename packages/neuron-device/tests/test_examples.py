"""The examples the README runs must keep working: each runs in a process of its own and must exit 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from device_support import run_python

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.mark.skipif(not EXAMPLES.is_dir(), reason="examples/ is not shipped with the wheel")
def test_quickstart_matches_cpu() -> None:
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py")], capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "device:     neuron:0" in run.stdout
    assert "aten::" in run.stdout  # the op report is printed


BENCHMARKS = EXAMPLES.parent / "benchmarks"


@pytest.mark.slow
@pytest.mark.skipif(not BENCHMARKS.is_dir(), reason="benchmarks/ is not shipped with the wheel")
def test_eager_overhead_benchmark_reports_every_case() -> None:
    """The benchmark runs and its JSON is complete (its numbers are for reading, not for asserting)."""
    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / "eager_overhead.py"), "--json", "--rounds", "5"],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["threads"] == 1 and report["rounds"] == 5
    cases = [row["case"] for row in report["results"]]
    assert any(case.startswith("add") for case in cases) and any(case.startswith("llama fwd") for case in cases)
    for row in report["results"]:
        assert row["neuron_us"] > 0 and row["cpu_us"] > 0 and row["ratio"] > 0 and row["calls_per_sample"] >= 1


@pytest.mark.slow
@pytest.mark.skipif(not BENCHMARKS.is_dir(), reason="benchmarks/ is not shipped with the wheel")
def test_python_kernel_floor_benchmark_restores_the_device_kernel() -> None:
    """The floor benchmark swaps `add`'s kernel, checks each sum, reports every kernel, and leaves the device's own
    kernel in place (the "neuron" row runs after the swaps)."""
    code = (
        "import runpy, sys, torch; sys.argv = ['floor', '--json', '--rounds', '5']; "
        f"sys.path.insert(0, {str(BENCHMARKS)!r}); "
        f"runpy.run_path({str(BENCHMARKS / 'python_kernel_floor.py')!r}, run_name='__main__'); "
        "a = torch.ones(2, device='neuron'); "
        "assert torch.equal((a + a).cpu(), torch.full((2,), 2.0)); "
        "from neuron_device.simulation.ledger import executed_ops; before = executed_ops['aten::add.Tensor']; a + a; "
        "assert executed_ops['aten::add.Tensor'] == before + 1, 'the device kernel is not back'"
    )
    run = run_python(code, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert [row["kernel"] for row in report["results"]] == ["dispatch only", "floor", "neuron"]
    for row in report["results"]:
        assert row["neuron_us"] > 0 and row["cpu_us"] > 0 and row["ratio"] > 0
