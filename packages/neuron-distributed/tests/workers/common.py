"""Shared worker plumbing: run named checks, print one marker per check, exit without Gloo's exit-time abort."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable


def run_checks(checks: dict[str, Callable[[], None]], selected: list[str] | None = None) -> None:
    for name, check in checks.items():
        if selected and name not in selected:
            continue
        try:
            check()
        except Exception as error:  # reported as a FAIL marker, with the traceback for the test's message
            traceback.print_exc()
            print(
                f"CHECK {name} FAIL {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            )
        else:
            print(f"CHECK {name} OK")
        sys.stdout.flush()


def finish() -> None:
    """Flush and leave without running interpreter teardown (Gloo threads vs shutdown, pytorch#190489)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
