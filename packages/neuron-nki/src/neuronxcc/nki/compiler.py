"""``neuronxcc.nki.compiler`` (``ncc``): allocation hints and compiler directives, accepted by the simulator.

Why they are accepted rather than modelled: they steer the real compiler's SBUF/PSUM placement and scheduling,
which the simulator does not model (it has no instruction scheduling and counts capacity, not addresses). So
``ncc.sbuf.mod_alloc(...)`` / ``ncc.psum.alloc(func)`` / ``auto_alloc()`` allocate in SBUF / PSUM like
``nl.sbuf`` / ``nl.psum``, and the decorators return the kernel unchanged. Directly allocated tensors
(``alloc``/``mod_alloc``) are not counted against SBUF/PSUM capacity: their placement (which may deliberately
alias, e.g. two PSUM tensors on the same banks) is the kernel author's, and the simulator gives each its own
storage. Arguments are still validated where the
legacy docs give rules (``mod_alloc`` needs ``base_addr``; ``alloc`` needs a callable).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from nki.extension import Buffer
from nki.extension import psum as _psum
from nki.extension import sbuf as _sbuf

__all__ = [
    "allocation_scope", "enable_stack_allocator", "force_auto_alloc", "multi_buffer", "no_reorder", "psum", "sbuf",
    "skip_middle_end_transformations",
]


class Allocator:
    """An allocation request for ``nl.ndarray(..., buffer=...)``: placement is ignored, ``buffer`` is used."""

    def __init__(self, buffer: Buffer, kind: str, **details):
        self.buffer = buffer
        self.kind = kind
        self.details = details

    def __repr__(self) -> str:
        return f"ncc.{self.buffer.name}.{self.kind}({self.details})"


class _BufferAllocators:
    """``ncc.sbuf`` / ``ncc.psum``: ``auto_alloc()``, ``alloc(func)``, ``mod_alloc(base_addr=..., ...)``."""

    def __init__(self, buffer: Buffer):
        self.buffer = buffer
        self.name = buffer.name
        self.on_chip = True

    def auto_alloc(self) -> Allocator:
        return Allocator(self.buffer, "auto_alloc")

    def alloc(self, func: Callable) -> Allocator:
        if not callable(func):
            raise TypeError(f"ncc.{self.buffer.name}.alloc expects a callable (idx, pdim_size, fdim_size) -> address")
        return Allocator(self.buffer, "alloc", func=func)

    def mod_alloc(self, *, base_addr: int | None = None, base_partition: int = 0, num_par_tiles=(),
                  num_free_tiles=(), base_bank: int | None = None, num_bank_tiles=()) -> Allocator:
        """Modulo allocation: SBUF takes ``base_addr`` (+ partition/free tile counts), PSUM ``base_bank`` and
        ``num_bank_tiles``."""
        if self.buffer.name == "sbuf" and base_addr is None:
            raise TypeError("ncc.sbuf.mod_alloc needs base_addr=")
        return Allocator(self.buffer, "mod_alloc", base_addr=base_addr, base_partition=int(base_partition),
                         num_par_tiles=tuple(num_par_tiles), num_free_tiles=tuple(num_free_tiles),
                         base_bank=base_bank, num_bank_tiles=tuple(num_bank_tiles))

    def __repr__(self) -> str:
        return f"ncc.{self.buffer.name}"


sbuf = _BufferAllocators(_sbuf)
psum = _BufferAllocators(_psum)


def _passthrough(func=None, **_options):
    """A decorator usable bare (``@d``) or called (``@d(...)``) that returns the kernel unchanged."""
    if func is None:
        return lambda f: f
    return func


def enable_stack_allocator(func=None, log_level: int = 50):
    """Stack allocation of SBUF/PSUM (a compiler strategy; the simulator does not place tensors)."""
    return _passthrough(func)


def skip_middle_end_transformations(func=None):
    """Skip compiler middle-end passes (nothing to skip in the simulator)."""
    return _passthrough(func)


def force_auto_alloc(func=None):
    """Ignore direct allocation in the kernel (the simulator always allocates automatically)."""
    return _passthrough(func)


def multi_buffer(func=None, **options):
    """Multi-buffering hint (scheduling is not modelled)."""
    return _passthrough(func)


@contextlib.contextmanager
def no_reorder():
    """Keep instructions in program order (the simulator never reorders)."""
    yield


@contextlib.contextmanager
def allocation_scope(*args, **kwargs):
    """Scope for direct allocations (placement is not modelled)."""
    yield
