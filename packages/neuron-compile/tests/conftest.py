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


@pytest.fixture
def fresh_dynamo_and_metrics():
    """A test that counts graphs or compiles starts from no cached graph and no recorded compile metrics."""
    import torch  # after the cache variables above are set

    torch._dynamo.reset()
    torch.neuron.reset_dynamo_metrics()
    yield
    torch._dynamo.reset()
