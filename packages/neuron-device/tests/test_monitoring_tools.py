"""`neuron-monitor`, `neuron-top` and `neuron-ls` against a real child process doing work on `neuron`: they see its
published counters (utilisation by engine, HBM, kernels, fallbacks), and the entry of a killed process is cleaned up.
Every wait is bounded; the child stops itself after 120 s if the test dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from device_support import run_python

from neuron_device import livestats

CHILD = textwrap.dedent("""
    import sys, time, torch
    stop = sys.argv[1]
    x = torch.randn(128, 128, device="neuron")
    torch.linalg.inv(x.double() + 64 * torch.eye(128, device="neuron", dtype=torch.float64))  # a CPU fallback
    deadline = time.monotonic() + 120
    import os
    while not os.path.exists(stop) and time.monotonic() < deadline:
        y = (x @ x).relu().sum()
        y.item()
        time.sleep(0.01)
""")


def _tool(name: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    main = {"neuron-monitor": "monitor:monitor_main", "neuron-top": "monitor:top_main", "neuron-ls": "cli:main"}[name]
    module, function = main.split(":")
    code = f"import sys\nfrom neuron_device.{module} import {function}\nsys.exit({function}({list(args)!r}))"
    return run_python(code, env=env)


def _start_worker(directory: Path):
    """A child process computing in a loop on neuron:0, publishing into `directory`/run; yields (child, env, its
    published file) once it has published a fallback, and stops it afterwards."""
    env = {**os.environ, "NEURON_SIM_RUNTIME_DIR": str(directory / "run"), "PYTHONWARNINGS": "ignore"}
    stop = directory / "stop"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(stop)], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    published = directory / "run" / f"{child.pid}.json"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and child.poll() is None:
        if published.exists() and json.loads(published.read_text() or "{}").get("fallback_calls"):
            break
        time.sleep(0.1)
    else:
        child.kill()
        pytest.fail(f"the child never published its counters: {child.communicate()[1][-2000:]}")
    yield child, env, published
    stop.touch()
    try:
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    """One working child shared by the tools' tests."""
    yield from _start_worker(tmp_path_factory.mktemp("worker"))


@pytest.fixture
def doomed_worker(tmp_path):
    """A child of its own, for a test that kills it."""
    yield from _start_worker(tmp_path)


def test_neuron_monitor_reports_the_child_in_the_documented_structure(worker, tmp_path) -> None:
    child, env, _ = worker
    config = tmp_path / "monitor.conf"
    config.write_text(json.dumps({"period": "500ms"}))
    result = _tool("neuron-monitor", "-c", str(config), "-n", "2", "--output-format", "json", env=env)  # 2.34's option
    assert result.returncode == 0, result.stderr
    reports = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(reports) == 2
    second = reports[1]
    assert second["neuron_hardware_info"]["neuron_device_count"] == 1
    assert second["neuron_hardware_info"]["neuroncore_per_device_count"] == 4
    (entry,) = [e for e in second["neuron_runtime_data"] if e["pid"] == child.pid]
    assert entry["error"] == "" and "import sys" in entry["neuron_runtime_tag"]
    report = entry["report"]
    core = report["neuroncore_counters"]["neuroncores_in_use"]["0"]
    assert report["neuroncore_counters"]["period"] == 0.5
    assert 0 < core["neuroncore_utilization"] <= 100
    assert core["engine_utilization"]["tensor"] > 0  # the matmul
    assert 0 < sum(core["engine_utilization"].values()) <= 100.0 + 1e-6
    assert report["memory_used"]["neuron_runtime_used_bytes"]["neuron_device"] >= 128 * 128 * 4
    assert report["execution_stats"]["execution_summary"]["completed"] > 0  # kernels run in the last period
    assert "aten::linalg_inv_ex.inverse" in report["execution_stats"]["cpu_fallback_ops"]
    assert all(e["pid"] != os.getpid() for e in second["neuron_runtime_data"])  # the tool is not a runtime


def test_neuron_top_shows_the_child(worker) -> None:
    child, env, _ = worker
    result = _tool("neuron-top", "-n", "2", "-d", "0.3", env=env)
    assert result.returncode == 0, result.stderr
    screen = result.stdout.split("neuron-top (simulated)")[-1]
    assert f"PID {child.pid}" in screen
    assert "nc0" in screen and "tensor" in screen and "/ 24.00 GiB" in screen
    assert "CPU fallbacks" in screen and "aten::linalg_inv_ex.inverse" in screen


def test_neuron_ls_lists_the_child_on_its_device(worker, monkeypatch) -> None:
    child, env, _ = worker
    result = _tool("neuron-ls", "-j", env=env)
    assert result.returncode == 0, result.stderr
    (device,) = json.loads(result.stdout)
    assert (device["neuron_device"], device["nc_count"], device["neuroncore_ids"]) == (0, 8, [0, 1, 2, 3])
    (proc,) = [p for p in device["neuron_processes"] if p["pid"] == child.pid]
    assert proc["neuroncore_ids"] == [0]
    text = _tool("neuron-ls", env=env).stdout
    assert f"| {child.pid} " in text
    # -a also lists monitoring tools (here this test process, published as one)
    monkeypatch.setenv("NEURON_SIM_RUNTIME_DIR", env["NEURON_SIM_RUNTIME_DIR"])
    with livestats.publish_tool("neuron-top"):
        plain = _tool("neuron-ls", "-j", env=env).stdout
        everything = _tool("neuron-ls", "-j", "-a", env=env).stdout
    assert os.getpid() not in [p["pid"] for p in json.loads(plain)[0]["neuron_processes"]]
    assert os.getpid() in [p["pid"] for p in json.loads(everything)[0]["neuron_processes"]]


def test_a_killed_process_entry_is_cleaned_up(doomed_worker, monkeypatch) -> None:
    child, env, published = doomed_worker
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert published.exists()  # no atexit ran
    monkeypatch.setenv("NEURON_SIM_RUNTIME_DIR", env["NEURON_SIM_RUNTIME_DIR"])
    assert all(p["pid"] != child.pid for p in livestats.processes())
    assert not published.exists()


def test_exit_removes_the_entry(tmp_path) -> None:
    env = {**os.environ, "NEURON_SIM_RUNTIME_DIR": str(tmp_path)}
    code = "import torch, os; torch.ones(2, device='neuron').sum().item(); print(os.getpid())"
    result = run_python(code, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().isdigit()
    assert list(tmp_path.iterdir()) == []


def test_monitor_rejects_a_bad_period(tmp_path) -> None:
    config = tmp_path / "monitor.conf"
    config.write_text(json.dumps({"period": "soon"}))
    result = _tool("neuron-monitor", "-c", str(config), env={**os.environ, "NEURON_SIM_RUNTIME_DIR": str(tmp_path)})
    assert result.returncode == 2
    assert "neuron-monitor: period 'soon' is not a duration such as '1s', '500ms' or '2m'" in result.stderr


@pytest.mark.parametrize("script", ["neuron-ls", "neuron-top", "neuron-monitor"])
@pytest.mark.skipif(not (Path(sys.executable).parent / "neuron-ls").exists(), reason="console scripts not installed")
def test_console_scripts_are_installed(script: str) -> None:
    result = subprocess.run([str(Path(sys.executable).parent / script), "--help"], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0 and f"usage: {script}" in result.stdout


def test_a_forked_child_leaves_the_parents_entry(tmp_path) -> None:
    env = {**os.environ, "NEURON_SIM_RUNTIME_DIR": str(tmp_path)}
    code = textwrap.dedent("""
        import os, sys, time, torch
        torch.ones(2, device="neuron").sum().item()
        time.sleep(0.5)
        mine = os.path.join(os.environ["NEURON_SIM_RUNTIME_DIR"], f"{os.getpid()}.json")
        child = os.fork()
        if child == 0:
            sys.exit(0)  # runs the inherited atexit handlers
        os.waitpid(child, 0)
        print(os.path.exists(mine))
    """)
    assert run_python(code, env=env).stdout.strip() == "True"
