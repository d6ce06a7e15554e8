"""Target NeuronCore generations (trn1 / trn2 / trn3) and their figures.

Why a module of its own: limits (SBUF size, matmul moving-free size) and the cost model (clocks, DMA bandwidth)
both depend on the target, and the target is chosen once per kernel launch from
``NEURON_PLATFORM_TARGET_OVERRIDE`` (default ``trn2``). Figures: ``reference/hardware.md``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["TARGETS", "Target", "current_target", "resolve_target"]

KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True)
class Target:
    """Per-NeuronCore figures used by limits and the cost model."""

    name: str  # trn1 / trn2 / trn3
    nc_version: int  # 2 / 3 / 4 (NeuronCore-vN)
    sbuf_partition_bytes: int
    psum_partition_bytes: int
    psum_bank_bytes: int
    psum_num_banks: int
    tensor_ghz: float
    vector_ghz: float
    scalar_ghz: float
    gpsimd_ghz: float
    dma_engines: int
    dma_bytes_per_ns_per_engine: float
    dma_fixed_ns: float  # semaphore-to-start latency of one DMA
    hbm_bytes_per_ns: float  # per NeuronCore (derived)
    cores_per_chip: int
    default_lnc: int
    moving_fmax: int  # nc_matmul moving free size limit (fp32 dst)
    pe_tile_rows: tuple[int, ...]  # supported PE row tile sizes

    @property
    def sbuf_bytes(self) -> int:
        return 128 * self.sbuf_partition_bytes


TARGETS: dict[str, Target] = {
    "trn1": Target("trn1", 2, 192 * KiB, 16 * KiB, 2 * KiB, 8, 2.8, 1.12, 1.4, 1.4, 16, 17.0, 1300.0, 410.0, 2, 1,
                   512, (128, 64)),
    "trn2": Target("trn2", 3, 224 * KiB, 16 * KiB, 2 * KiB, 8, 2.4, 0.96, 1.2, 1.2, 16, 23.0, 1300.0, 360.0, 8, 2,
                   512, (128, 64, 32)),
    "trn3": Target("trn3", 4, 256 * KiB, 16 * KiB, 2 * KiB, 8, 2.4, 1.2, 1.2, 1.2, 16, 33.0, 1300.0, 610.0, 8, 2,
                   4096, (128, 64, 32)),
}

_ALIASES = {"inf2": "trn1", "gen2": "trn1", "gen3": "trn2", "gen4": "trn3"}


def resolve_target(name: str | None) -> Target:
    """Map a target name or alias (``trn2``, ``gen3``, ``inf2`` …) to its :class:`Target`."""
    if name is None:
        return current_target()
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in TARGETS:
        raise ValueError(f"unknown NeuronCore target {name!r}; expected one of trn1/inf2/gen2, trn2/gen3, trn3/gen4")
    return TARGETS[key]


def current_target() -> Target:
    """Target selected by ``NEURON_PLATFORM_TARGET_OVERRIDE`` (default trn2, as our simulated device)."""
    return resolve_target(os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE") or "trn2")
