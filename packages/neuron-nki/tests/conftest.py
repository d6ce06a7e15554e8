"""Fixtures: deterministic RNG and a clean simulator environment for every test."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _default_env(monkeypatch):
    """Each test starts on the default target with precise FP and no simulator env overrides."""
    for var in ("NEURON_PLATFORM_TARGET_OVERRIDE", "NKI_PRECISE_FP", "NKI_SIMULATOR", "NEURON_LOGICAL_NC_CONFIG"):
        monkeypatch.delenv(var, raising=False)
