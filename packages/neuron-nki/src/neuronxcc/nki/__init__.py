"""``neuronxcc.nki``: the legacy NKI 0.1 API (Neuron 2.20–2.27) as a layer on the shared ``nki`` simulator core.

Module map:

* ``language`` (``nl``) / ``isa`` (``nisa``) — tile-returning functions and instructions (``_tile``, ``_index``
  hold the legacy tile type, ``nl.arange``/``mgrid`` expressions and masks);
* ``_launch`` — ``jit(mode=...)``, SPMD grids with ``nl.spmd_dim``/``nl.nc``, ``simulate_kernel``,
  ``baremetal``, ``benchmark``, ``profile`` (all simulated; costs come from the core's cost model);
* ``typing`` (``nt``), ``compiler`` (``ncc``) — annotations and allocation hints;
* ``_api_tables`` — the legacy API tables of the reference notes, used to compute coverage (``language`` makes its
  element-wise functions from their lists);
* ``tutorials`` — our ports of the classic legacy tutorial kernels.
"""

from __future__ import annotations

import os as _os

from nki import extension as _ext

from . import compiler, isa, language, typing
from ._launch import LegacyKernel, baremetal, benchmark, jit, profile, simulate_kernel, trace

_HERE = _os.path.dirname(_os.path.abspath(__file__))
_ext.register_internal_dir(_HERE)
# Our tutorial kernels are user code for error locations, like the core's own tutorials.
_ext.register_user_dir(_os.path.join(_HERE, "tutorials"))

__all__ = ["LegacyKernel", "baremetal", "benchmark", "compiler", "isa", "jit", "language", "profile",
           "simulate_kernel", "trace", "typing"]
