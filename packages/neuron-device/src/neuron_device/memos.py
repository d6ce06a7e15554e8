"""Memos a forked process hands back to the process it was forked from, so that the processes forked after it start
with them: `neuron-plan`'s ranks, forked one by one from one zygote.

A plugin's estimate that is costly and a function of its key alone (neuron-nki's flash-attention latency of a call
signature: 0.2 to 1.8 s of simulation a signature, the same in every rank of a search that meets it) is kept in a
`Memo`. A forked rank collects what it added to its memos (`additions`) and writes it out at its end; the zygote
merges each ended rank's additions into its own memos (`merge`) before it forks the next. Keys and values pickle; a
key names everything its value depends on beyond the code both processes run (the environment a rank inherits
from the zygote, its own variables, a script's choices), so an entry is exact in any process forked from the same
zygote.

A leaf: it imports nothing of the package.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Memo", "additions", "forget_additions", "memo", "merge"]


class Memo(dict):
    """A dict that knows which keys this process set (`added`): what `additions` hands back."""

    def __init__(self) -> None:
        super().__init__()
        self.added: set = set()

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self.added.add(key)


_memos: dict[str, Memo] = {}


def memo(name: str) -> Memo:
    """The process's memo `name` (a plugin's, named after its module), made empty on first use."""
    found = _memos.get(name)
    if found is None:
        found = _memos[name] = Memo()
    return found


def additions() -> dict[str, dict]:
    """The entries this process set in each memo since it started or since `forget_additions` (none merged)."""
    return {name: {key: found[key] for key in found.added if key in found} for name, found in _memos.items()
            if found.added}


def forget_additions() -> None:
    """What this process set so far is no longer its own additions (a forked child: its parent's entries)."""
    for found in _memos.values():
        found.added.clear()


def merge(entries: dict[str, dict]) -> None:
    """Add another process's `additions` to this process's memos (not counted as this process's additions)."""
    for name, values in entries.items():
        dict.update(memo(name), values)
