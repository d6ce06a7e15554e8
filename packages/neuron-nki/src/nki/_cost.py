"""Instruction-level cost model: per-engine busy time and an estimated latency from a dependency schedule.

Why this shape: AWS's simulator has "no instruction scheduling or engine parallelism", but users want to see
what the chip would do. Each instruction is charged the documented cost (``reference/nki.md`` §2.3 and §5):

* TensorE ``nc_matmul``: ``max(min(64, N_stationary), N_moving)`` cycles, ×4 when an input is fp32;
* VectorE/ScalarE/GpSimdE: the per-instruction formulas (``max(MIN_II, N)``, ``2N`` …, MIN_II = 64 cycles);
* DMA: a transfer is split over the 16 DMA queues (each serves 8 partitions); each queue is busy
  ``bytes / bandwidth`` plus a per-row and per-descriptor overhead; the ~1.3 µs fixed cost is latency.

Instructions are list-scheduled in program order: an instruction starts when its engine is free and the
tensors it reads (RAW) and writes (WAW/WAR) are ready, tracked per allocation. The largest end time is the
estimated latency. Timelines are per NeuronCore (LNC2 has two).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from ._targets import Target

__all__ = ["ENGINES", "MIN_II", "CoreTimeline", "CostReport"]

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma", "sync")
MIN_II = 64  # minimum initiation interval of a compute instruction, engine cycles
DMA_ROW_OVERHEAD_NS = 11.0  # per partition row: < 256 B/partition is overhead-bound (DMA bandwidth guide)
DMA_DESCRIPTOR_NS = 64.0  # per queue per transfer


class CoreTimeline:
    """Engine timelines of one NeuronCore."""

    __slots__ = ("busy", "counts", "dma_queues", "end", "engine_free", "flops", "ghz", "hbm_bytes", "target")

    def __init__(self, target: Target):
        self.target = target
        self.ghz = {"tensor": target.tensor_ghz, "vector": target.vector_ghz, "scalar": target.scalar_ghz,
                    "gpsimd": target.gpsimd_ghz, "sync": target.scalar_ghz, "dma": 1.0}
        self.engine_free = dict.fromkeys(ENGINES, 0.0)
        self.busy = dict.fromkeys(ENGINES, 0.0)
        self.dma_queues = [0.0] * target.dma_engines
        self.counts: Counter = Counter()
        self.end = 0.0
        self.flops = 0
        self.hbm_bytes = 0

    @staticmethod
    def _ready(reads, writes) -> float:
        t = 0.0
        for a in reads:
            if a.ready > t:
                t = a.ready
        for a in writes:
            if a.ready > t:
                t = a.ready
            if a.read_done > t:
                t = a.read_done
        return t

    def compute(self, engine: str, cycles: float, reads, writes, name: str, flops: int = 0) -> float:
        """Charge ``cycles`` on ``engine``; return the simulated end time (ns)."""
        ns = cycles / self.ghz[engine]
        start = max(self.engine_free[engine], self._ready(reads, writes))
        end = start + ns
        self.engine_free[engine] = end
        self.busy[engine] += ns
        self.counts[name] += 1
        self.flops += flops
        for a in writes:
            a.ready = end
        for a in reads:
            if end > a.read_done:
                a.read_done = end
        if end > self.end:
            self.end = end
        return end

    def dma(self, nbytes: int, rows: int, reads, writes, name: str, hbm_bytes: int = 0) -> float:
        """Charge a DMA of ``nbytes`` over ``rows`` partition rows, spread over the DMA queues."""
        t = self.target
        nq = max(1, min(t.dma_engines, (rows + 7) // 8))
        per_q_bytes = nbytes / nq
        per_q_rows = rows / nq
        occupancy = per_q_bytes / t.dma_bytes_per_ns_per_engine + per_q_rows * DMA_ROW_OVERHEAD_NS + DMA_DESCRIPTOR_NS
        ready = self._ready(reads, writes)
        queues = self.dma_queues
        order = sorted(range(len(queues)), key=queues.__getitem__)[:nq]
        end = 0.0
        for q in order:
            start = queues[q] if queues[q] > ready else ready
            queues[q] = start + occupancy
            if queues[q] > end:
                end = queues[q]
        end += t.dma_fixed_ns
        self.busy["dma"] += occupancy * nq / t.dma_engines  # busy fraction of the whole DMA pool
        self.counts[name] += 1
        self.hbm_bytes += hbm_bytes
        for a in writes:
            a.ready = end
        for a in reads:
            if end > a.read_done:
                a.read_done = end
        if end > self.end:
            self.end = end
        return end


@dataclass
class _LatencyPercentiles:
    """``nc_latency`` of a legacy ``benchmark_result``: every percentile is the one simulated latency."""

    latency_us: float

    def get_latency_percentile(self, p: int) -> float:
        if p not in (0, 1, 10, 25, 50, 90, 99, 100):
            raise ValueError(f"percentile must be one of 0,1,10,25,50,90,99,100, got {p}")
        return self.latency_us


@dataclass
class CostReport:
    """Simulated cost of one kernel launch (labelled as simulated: no hardware was measured)."""

    target: str
    latency_ns: float
    engine_busy_ns: dict[str, float]
    instruction_counts: dict[str, int]
    flops: int
    hbm_bytes: int
    per_core_latency_ns: list[float] = field(default_factory=list)
    sbuf_peak_bytes_per_partition: int = 0
    psum_peak_bytes_per_partition: int = 0
    simulated: bool = True

    @property
    def latency_us(self) -> float:
        return self.latency_ns / 1000.0

    @property
    def nc_latency(self) -> _LatencyPercentiles:
        return _LatencyPercentiles(self.latency_us)

    def utilisation(self) -> dict[str, float]:
        """Busy fraction of each engine over the estimated latency."""
        lat = self.latency_ns or 1.0
        return {e: b / lat for e, b in self.engine_busy_ns.items()}

    def mfu(self, peak_flops_per_ns: float | None = None) -> float:
        """Model FLOPs utilisation: matmul FLOPs / (latency × TensorE bf16 peak of all cores used)."""
        from ._targets import resolve_target

        t = resolve_target(self.target)
        peak = peak_flops_per_ns or 2 * 128 * 128 * t.tensor_ghz * max(1, len(self.per_core_latency_ns))
        return self.flops / ((self.latency_ns or 1.0) * peak)

    def mbu(self) -> float:
        """Memory-bandwidth utilisation: HBM bytes moved / (latency × per-core HBM bandwidth × cores)."""
        from ._targets import resolve_target

        t = resolve_target(self.target)
        return self.hbm_bytes / ((self.latency_ns or 1.0) * t.hbm_bytes_per_ns * max(1, len(self.per_core_latency_ns)))

    def to_dict(self) -> dict:
        return {
            "simulated": True, "target": self.target, "latency_ns": self.latency_ns,
            "engine_busy_ns": dict(self.engine_busy_ns), "instruction_counts": dict(self.instruction_counts),
            "flops": self.flops, "hbm_bytes": self.hbm_bytes, "per_core_latency_ns": list(self.per_core_latency_ns),
            "sbuf_peak_bytes_per_partition": self.sbuf_peak_bytes_per_partition,
            "psum_peak_bytes_per_partition": self.psum_peak_bytes_per_partition,
            "mfu": self.mfu(), "mbu": self.mbu(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def summary(self) -> str:
        lines = [f"[simulated {self.target}] estimated latency {self.latency_us:.3f} us, MFU {100 * self.mfu():.1f} %, "
                 f"MBU {100 * self.mbu():.1f} %"]
        for e, b in self.engine_busy_ns.items():
            if b:
                lines.append(f"  {e:<7} busy {b / 1000.0:10.3f} us ({100.0 * b / (self.latency_ns or 1):5.1f} %)")
        return "\n".join(lines)

    @classmethod
    def from_cores(cls, target: Target, cores) -> CostReport:
        busy = dict.fromkeys(ENGINES, 0.0)
        counts: Counter = Counter()
        flops = hbm = 0
        lat = []
        for c in cores:
            tl = c.timeline
            for e in ENGINES:
                busy[e] += tl.busy[e]
            counts.update(tl.counts)
            flops += tl.flops
            hbm += tl.hbm_bytes
            lat.append(tl.end)
        return cls(target.name, max(lat) if lat else 0.0, busy, dict(counts), flops, hbm, lat,
                   max((c.sbuf_peak for c in cores), default=0), max((c.psum_peak for c in cores), default=0))
