"""Progress of long operations (many graphs to compile, a sweep over layers or targets) on one terminal line.

Only when the stream is a terminal: in CI logs and redirected output nothing is written, so logs stay clean.
``NEURON_SIM_PROGRESS=0`` turns it off on terminals too. The line is redrawn in place (carriage return) at most
every `min_interval` seconds and erased when the iteration ends, so it never mixes into the program's own output.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import TextIO, TypeVar

from . import envvars

__all__ = ["PROGRESS_ENV", "progress"]

PROGRESS_ENV = envvars.PROGRESS.name
_T = TypeVar("_T")


def _enabled(stream: TextIO) -> bool:
    if not envvars.PROGRESS.read():
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def progress(items: Iterable[_T], description: str, *, total: int | None = None, stream: TextIO | None = None,
             min_interval: float = 0.1) -> Iterator[_T]:
    """Yield `items`, showing ``description: done/total`` on `stream` (default stderr) if it is a terminal."""
    stream = sys.stderr if stream is None else stream
    if not _enabled(stream):
        yield from items
        return
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    of = f"/{total}" if total is not None else ""
    width = 0
    last = float("-inf")
    done = 0

    def draw() -> None:
        nonlocal width, last
        text = f"{description}: {done}{of}"
        stream.write("\r" + text.ljust(width))
        stream.flush()
        width, last = len(text), time.monotonic()

    try:
        for item in items:
            if time.monotonic() - last >= min_interval:
                draw()
            yield item
            done += 1
        draw()  # the final count, then erase it
    finally:
        stream.write("\r" + " " * width + "\r")
        stream.flush()
