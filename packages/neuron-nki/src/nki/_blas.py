"""Keep BLAS single-threaded while a kernel runs.

Why: the simulator issues many small GEMMs (≤128×128×512). A multi-threaded OpenBLAS spends far longer
waking threads than computing them (measured 0.4 ms vs 22 ms per 128×128×512 on a loaded 2-core host).
NumPy's bundled OpenBLAS exports ``openblas_set_num_threads_local``, which changes only the calling thread's
setting, so other threads of the process are unaffected. Without it this is a no-op.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os

import numpy as np

_setter = None
_searched = False


def _find_setter():
    global _setter, _searched
    if _searched:
        return _setter
    _searched = True
    libdir = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    for path in sorted(glob.glob(os.path.join(libdir, "*openblas*.so*"))):
        try:
            lib = ctypes.CDLL(path)
            fn = lib.openblas_set_num_threads_local
            fn.argtypes = [ctypes.c_int]
            fn.restype = ctypes.c_int
            _setter = fn
            break
        except (OSError, AttributeError):
            continue
    return _setter


@contextlib.contextmanager
def single_threaded():
    """Run the body with this thread's OpenBLAS thread count set to 1 (restored afterwards)."""
    fn = _find_setter()
    if fn is None:
        yield
        return
    prev = fn(1)
    try:
        yield
    finally:
        fn(prev if prev > 0 else 0)
