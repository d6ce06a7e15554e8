"""The plugin seam: packages join through the `neuron_device.plugins` entry point group."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

# the plugin seam, alone and with every wheel's plugin loaded (all session)
pytestmark = pytest.mark.all_wheels

GOOD_PLUGIN = '''
import torch
from neuron_device.plugins import hookimpl

calls = []
_lib = torch.library.Library("demo_plugin", "DEF")
_lib.define("double(Tensor x) -> Tensor")

@hookimpl
def neuron_register(registry):
    def double_on_neuron(x):
        return x + x
    registry.register("demo_plugin::double", double_on_neuron)
    calls.append("register")

@hookimpl
def neuron_device_ready(device_module):
    calls.append(("ready", device_module.device_count()))
'''

BROKEN_HOOK = '''
from neuron_device.plugins import hookimpl

@hookimpl
def neuron_device_ready(device_module):
    raise ValueError("boom in hook")
'''


def _install_plugin(root: Path, name: str, source: str | None) -> None:
    """Make an importable package `name` declaring a `neuron_device.plugins` entry point (no pip needed)."""
    if source is not None:
        (root / f"{name}.py").write_text(textwrap.dedent(source))
    dist_info = root / f"{name}-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(f"[neuron_device.plugins]\n{name} = {name}\n")


def test_plugin_is_discovered_and_called(python, tmp_path):
    _install_plugin(tmp_path, "demo_plugin", GOOD_PLUGIN)
    code = (
        "import torch, demo_plugin; from neuron_device import plugins; "
        "print(demo_plugin.calls, plugins.loaded_plugins); "
        "print(torch.ops.demo_plugin.double(torch.ones(2, device='neuron')).tolist())"
    )
    result = python(code, env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "[2.0, 2.0]" in result.stdout
    assert "['register', ('ready', 4)]" in result.stdout
    assert "'demo_plugin': 'ok'" in result.stdout


@pytest.mark.parametrize(
    ("name", "source", "stage"),
    [
        ("missing_plugin", None, "failed to load"),
        ("broken_hook", BROKEN_HOOK, "failed to run its neuron_device_ready hook"),
    ],
)
def test_broken_plugin_is_named_and_does_not_break_torch(python, tmp_path, name, source, stage):
    _install_plugin(tmp_path, name, source)
    code = "import torch; print(torch.ones(2, device='neuron').sum().item())"
    result = python(code, env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2.0"
    assert f"neuron_device plugin '{name}' {stage}" in result.stderr

    strict = python(code, env={"PYTHONPATH": str(tmp_path), "NEURON_DEVICE_STRICT_PLUGINS": "1"})
    assert strict.returncode != 0
    assert "PluginLoadError" in strict.stderr and name in strict.stderr


def test_a_memo_hands_back_what_this_process_set_and_not_what_it_merged():
    """`services.memo`: what a forked planned rank set is its additions (handed to its zygote); what it inherited
    (`forget_memo_additions` at its start) or took from another rank (`merge_memos`) is not."""
    from neuron_device import services

    memo = services.memo("test_plugins.memo")
    assert services.memo("test_plugins.memo") is memo
    memo["inherited"] = 1.0
    services.forget_memo_additions()
    services.merge_memos({"test_plugins.memo": {"merged": 2.0}})
    memo["computed"] = 3.0
    assert dict(memo) == {"inherited": 1.0, "merged": 2.0, "computed": 3.0}
    assert services.memo_additions().get("test_plugins.memo") == {"computed": 3.0}
