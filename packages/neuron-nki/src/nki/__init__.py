"""``nki``: the NKI kernel language (current API, NKI 0.2+) on a CPU NeuronCore simulator.

Only NumPy and ml_dtypes are needed (no torch). Entry points: ``@nki.jit`` (calling a kernel on NumPy arrays
simulates it), ``kernel[grid]``, ``nki.simulate(kernel)(*arrays)``, ``nki.benchmark``, and the seam
``nki.run_kernel(fn, args, kwargs, grid, target, precise) -> KernelRun(outputs, cost)`` for framework adapters
(``nki.register_framework`` routes e.g. torch tensors to an adapter).

Core structure (one module per concept; the legacy ``neuronxcc.nki`` layer reuses all of it):

* ``_targets``  the target a kernel is checked and costed for: the hardware spec's figures (``neuron_spec``);
  the `neuron` device's target for kernels on `neuron` tensors, else ``NEURON_PLATFORM_TARGET_OVERRIDE`` or the
  target of ``NEURON_SIM_INSTANCE_TYPE`` (default trn2).
* ``envvars``   every environment variable neuron-nki reads, declared once.
* ``extension`` what the legacy ``neuronxcc.nki`` layer may use beyond the public API.
* ``_dtypes``   NKI dtypes as real NumPy/ml_dtypes dtypes (``tfloat32``/MX-x4 are tagged float32/uint32);
  ``NKI_PRECISE_FP`` storage policy (precise: exact dtype storage; imprecise: narrow floats stored as fp32);
  ``cast_for_store`` is the one rounding/saturating conversion used on every write.
* ``_errors``    ``NkiError`` / ``NkiValidationError`` (an ``AssertionError``) with ``.code``, ``.filename``,
  ``.lineno``: ``kernel_location()`` walks the stack to the first frame outside registered internal dirs.
  A new API layer calls ``_errors.register_internal_dir(<its package dir>)`` so locations skip its frames too.
  ``unimplemented(qualname, why)`` makes a NotImplementedError entry counted by the coverage test.
* ``_context``  thread-local ``LaunchContext``: target, precise flag, grid, program id, per-core
  ``CoreState`` (timeline + live SBUF/PSUM bytes), accumulator registers, RNG, and ``extra`` (free dict for API
  layers; LNC2 puts ``core_barrier``/``lnc_sched``/``lnc_core`` there).
* ``_tensor``   ``Buffer`` objects, ``Allocation`` (storage array, logical dtype, scheduler ``ready`` times,
  PSUM "written" mask for ``nc_matmul(accumulate=None)``) and ``NkiTensor`` = allocation + NumPy view.
  ``allocate(shape, dtype, buffer, name, fill=None, api=...)`` makes every new tensor (NaN/4 filled,
  partition/capacity checked, k-th ``shared_hbm`` allocation shared by all SPMD instances).
  Indexing (``normalize_index``): ints, slices, ``nl.ds``, ``...``, ``None`` give views; integer arrays or objects
  with ``__nki_index__() -> int ndarray`` give advanced (gather/scatter) indices with NumPy broadcasting rules —
  this is the hook for legacy ``nl.arange``/``nl.mgrid`` expressions (``t.p`` → ``arange(P)[:, None]``,
  ``t.x`` → ``arange(F)[None, :]``). Bounds are always checked (documented OOB message).
  Masks (legacy ``mask=``): compute the predicate as a bool array over the index grid, clamp masked-out indices
  into range (``np.where(mask, idx, 0)``), then ``view.write_masked(values, mask)`` writes only selected
  elements; for compute results, ``nisa.tensor_copy_predicated`` is the on-chip equivalent.
* ``_limits``   hardware-limit checks with the documented messages (partition ≤ 128, PSUM bank, matmul tile
  sizes, memory types, capacity).
* ``_ops``      ALU/activation table: ``resolve(nl.add | np.add | "add") -> OpSpec`` (fn, reduce, identity);
  legacy NumPy-ufunc ``op=`` arguments resolve here too.
* ``_cost``     per-engine timelines with documented instruction costs, dependency list scheduling, and
  ``CostReport`` (``latency_ns``, ``engine_busy_ns``, MFU/MBU, legacy-style ``nc_latency``); always
  labelled simulated.
* ``isa``       dst-first instructions. Tile-returning (legacy) form: allocate the result with
  ``_tensor.allocate(...)`` (SBUF, or PSUM for matmul/transpose) and call the dst-first instruction — exactly
  what ``language.load``/``matmul``/``transpose`` do; ``nl.add(x, y, dtype=...)`` etc. already return tiles.
* ``language``  ``nl.*``; ``_launch`` ``jit``/``Kernel``/``simulate``/``run_kernel``/``benchmark``.
  SPMD: ``kernel[g0, g1, ...]`` runs every instance (row-major); ``nl.program_id(axis)``,
  ``nl.num_programs(axes)``, ``nl.program_ndim()``. Instances go round-robin to the logical cores
  (``NEURON_LOGICAL_NC_CONFIG``, default 2 on trn2/trn3); more than one core run as deterministic lock-step
  threads (``core_barrier``/``sendrecv`` switch cores). ``run_kernel(core_assignment=f)`` overrides placement
  (legacy ``nl.spmd_dim``/``nl.nc``); grid entries may implement ``__nki_grid_size__()``.
  ``run_kernel(precise=False)`` gives legacy fp32 storage; ``extra={...}`` seeds ``LaunchContext.extra``.
* ``torch``     the PyTorch integration (the only part that imports torch): the adapter of kernels on torch
  tensors, ``nki_op``/``wrap_nki``, the NKI library as native kernels, the ``neuron_device.plugins`` hooks.
* ``library``, ``tutorials``  NKI kernels (attention, norms, softmax, matmul) written in the language above.
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
