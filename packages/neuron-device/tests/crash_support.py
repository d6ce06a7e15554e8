"""Running checks that could kill the interpreter (paths that segfault in plain torch 2.13) in a process of
its own."""

from __future__ import annotations

import signal
import textwrap

import pytest
from device_support import run_python


def run_checked(code: str, *, env: dict[str, str] | None = None) -> str:
    """Run `code` in a process of its own (`run_python`) and return its stdout; a crash or an exception fails the calling test.

    A crash names the signal, so a regressed patch shows up as "died with SIGSEGV", not as a dead test session.
    """
    code = textwrap.dedent(code)
    result = run_python(code, env=env)
    if result.returncode < 0:
        pytest.fail(
            f"the interpreter died with {signal.Signals(-result.returncode).name} running:\n{code}\n"
            f"stdout:\n{result.stdout[-2000:]}\nstderr:\n{result.stderr[-2000:]}"
        )
    if result.returncode != 0:
        pytest.fail(f"exit code {result.returncode} running:\n{code}\nstderr:\n{result.stderr[-4000:]}")
    return result.stdout
