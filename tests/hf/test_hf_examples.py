"""Each `examples/hf_*.py` runs to completion (each checks its own `neuron` results against the CPU)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hf_support import ROOT

pytestmark = pytest.mark.optional


@pytest.mark.parametrize(
    ("script", "needs"),
    [
        ("hf_causal_lm.py", "transformers"),
        ("hf_lora.py", "peft"),
        ("hf_diffusion.py", "diffusers"),
        ("hf_accelerate.py", "accelerate"),
        ("hf_trl.py", "trl"),
        ("hf_kernels.py", "kernels"),
    ],
    ids=lambda v: str(v),
)
def test_example_runs(script, needs):
    pytest.importorskip(needs)
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script)], capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "== CPU" in result.stdout
