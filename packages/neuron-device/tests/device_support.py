"""Helpers shared by neuron-device's tests (imported by name: each test folder's helper modules have names of their
own, so all folders can run in one pytest process)."""

from __future__ import annotations

import os
import subprocess
import sys

import torch


def run_python(code: str, *, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (so a crash or a fresh `import torch` cannot affect this session)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=timeout, check=False
    )


def elapsed_ms(fn) -> float:
    """Simulated milliseconds that `fn`'s ops take on the current stream (events around it)."""
    torch.neuron.synchronize()
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    return start.elapsed_time(end)
