"""Fixtures of neuron-device's tests (helpers to import are in `device_support`)."""

from __future__ import annotations

import pytest
import torch
from device_support import run_python


@pytest.fixture
def python():
    return run_python


@pytest.fixture
def highest_precision():
    """float32 matmuls in full float32 for the test (the cost model's fp32 rate depends on the setting)."""
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(saved)
