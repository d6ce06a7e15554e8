"""TorchNeuron's eager variables have their documented effect, a documented variable that matters only to real
hardware is accepted with one note, and an unknown TORCH_NEURONX_* / NEURON_RT_* / NEURON_SIM_* name (a typo) warns
once naming the closest known one. Each case runs in a fresh process: the checks run when the device registers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from neuron_device import environment
from neuron_spec.env import unknown_names


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, **env}
    return subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, timeout=120,
                          env=full)


def _notes(stderr: str) -> list[str]:
    return [line.split("EnvironmentNote: ", 1)[1] for line in stderr.splitlines() if "EnvironmentNote: " in line]


def test_typo_warns_once_with_the_closest_name() -> None:
    result = _run("import torch; import torch_neuronx; torch.ones(1, device='neuron')",
                  TORCH_NEURONX_LOG_LEVLE="3", NEURON_RT_VISIBLE_CORE="0", NEURON_SIM_REPROT="1")
    assert result.returncode == 0, result.stderr
    assert _notes(result.stderr) == [
        "NEURON_RT_VISIBLE_CORE is set but no installed neuron package reads it; did you mean NEURON_RT_VISIBLE_CORES?",
        "NEURON_SIM_REPROT is set but no installed neuron package reads it; did you mean NEURON_SIM_REPORT?",
        "TORCH_NEURONX_LOG_LEVLE is set but no installed neuron package reads it; did you mean "
        "TORCH_NEURONX_LOG_LEVEL?",
    ]


def test_declared_and_other_prefixes_do_not_warn() -> None:
    result = _run("import torch", NEURON_SIM_REPORT="0", NEURON_RT_NUM_CORES="0", NEURON_OTHER_TOOL="1")
    assert result.returncode == 0 and _notes(result.stderr) == []


def test_unknown_names_scanner() -> None:
    env = {"TORCH_NEURONX_LOG_LEVLE": "3", "TORCH_NEURONX_LOG_LEVEL": "3", "NEURON_SIM_ZZZZZZZZ": "1", "HOME": "/"}
    known = {"TORCH_NEURONX_LOG_LEVEL", "NEURON_SIM_REPORT"}
    assert unknown_names(known, environment.PREFIXES, env) == [
        ("NEURON_SIM_ZZZZZZZZ", None), ("TORCH_NEURONX_LOG_LEVLE", "TORCH_NEURONX_LOG_LEVEL")]


@pytest.mark.parametrize("name", ["TORCH_NEURONX_MLIR_ATEN_OPS", "NEURON_RT_LOG_LEVEL",
                                  "TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS"])
def test_hardware_only_variable_gets_one_note(name: str) -> None:
    result = _run("import torch; import torch_neuronx; torch.ones(1, device='neuron')", **{name: "1"})
    assert result.returncode == 0, result.stderr
    (note,) = _notes(result.stderr)
    assert note.startswith(f"{name} is set but has no effect on the simulated device: ")


def test_every_no_effect_variable_says_why() -> None:
    _, no_effect = environment.declared()
    assert {var.name for var in no_effect} >= {"TORCH_NEURONX_MLIR_ATEN_OPS", "NEURON_RT_LOG_LEVEL"}
    assert all(var.doc.startswith("accepted, no effect here: ") for var in no_effect)


def test_log_level_sets_the_packages_loggers() -> None:
    code = "import torch, logging; print([logging.getLogger(n).level for n in ('neuron_device', 'torch_neuronx')])"
    assert _run(code, TORCH_NEURONX_LOG_LEVEL="3").stdout.strip() == "[10, 10]"
    assert _run(code, TORCH_NEURONX_LOG_LEVEL="warning").stdout.strip() == "[30, 30]"
    bad = _run(code, TORCH_NEURONX_LOG_LEVEL="loud")
    assert bad.returncode == 0 and bad.stdout.strip() == "[0, 0]"  # a bad value warns and import torch goes on
    assert "TORCH_NEURONX_LOG_LEVEL='loud' is invalid" in _notes(bad.stderr)[0]


def test_launch_blocking_makes_the_host_wait_for_every_op() -> None:
    code = ("import torch\nfrom neuron_device import timeline\nx = torch.ones(256, 256, device='neuron')\n"
            "y = x @ x\nline = timeline.timeline(0)\nprint(line.host == max(line.clocks.values()) > 0)")
    assert _run(code, NEURON_LAUNCH_BLOCKING="1").stdout.strip() == "True"
    assert _run(code).stdout.strip() == "False"  # asynchronous: the host has not waited


def test_stack_trace_on_fallback() -> None:
    code = ("import torch, warnings\nwarnings.simplefilter('always')\n"
            "def my_model_step(x):\n    return torch.linalg.inv(x)\n"
            "my_model_step(torch.eye(3, device='neuron'))\n")
    traced = _run(code, TORCH_NEURONX_ENABLE_STACK_TRACE="1").stderr
    assert "Operator 'aten::linalg_inv_ex.inverse' fell back to CPU" in traced
    assert "Python stack of the call (TORCH_NEURONX_ENABLE_STACK_TRACE=1)" in traced
    assert "in my_model_step" in traced
    assert "Python stack of the call" not in _run(code).stderr
