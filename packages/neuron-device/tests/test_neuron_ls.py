"""`neuron-ls`: the machine the runtime would simulate under an environment, as a table and as JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_device import cli, plugins
from neuron_device.topology import read_topology

ENV = {"NEURON_SIM_INSTANCE_TYPE": "trn2.48xlarge", "NEURON_RT_VISIBLE_CORES": "3-5"}


def _neuron_ls(python, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return python(f"import sys\nfrom neuron_device.cli import main\nsys.exit(main({list(args)!r}))", env=env)


@pytest.mark.all_wheels  # lists the loaded plugins
def test_json_is_the_topology_of_the_environment(python):
    result = _neuron_ls(python, "--json", env=ENV)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    topo = read_topology(ENV)
    assert (info["target"], info["chips"], info["lnc"]) == ("trn2", 16, 2) == (topo.target.name, topo.chips, topo.lnc)
    assert info["physical_cores"] == 16 * 8 and info["logical_cores"] == topo.total_logical_cores == 64
    assert info["visible_cores"] == [3, 4, 5]
    assert info["hbm_bytes_per_core"] == topo.hbm_bytes_per_device == 24 * 2**30
    assert [d["chip"] for d in info["devices"]] == [0, 1, 1]
    assert info["devices"][0]["physical_cores"] == [6, 7]
    assert info["packages"]["neuron-device"] is not None
    assert info["plugins"] == dict(sorted(plugins.loaded_plugins.items()))


def test_text_table(python):
    result = _neuron_ls(python, env={"NEURON_PLATFORM_TARGET_OVERRIDE": "trn1", "NEURON_SIM_CHIPS": "2"})
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Simulated target: trn1 (NeuronCore-v2)" in out
    assert "Logical NeuronCores: 4 (LNC=1, 2 per chip)" in out
    assert "Visible cores: 4 of 4, 16.00 GiB HBM per core" in out
    assert "neuron:3" in out and "neuron:4" not in out
    assert "neuron-device" in out


def test_invalid_environment_is_a_clear_error(python):
    result = _neuron_ls(python, env={"NEURON_RT_VISIBLE_CORES": "9"})
    assert result.returncode == 2
    assert "neuron-ls: NEURON_RT_VISIBLE_CORES='9' is invalid: core 9 does not exist" in result.stderr


def test_describe_matches_format_text():
    info = cli.describe(read_topology({"NEURON_PLATFORM_TARGET_OVERRIDE": "trn3"}))
    text = cli.format_text(info)
    assert "Simulated target: trn3" in text and "36.00 GiB HBM per core" in text


@pytest.mark.skipif(not (Path(sys.executable).parent / "neuron-ls").exists(), reason="console scripts not installed")
def test_console_script():
    result = subprocess.run([str(Path(sys.executable).parent / "neuron-ls"), "--json"], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["target"] in ("trn1", "trn2", "trn3")
