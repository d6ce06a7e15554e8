"""Every test session compiles into its own temporary compile cache, Inductor cache and cache key, so no test
depends on state left by an earlier run (or pollutes the user's cache)."""

from __future__ import annotations

import os
import shutil
import tempfile

_session_dir = tempfile.mkdtemp(prefix="neuron-compile-tests-")
os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] = os.path.join(_session_dir, "neff-cache")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_session_dir, "inductor")
os.environ["XDG_CONFIG_HOME"] = os.path.join(_session_dir, "config")  # the cache's signing key


def pytest_unconfigure(config) -> None:
    shutil.rmtree(_session_dir, ignore_errors=True)
