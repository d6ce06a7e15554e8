"""Estimated device time of a kernel on a NeuronCore, from the same physics as the NKI instruction model.

    time = max(work on each engine / that engine's rate, HBM traffic through DMA) + launch

Engines and their units of work (rates per physical NeuronCore, from the hardware spec `neuron_spec.hardware`;
the instruction-level figures and fitted parameters from `neuron_spec.costs`):

* ``tensor``: FLOPs the 128 x 128 array is *occupied* for, at its peak for the input dtype (bf16/fp16, fp32,
  fp8): a matmul is priced by how it tiles onto the array (`matmul_array_flops`: NKI's pass cost
  ``max(min(64, stationary columns), moving columns)`` per 128-deep slice), so small, odd or skinny shapes pay
  for the part of the array they leave idle;
* ``vector``, ``scalar``, ``gpsimd``: elements processed, at lanes x clock (the Vector engine has twice the lanes
  for 16-bit types on trn2 and for 16/8-bit types on trn3, the Scalar engine for 16/8-bit types on trn3), and at
  least one instruction's minimum (64 cycles) plus its operand accesses;
* ``dma``: no compute; the kernel costs its HBM traffic only.

HBM traffic goes through the DMA engines: one DMA queue head latency, then the bytes at the smaller of the
core's HBM share (trn2: 2.9 TB/s / 8 = 362.5 GB/s) and its 16 DMA engines' bandwidth (trn1: 16 x 17 B/ns = 272
GB/s, below its 410 GB/s HBM share). The launch is the eager runtime's per-op overhead
(`neuron_spec.costs.EAGER_LAUNCH_SECONDS`); a compiled graph's kernels run back to back in one instruction stream
and pass ``launch_seconds=0``.
`estimate_kernel` is the one entry point: the eager runtime calls it per op signature (`simulation.ledger`), and a compiler
can call it per fused kernel with that kernel's summed work and its HBM traffic, so fusion shows up as saved bytes.

Logical cores: a `neuron` device with LNC=2 is two physical cores. An eager op is modelled on one of them (`cores=1`):
the model does not assume that a per-op kernel is split across the pair. A kernel that is written or compiled for
the pair (an NKI launch grid of 2, a compiled graph sharded over the logical core) passes `cores=2`, which doubles
every engine's rate and the HBM share. See docs/simulated-time.md for the assumptions and their limits.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import torch

from neuron_spec import costs as _costs
from neuron_spec import hardware as _hardware

from .. import numerics as _numerics
from .. import topology as _topology

__all__ = [
    "ENGINES",
    "EngineRates",
    "KernelEstimate",
    "engine_rates",
    "estimate_kernel",
    "hbm_bytes_per_second",
    "matmul_array_flops",
    "tensor_flops_per_second",
    "transfer_seconds",
]

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")

# Fixed cost of launching one eager op's kernel on the device (neuron_spec.costs). Host-side runtime overheads
# (dispatch, Python) are host time, not device time, and are not modelled.
LAUNCH_SECONDS = _costs.EAGER_LAUNCH_SECONDS
# Fixed cost of one host<->device transfer (the DMA guide's ~1.3 us semaphore-to-start cost).
TRANSFER_FIXED_SECONDS = _hardware.DMA_FIXED_NS * 1e-9

_16BIT = frozenset({torch.bfloat16, torch.float16})
_8BIT = frozenset({torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz})


@dataclasses.dataclass(frozen=True)
class EngineRates:
    """Element rates and links of one physical NeuronCore of a target (elements/s and bytes/s), derived from the
    hardware spec (`neuron_spec.hardware`: lanes x clock)."""

    vector: float  # 32-bit elements/s
    vector_narrow: float  # elements/s for the narrow dtypes the Vector engine runs at a wider rate
    vector_narrow_dtypes: frozenset[torch.dtype]
    scalar: float
    scalar_narrow: float
    scalar_narrow_dtypes: frozenset[torch.dtype]
    gpsimd: float
    host_link: float  # bytes/s between host memory and one device


def _dtypes(names: frozenset[str]) -> frozenset[torch.dtype]:
    return frozenset(getattr(torch, name) for name in names if hasattr(torch, name))


@functools.cache
def engine_rates(target: _topology.Target) -> EngineRates:
    """The engine rates of `target`."""
    return EngineRates(
        vector=target.vector_lanes * target.vector_ghz * 1e9,
        vector_narrow=target.vector_narrow_lanes * target.vector_ghz * 1e9,
        vector_narrow_dtypes=_dtypes(target.vector_narrow_dtypes),
        scalar=target.scalar_lanes * target.scalar_ghz * 1e9,
        scalar_narrow=target.scalar_narrow_lanes * target.scalar_ghz * 1e9,
        scalar_narrow_dtypes=_dtypes(target.scalar_narrow_dtypes),
        gpsimd=target.gpsimd_lanes * target.gpsimd_ghz * 1e9,
        host_link=target.host_link_bytes_per_second,
    )


def tensor_flops_per_second(target: _topology.Target, dtype: torch.dtype) -> float:
    """Tensor engine peak of one physical core for matmul inputs of `dtype`.

    fp32 runs at the fp32 rate unless the numerics policy rounds fp32 matmul operands to bf16
    (`torch.set_float32_matmul_precision("high"/"medium")` or CUDA's TF32 flags); 64-bit and integer inputs are
    computed in 32 bits, as on the hardware.
    """
    if dtype in _16BIT:
        return target.tensor_tflops_bf16 * 1e12
    if dtype in _8BIT:
        return target.tensor_tflops_fp8 * 1e12
    if dtype == torch.float32 and _numerics.fp32_matmul_rounds_to_bf16():
        return target.tensor_tflops_bf16 * 1e12
    return target.tensor_tflops_fp32 * 1e12


def hbm_bytes_per_second(target: _topology.Target) -> float:
    """Bandwidth of one physical core's HBM traffic: its HBM share, or its DMA engines' total when lower."""
    return min(target.hbm_bytes_per_second_per_core, target.dma_engines * target.dma_bytes_per_ns_per_engine * 1e9)


def _pass_cycles(stationary: int, moving: int) -> int:
    """Tensor-engine cycles of the passes over one 128-deep slice: stationary tiles of <= 128 columns times
    moving chunks of <= 512 columns, each ``max(min(64, stationary columns), moving columns)``."""
    pe, fmax = _costs.PE_SIZE, _costs.MATMUL_MOVING_FMAX
    full_s, rest_s = divmod(stationary, pe)
    full_m, rest_m = divmod(moving, fmax)
    cycles = 0
    for s_cols, s_count in ((pe, full_s), (rest_s, 1 if rest_s else 0)):
        for m_cols, m_count in ((fmax, full_m), (rest_m, 1 if rest_m else 0)):
            cycles += s_count * m_count * max(min(_costs.MIN_II, s_cols), m_cols)
    return cycles


def matmul_array_flops(m: int, k: int, n: int, batch: int = 1) -> float:
    """FLOPs of Tensor-engine occupancy of ``batch`` products [m, k] @ [k, n] tiled onto the 128 x 128 array: the
    cheaper of the two orientations (either operand can be the stationary one), every 128-deep slice of the
    contraction a full pass. Equals 2 m k n for shapes that fill the array."""
    if min(m, k, n, batch) <= 0:
        return 0.0
    slices = -(-k // _costs.PE_SIZE)
    cycles = min(_pass_cycles(m, n), _pass_cycles(n, m)) * slices * batch
    return 2.0 * _costs.PE_SIZE * _costs.PE_SIZE * cycles


@dataclasses.dataclass(frozen=True)
class KernelEstimate:
    """Estimated device time of one kernel and where it comes from (seconds)."""

    seconds: float
    engine_seconds: Mapping[str, float]
    memory_seconds: float
    launch_seconds: float

    @property
    def bound(self) -> str:
        """What limits the kernel: an engine name, "memory", or "launch" when it does no work."""
        busiest = max(self.engine_seconds.items(), key=lambda item: item[1], default=("launch", 0.0))
        if self.memory_seconds >= busiest[1]:
            return "memory" if self.memory_seconds > 0 else "launch"
        return busiest[0]


def estimate_kernel(
    work: Mapping[str, float],
    hbm_bytes: float,
    *,
    dtype: torch.dtype = torch.float32,
    target: _topology.Target | None = None,
    cores: int = 1,
    launch_seconds: float = LAUNCH_SECONDS,
) -> KernelEstimate:
    """Estimate of one kernel: `work` per engine (array FLOPs for "tensor", elements for the others), the bytes
    it moves to and from HBM, the dtype its engines compute in, how many physical cores it runs on, and its launch
    cost (an eager op's by default)."""
    target = _topology.topology().target if target is None else target
    if cores < 1:
        raise ValueError(f"a kernel runs on at least one core, got cores={cores}")
    if hbm_bytes < 0:
        raise ValueError(f"hbm_bytes must be non-negative, got {hbm_bytes}")
    rates = engine_rates(target)
    clocks = {"vector": target.vector_ghz, "scalar": target.scalar_ghz, "gpsimd": target.gpsimd_ghz}
    engine_seconds: dict[str, float] = {}
    for engine, amount in work.items():
        if amount < 0:
            raise ValueError(f"work on engine {engine!r} must be non-negative, got {amount}")
        if engine == "tensor":
            rate = tensor_flops_per_second(target, dtype)
        elif engine == "vector":
            rate = rates.vector_narrow if dtype in rates.vector_narrow_dtypes else rates.vector
        elif engine == "scalar":
            rate = rates.scalar_narrow if dtype in rates.scalar_narrow_dtypes else rates.scalar
        elif engine == "gpsimd":
            rate = rates.gpsimd
        elif engine == "dma":
            continue  # a DMA kernel costs its HBM traffic only
        else:
            raise ValueError(f"unknown engine {engine!r}; engines are {ENGINES}")
        seconds = amount / (rate * cores)
        if engine in clocks and amount:
            # at least one instruction: its minimum initiation interval, plus reading and writing its operands
            minimum = _costs.MIN_II / (clocks[engine] * 1e9)
            seconds = max(seconds, minimum) + 2 * _costs.ACCESS_CYCLES / (clocks[engine] * 1e9)
        engine_seconds[engine] = seconds
    memory_seconds = 0.0
    if hbm_bytes:
        # one DMA queue head latency before the bytes flow (the transfers of its tensors run on parallel queues)
        memory_seconds = _costs.DMA_QUEUE_HEAD_NS * 1e-9 + hbm_bytes / (hbm_bytes_per_second(target) * cores)
    compute = max(engine_seconds.values(), default=0.0)
    return KernelEstimate(
        seconds=max(compute, memory_seconds) + launch_seconds,
        engine_seconds=engine_seconds,
        memory_seconds=memory_seconds,
        launch_seconds=launch_seconds,
    )


def transfer_seconds(nbytes: int, target: _topology.Target | None = None) -> float:
    """Time of one host<->device copy of `nbytes` over the host link."""
    target = _topology.topology().target if target is None else target
    return TRANSFER_FIXED_SECONDS + nbytes / engine_rates(target).host_link
