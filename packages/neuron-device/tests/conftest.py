"""Fixtures of neuron-device's tests (helpers to import are in `device_support`)."""

from __future__ import annotations

import re

import pytest
import torch
from device_support import run_python

from neuron_device.adaptive_eager import queue as adaptive_eager


@pytest.fixture
def python():
    return run_python


@pytest.fixture
def queued(monkeypatch):
    """Adaptive eager on, every run executed op by op."""
    monkeypatch.setattr(adaptive_eager, "FUSE_AFTER", 1 << 30)
    previous = adaptive_eager.set_enabled(True)
    yield
    adaptive_eager.set_enabled(previous)


@pytest.fixture
def highest_precision():
    """float32 matmuls in full float32 for the test (the cost model's fp32 rate depends on the setting)."""
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(saved)


# The ops whose `neuron` kernels neuron-nki's plugin replaces (`nki.torch.native.KERNELS`), as parameter ids name them.
_NKI_REPLACED = re.compile(r"(?<!log_)softmax|layer_norm|rms_norm|scaled_dot_product")


def pytest_collection_modifyitems(config, items) -> None:
    """A parametrized case of an op neuron-nki replaces runs in the `all` session too (marked `all_wheels`): with
    neuron-nki installed the case runs its kernel (tests/README.md, "Which session runs what")."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and _NKI_REPLACED.search(callspec.id):
            item.add_marker(pytest.mark.all_wheels)
