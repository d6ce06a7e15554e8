"""Launch state: which kernel instance is running, on which simulated NeuronCore, for which target.

Why: NKI APIs are free functions (``nl.program_id()``, ``nl.ndarray(...)``) that need the current launch
(grid position, target, precision policy, per-core memory accounting and cost timeline). It lives in a
thread-local so LNC2 / multi-threaded callers stay separate.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ._errors import NkiError, kernel_location
from ._liveness import OnChipLedger

if TYPE_CHECKING:  # pragma: no cover
    from ._cost import CoreTimeline
    from ._targets import Target

__all__ = ["CoreState", "LaunchContext", "current", "require"]


@dataclass
class CoreState:
    """One simulated NeuronCore of a launch: its engines' timeline and the live ranges of its on-chip memory."""

    index: int
    timeline: CoreTimeline
    ledger: OnChipLedger = field(default_factory=OnChipLedger)

    @property
    def sbuf_peak(self) -> int:
        """Most SBUF bytes per partition live at once (by live range) in any instance run so far."""
        return self.ledger.peak["sbuf"]

    @property
    def psum_peak(self) -> int:
        return self.ledger.peak["psum"]


@dataclass
class LaunchContext:
    """Everything a running kernel instance can ask about its launch."""

    target: Target
    precise: bool
    grid: tuple[int, ...]
    cores: list[CoreState]
    program_id: tuple[int, ...] = ()
    core: CoreState | None = None
    # k-th ``shared_hbm`` allocation of every instance maps to the same output tensor (kernel outputs are shared).
    shared_outputs: list = field(default_factory=list)
    shared_counter: int = 0
    rng: object = None
    registers: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)  # free slot for API layers (e.g. the legacy API)


_tls = threading.local()


def current() -> LaunchContext | None:
    """The running launch, or None outside a kernel."""
    return getattr(_tls, "ctx", None)


def set_current(ctx: LaunchContext | None) -> LaunchContext | None:
    prev = getattr(_tls, "ctx", None)
    _tls.ctx = ctx
    return prev


def require(api: str) -> LaunchContext:
    """The running launch; NKI APIs called outside a kernel raise ``err_nki_api_outside_of_nki_kernel``."""
    ctx = getattr(_tls, "ctx", None)
    if ctx is None:
        raise NkiError(f"Calling NKI API '{api}' outside of NKI kernels is not supported.",
                       code="err_nki_api_outside_of_nki_kernel", location=kernel_location(2))
    return ctx
