"""Estimated device time of a kernel on a NeuronCore: a roofline per engine, plus a fixed launch cost.

    time = max(work on each engine / that engine's rate, HBM bytes / HBM bandwidth) + launch

Engines and their units of work (rates per physical NeuronCore, from the hardware spec `neuron_spec.hardware`):

* ``tensor``: FLOPs, at the Tensor engine's peak for the input dtype (bf16/fp16, fp32, fp8);
* ``vector``, ``scalar``, ``gpsimd``: elements processed, at lanes x clock (the Vector engine has twice the lanes
  for 16-bit types on trn2 and for 16/8-bit types on trn3, the Scalar engine for 16/8-bit types on trn3);
* ``dma``: no compute; the kernel costs its HBM traffic only.

HBM bandwidth is the per-physical-core share of the chip's bandwidth (trn2: 2.9 TB/s / 8 = 362.5 GB/s).
`estimate_kernel` is the one entry point: the eager runtime calls it per op signature (`optracking`), and a compiler
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
    "tensor_flops_per_second",
    "transfer_seconds",
]

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")

# Fixed cost of one kernel on the device. The DMA guide puts a DMA's semaphore-to-start cost at ~1.3 us; the rest
# (instruction issue, engine semaphores) is our assumption. Host-side runtime overheads are not modelled.
LAUNCH_SECONDS = 2.0e-6
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
    """HBM bandwidth share of one physical core."""
    return target.hbm_bytes_per_second_per_core


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
) -> KernelEstimate:
    """Roofline estimate of one kernel: `work` per engine (FLOPs for "tensor", elements for the others), the bytes
    it moves to and from HBM, the dtype its engines compute in, and how many physical cores it runs on."""
    target = _topology.topology().target if target is None else target
    if cores < 1:
        raise ValueError(f"a kernel runs on at least one core, got cores={cores}")
    if hbm_bytes < 0:
        raise ValueError(f"hbm_bytes must be non-negative, got {hbm_bytes}")
    rates = engine_rates(target)
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
        engine_seconds[engine] = amount / (rate * cores)
    memory_seconds = hbm_bytes / (hbm_bytes_per_second(target) * cores)
    compute = max(engine_seconds.values(), default=0.0)
    return KernelEstimate(
        seconds=max(compute, memory_seconds) + LAUNCH_SECONDS,
        engine_seconds=engine_seconds,
        memory_seconds=memory_seconds,
        launch_seconds=LAUNCH_SECONDS,
    )


def transfer_seconds(nbytes: int, target: _topology.Target | None = None) -> float:
    """Time of one host<->device copy of `nbytes` over the host link."""
    target = _topology.topology().target if target is None else target
    return TRANSFER_FIXED_SECONDS + nbytes / engine_rates(target).host_link
