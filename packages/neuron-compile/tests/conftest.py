"""Every test session compiles into its own temporary compile cache, Inductor cache and cache key, so no test
depends on state left by an earlier run (or pollutes the user's cache)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_session_dir = tempfile.mkdtemp(prefix="neuron-compile-tests-")
os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] = os.path.join(_session_dir, "neff-cache")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_session_dir, "inductor")
os.environ["XDG_CONFIG_HOME"] = os.path.join(_session_dir, "config")  # the cache's signing key


def pytest_unconfigure(config) -> None:
    shutil.rmtree(_session_dir, ignore_errors=True)


@pytest.fixture(autouse=True)
def _dynamo_forgets_each_tests_compiles():
    """Dynamo's code cache is cleared after every test: its recompile limit (8 per code object) would otherwise count
    the compiles of all tests a worker runs (`models.py`'s `Decoder.forward` is compiled once per model instance by
    several tests), and which tests share a worker depends on pytest-xdist's scheduling."""
    yield
    import torch

    torch._dynamo.reset()


@pytest.fixture
def fresh_dynamo_and_metrics():
    """A test that counts graphs or compiles starts from no cached graph and no recorded compile metrics."""
    import torch  # after the cache variables above are set

    torch._dynamo.reset()
    torch.neuron.reset_dynamo_metrics()
