"""Every patch of torch internals, in one place, each with its reason. Applied once by `register()`."""

from __future__ import annotations


def apply_all() -> None:
    """Apply all patches (idempotent)."""
