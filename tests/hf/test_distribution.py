"""Libraries that detect TorchNeuron by its distribution find the simulator: diffusers' is_torch_neuronx_available()
reads importlib.metadata.version("torch_neuronx"), answered by the metadata-only packages/torch-neuronx that the
README's command and the nox sessions install (docs/design.md)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

pytestmark = pytest.mark.optional


def test_diffusers_sees_torch_neuronx() -> None:
    pytest.importorskip("diffusers")
    code = ("from diffusers.utils import import_utils as u; "
            "print(u.is_torch_neuronx_available(), u._torch_neuronx_version)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True).stdout
    assert out.split()[-2:] == ["True", importlib.metadata.version("torch_neuronx")]
    assert importlib.metadata.version("torch_neuronx").endswith("+neuronsim.0.1.0")
