"""neuron-distributed 0.1.0 installs beside neuron-device and does not claim the `neuron` c10d backend yet."""

import importlib.metadata

import torch.distributed as dist

import neuron_distributed


def test_installed_with_only_declared_dependencies():
    requires = importlib.metadata.requires("neuron-distributed") or []
    assert [r for r in requires if "extra" not in r] == ["neuron-device"]
    assert neuron_distributed.__version__ == importlib.metadata.version("neuron-distributed")


def test_neuron_backend_not_claimed_yet():
    assert "neuron" not in dist.Backend.backend_list
