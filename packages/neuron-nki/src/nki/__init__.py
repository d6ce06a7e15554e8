"""``nki``: the NKI kernel language (current API, NKI 0.2+) on a CPU NeuronCore simulator.

Core structure (for API layers such as the legacy ``neuronxcc.nki``, which reuses everything below):

* ``_targets``  — trn1/trn2/trn3 figures; ``NEURON_PLATFORM_TARGET_OVERRIDE`` picks one (default trn2).
* ``_dtypes``   — NKI dtypes as NumPy/ml_dtypes dtypes; ``NKI_PRECISE_FP`` storage policy; casts on store.
* ``_errors``   — ``NkiError``/``NkiValidationError`` carrying the kernel source line (``kernel_location``);
  call ``_errors.register_internal_dir(path)`` so frames of another API layer are skipped too.
* ``_context``  — thread-local ``LaunchContext``: target, precision, grid, program id, per-core state,
  accumulator registers, RNG, and a free ``extra`` dict for API layers.
* ``_tensor``   — ``Buffer``s, ``Allocation`` (storage + scheduler times + PSUM written mask) and ``NkiTensor``
  views; ``normalize_index`` accepts ints/slices/``nl.ds``/integer arrays and objects with ``__nki_index__()``
  (legacy ``nl.arange``/``mgrid`` expressions can implement it and become advanced indices; reads use
  ``base[key]``, writes ``base[key] = v``). ``allocate()`` makes new tensors (NaN/4-filled, capacity-checked).
* ``_limits``   — hardware-limit checks with documented messages.
* ``_ops``      — ALU operator / activation table: ``resolve(nl.add | np.add | "add")`` → ``OpSpec``.
* ``_cost``     — per-engine timelines, documented instruction costs, ``CostReport``.
* ``isa``       — dst-first instructions. A tile-returning (legacy) form is: allocate the result with
  ``_tensor.allocate`` then call the dst-first instruction, as ``language.matmul``/``load`` do. Masks (legacy)
  can be applied by computing into a temporary tile and copying with ``nisa.tensor_copy_predicated``, or by
  writing through an advanced-indexed view.
* ``language``  — ``nl.*``; ``_launch`` — ``jit``/``Kernel``/grids/``simulate``/``run_kernel`` (the NumPy seam).
  SPMD: ``kernel[g0, g1, ...]`` runs all instances serially (row-major); ``run_kernel(core_assignment=...)``
  places instances on cores (legacy ``nl.spmd_dim``/``nl.nc``); grid entries may implement
  ``__nki_grid_size__()``.
"""

from __future__ import annotations

from . import isa, language
from ._cost import CostReport
from ._errors import NkiError, NkiValidationError
from ._launch import Kernel, KernelRun, benchmark, jit, register_framework, run_kernel, simulate
from ._targets import TARGETS, current_target

__version__ = "0.1.0"

__all__ = [
    "TARGETS", "CostReport", "Kernel", "KernelRun", "NkiError", "NkiValidationError", "benchmark",
    "current_target", "isa", "jit", "language", "register_framework", "run_kernel", "simulate",
]
