"""Errors and hardware-limit checks, each naming the kernel source line that triggered it.

Why: a kernel author needs the line of *their* kernel, not of the simulator. Every check raises
:class:`NkiValidationError` (an ``AssertionError`` like AWS's 0.x simulator) whose message ends with
``  [kernel.py:12 in my_kernel: nisa.nc_matmul(...)]``; ``err.code`` holds the documented ``err_*`` code,
``err.filename``/``err.lineno`` the location. Message texts follow ``reference/nki.md`` §2.4 where one is documented.
"""

from __future__ import annotations

import linecache
import os
import sys

__all__ = [
    "NkiError",
    "NkiValidationError",
    "kernel_location",
    "raise_error",
]

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
# Frames inside these directories are simulator internals, never "the kernel line".
_INTERNAL_DIRS: list[str] = [_PKG_DIR]


def register_internal_dir(path: str) -> None:
    """Mark another package directory (e.g. ``neuronxcc/nki``) as simulator-internal for error locations."""
    p = os.path.dirname(os.path.abspath(path)) if os.path.isfile(path) else os.path.abspath(path)
    if p not in _INTERNAL_DIRS:
        _INTERNAL_DIRS.append(p)


class NkiError(Exception):
    """Base class of NKI simulator errors."""

    code: str = "err_nki"

    def __init__(self, message: str, code: str | None = None, location: tuple[str, int, str, str] | None = None):
        self.code = code or self.code
        self.filename, self.lineno, self.function, self.source = location or ("<unknown>", 0, "", "")
        self.raw_message = message
        if location:
            message = f"{message}  [{self.filename}:{self.lineno} in {self.function}: {self.source}]"
        super().__init__(message)


class NkiValidationError(NkiError, AssertionError):
    """A hardware constraint was violated (partition size, PSUM bank, matmul tile, memory type, bounds…)."""


_USER_DIRS = [os.path.join(_PKG_DIR, "tutorials")]  # kernels shipped with the package are user code


def register_user_dir(path: str) -> None:
    """Mark a directory inside an internal one (e.g. ``neuronxcc/nki/tutorials``) as user code for error locations."""
    p = os.path.abspath(path)
    if p not in _USER_DIRS:
        _USER_DIRS.append(p)


def _is_internal(filename: str) -> bool:
    f = os.path.abspath(filename)
    if any(f.startswith(d + os.sep) for d in _USER_DIRS):
        return False
    if any(f.startswith(d + os.sep) for d in _INTERNAL_DIRS):
        return True
    return "numpy" + os.sep in f or "ml_dtypes" + os.sep in f


def kernel_location(depth: int = 1) -> tuple[str, int, str, str]:
    """(file, line, function, source) of the innermost frame outside the simulator: the kernel's line."""
    frame = sys._getframe(depth)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _is_internal(filename) and not filename.startswith("<frozen"):
            src = linecache.getline(filename, frame.f_lineno).strip()
            return (filename, frame.f_lineno, frame.f_code.co_name, src)
        frame = frame.f_back
    return ("<unknown>", 0, "", "")


def raise_error(message: str, code: str = "err_nki", cls: type[NkiError] = NkiValidationError):
    """Raise ``cls`` with the kernel source location attached."""
    raise cls(message, code=code, location=kernel_location(2))


def fmt_shape(shape) -> str:
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def unimplemented(qualname: str, why: str):
    """A public API entry that is not simulated: raises NotImplementedError naming it (and is counted as such)."""

    def fn(*args, **kwargs):
        raise NotImplementedError(f"{qualname} is not implemented in the NKI simulator ({why})")

    fn.__name__ = fn.__qualname__ = qualname.rsplit(".", 1)[-1]
    fn.__doc__ = f"Not implemented in the simulator: {why}."
    fn._nki_unimplemented = True
    return fn
