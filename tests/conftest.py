"""The cross-package tests (this folder, not `hf/`, which has its own session) all run in the `all` nox session:
each is marked `all_wheels`, the marker that session selects (tests/README.md, "Which session runs what")."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if item.path.parent == _HERE:
            item.add_marker(pytest.mark.all_wheels)
