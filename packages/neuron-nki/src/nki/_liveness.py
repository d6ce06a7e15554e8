"""On-chip (SBUF/PSUM) allocation by live range, as the NKI compiler allocates.

Why: a Python object's lifetime is not a tile's. ``x = nl.load(a); y = nl.exp(x); z = nl.exp(y)`` keeps ``x``
bound to the end of the kernel, yet the compiler reuses its space once ``exp(x)`` has read it. So every on-chip
allocation records a :class:`LiveRange`: the tick it was allocated and the tick of its last access (any
instruction operand, read or written, through any view). Ticks come from one process-wide counter, so they
order events in program order. When a kernel instance ends, :meth:`OnChipLedger.settle` sweeps its ranges in
allocation order and raises the capacity error for the first allocation that does not fit beside the tiles
live at that moment, naming its kernel line; tiles a kernel returns count as live to its end. Loops need
nothing special: each iteration's tiles are fresh allocations whose ranges end at their last use.
"""

from __future__ import annotations

import heapq
import itertools

from ._alloc_checks import alloc_label
from ._errors import NkiValidationError, with_source

__all__ = ["LiveRange", "OnChipLedger", "tick", "touch"]

_CLOCK = itertools.count(1)
tick = _CLOCK.__next__


class LiveRange:
    """One on-chip allocation: ``[born, last]`` in ticks, its bytes per partition, what it is (shape, dtype,
    name; formatted only for an error) and its kernel site."""

    __slots__ = ("born", "last", "nbytes", "site", "what")

    def __init__(self, nbytes: int, what: tuple, site: tuple):
        self.born = self.last = tick()
        self.nbytes = nbytes
        self.what = what
        self.site = site


def touch(alloc) -> None:
    """Record an access to ``alloc`` now (HBM allocations have no range)."""
    r = alloc.span
    if r is not None:
        r.last = tick()


class OnChipLedger:
    """Live ranges of one NeuronCore's SBUF and PSUM allocations in the running kernel instance."""

    __slots__ = ("peak", "ranges")

    def __init__(self):
        self.ranges: dict[str, list[LiveRange]] = {"sbuf": [], "psum": []}
        self.peak: dict[str, int] = {"sbuf": 0, "psum": 0}

    def open(self, buffer_name: str, nbytes: int, what: tuple, site: tuple) -> LiveRange:
        r = LiveRange(nbytes, what, site)
        self.ranges[buffer_name].append(r)
        return r

    def settle(self, target) -> None:
        """Check capacity by live ranges, update the peaks and start a new instance."""
        for kind, cap in (("sbuf", target.sbuf_partition_bytes), ("psum", target.psum_partition_bytes)):
            ranges, self.ranges[kind] = self.ranges[kind], []
            live: list[tuple[int, int]] = []  # heap of (last, nbytes)
            used = 0
            for r in ranges:  # appended in allocation order
                while live and live[0][0] < r.born:
                    used -= heapq.heappop(live)[1]
                if used + r.nbytes > cap:
                    raise NkiValidationError(
                        f"{kind.upper()} capacity exceeded on {target.name}: allocating {alloc_label(*r.what)} "
                        f"({r.nbytes} bytes per partition) with {used} of {cap} bytes per partition already live",
                        code="err_out_of_memory", location=with_source(r.site))
                used += r.nbytes
                heapq.heappush(live, (r.last, r.nbytes))
                if used > self.peak[kind]:
                    self.peak[kind] = used
