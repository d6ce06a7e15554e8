"""The examples the README runs must keep working: each runs in a fresh interpreter and must exit 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


@pytest.mark.skipif(not EXAMPLES.is_dir(), reason="examples/ is not shipped with the wheel")
def test_quickstart_matches_cpu() -> None:
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py")], capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "device:     neuron:0" in run.stdout
    assert "aten::" in run.stdout  # the op report is printed
