"""The wheel: dependencies, and the backend registered by the plugin seam with no import of ours."""

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import neuron_distributed


def test_installed_with_only_declared_dependencies():
    requires = importlib.metadata.requires("neuron-distributed") or []
    assert [r for r in requires if "extra" not in r] == ["neuron-device"]
    assert neuron_distributed.__version__ == importlib.metadata.version("neuron-distributed")


def test_backend_registered_by_plugin_without_import():
    code = (
        "import sys, torch, torch.distributed as dist\n"
        "assert 'NEURON' in dist.Backend._plugins, dist.Backend.backend_list\n"
        "assert dist.Backend.default_device_backend_map['neuron'] == 'neuron'\n"
        "assert dist.Backend.default_device_backend_map['cpu'] == 'gloo'\n"
        "print('registered')\n"
    )
    env_run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "NEURON_DEVICE_STRICT_PLUGINS": "1"},
    )
    assert env_run.stdout.strip() == "registered", env_run.stderr[-3000:]


def test_the_readme_lists_every_module():
    """The README's module table is where a newcomer starts: a module missing from it is a module nobody finds."""
    listed = set(re.findall(r"^\| `([a-z0-9_]+\.py)` \|", (Path(__file__).parents[1] / "README.md").read_text(), re.M))
    modules = {path.name for path in Path(neuron_distributed.__file__).parent.glob("*.py")}
    assert modules - listed == set(), "modules missing from packages/neuron-distributed/README.md's table"
    assert listed - modules == set(), "README.md lists modules that do not exist"
