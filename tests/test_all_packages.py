"""Cross-package tests: the four wheels installed together import cleanly and join through the plugin seam."""

from __future__ import annotations

import importlib
import importlib.metadata
import subprocess
import sys

import pytest

DISTRIBUTIONS = {
    "neuron-device": "neuron_device",
    "neuron-compile": "neuron_compile",
    "neuron-distributed": "neuron_distributed",
    "neuron-nki": "nki",
    "torch-neuronx": "torch_neuronx",  # metadata only (packages/torch-neuronx); the module is neuron-device's
}


@pytest.mark.parametrize(("distribution", "module"), DISTRIBUTIONS.items())
def test_installed_and_importable(distribution, module):
    assert importlib.metadata.version(distribution)
    importlib.import_module(module)


def test_import_torch_with_everything_installed_is_clean():
    # Every plugin loads (a broken one would warn), and the device works with no import of ours.
    code = (
        "import warnings; warnings.simplefilter('error', RuntimeWarning)\n"
        "import torch\n"
        "from neuron_device import plugins\n"
        "assert all(status == 'ok' for status in plugins.loaded_plugins.values()), plugins.loaded_plugins\n"
        "print(torch.ones(3, device='neuron').sum().item())\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "3.0"
