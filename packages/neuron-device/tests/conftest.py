"""Shared helpers for neuron-device's tests."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def run_python(code: str, *, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (so a crash or a fresh `import torch` cannot affect this session)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=timeout, check=False
    )


@pytest.fixture
def python():
    return run_python
