"""Instruction-level cost model: per-engine busy time, what each engine waited on, and a latency from a schedule.

Why this shape: AWS's simulator has "no instruction scheduling or engine parallelism", but users want to see
what the chip would do. Each instruction is charged AWS's documented cost (``calibration.md`` §2) on its engine:

* TensorE ``nc_matmul``: ``max(min(64, N_stationary), N_moving)`` cycles, x4 for fp32 operands; back-to-back
  matmuls pipeline (a mat-vec issues every 64 cycles), and a new stationary tile costs a LoadStationary of a
  quarter of a matmul of its free size that overlaps the previous matmul. trn2/trn3 start each busy stretch
  throttled (the spec's ``tensor_throttle_start`` of peak, ramping to full over ``tensor_throttle_ramp_ns``).
* Vector/Scalar/GpSimd: the per-instruction formulas (``max(MIN_II, N)``, ``2N`` ...) plus a fixed
  :data:`ACCESS_CYCLES` per SBUF/PSUM operand, doubled data cycles for a minor-dimension stride over 16 bytes,
  and :data:`DEPENDENT_STALL_CYCLES` when an instruction consumes the result of the one just before it.
  On NeuronCore-v2 Vector and GpSimd share one SBUF port and Vector and Scalar one PSUM port. An instruction
  that recomputes an earlier one's values from unchanged inputs costs nothing (the compiler's common-subexpression
  removal, :meth:`CoreTimeline.compute`).
* DMA: transfers of one HBM tensor go through one DMA queue, which keeps one transfer in flight; a transfer
  pays :data:`DMA_QUEUE_HEAD_NS`, then is split into packets, one per DMA engine per group of 8 partitions (up to
  16 engines), each :data:`DMA_ROW_NS` per partition row plus its bytes at the engine's bandwidth; all queues
  together are capped by the 16 engines' bandwidth and HBM traffic by the core's HBM share. trn2/trn3 first
  generate descriptors in hardware (the spec's ``dma_descriptor_ns`` per DMA instruction, in order).

Scheduling: each engine is an in-order queue; an instruction starts when its engine is free, its inputs are
written (RAW) and the buffers it writes are no longer read or written (WAR/WAW), tracked per allocation. DMA
queues run beside compute, so overlap shows up as it does on the chip. The largest end time is the latency.
Timelines are per NeuronCore (LNC2 has two). The fitted parameters and their calibration points are listed in
``docs/simulated-time.md``; the parameters live in ``neuron_spec.costs``.
"""

from __future__ import annotations

import json
import weakref
from collections import Counter
from dataclasses import dataclass, field

from neuron_spec.costs import (
    ACCESS_CYCLES,
    DEPENDENT_STALL_CYCLES,
    DMA_PARTITIONS_PER_ENGINE,
    DMA_QUEUE_HEAD_NS,
    DMA_ROW_NS,
    LOAD_STATIONARY_RATIO,
    MIN_II,
    STRIDE_PENALTY_BYTES,
)

from ._targets import Target

__all__ = ["ENGINES", "MIN_II", "STRIDE_PENALTY_BYTES", "CoreTimeline", "CostReport"]

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma", "sync")
WAIT_CAUSES = ("input", "buffer", "port", "dma_queue")

# Named parameters (documented and fitted, with their sources and calibration points) are shared with the eager
# cost model: neuron_spec.costs.
_BUCKET_NS = 1000.0


def _reserve(use: dict[int, float], start: float, amount: float) -> float:
    """Book ``amount`` ns of a shared bandwidth from ``start`` on, filling earlier idle time first (a transfer
    issued later in program order may still use bandwidth nobody used); returns when the booking ends."""
    t = start
    while amount > 1e-9:
        b = int(t // _BUCKET_NS)
        room = min(_BUCKET_NS - use.get(b, 0.0), (b + 1) * _BUCKET_NS - t)
        if room <= 0.0:
            t = (b + 1) * _BUCKET_NS
            continue
        take = room if room < amount else amount
        use[b] = use.get(b, 0.0) + take
        amount -= take
        t = t + take if amount <= 1e-9 else (b + 1) * _BUCKET_NS
    return t


class CoreTimeline:
    """Engine timelines of one NeuronCore."""

    __slots__ = ("busy", "computed", "counts", "dge_free", "dma_pool_use", "dma_queue_free", "dma_queue_of", "end", "engine_free", "flops", "ghz", "hbm_bytes",
                 "hbm_use", "last_stationary", "last_tensor_cycles", "ports", "target", "throttle_from",
                 "waited")

    def __init__(self, target: Target):
        self.target = target
        self.ghz = {"tensor": target.tensor_ghz, "vector": target.vector_ghz, "scalar": target.scalar_ghz,
                    "gpsimd": target.gpsimd_ghz, "sync": target.scalar_ghz, "dma": 1.0}
        self.engine_free = dict.fromkeys(ENGINES, 0.0)
        self.busy = dict.fromkeys(ENGINES, 0.0)
        self.waited = {e: dict.fromkeys(WAIT_CAUSES, 0.0) for e in ENGINES}
        self.dma_pool_use: dict[int, float] = {}  # time bucket -> ns of the DMA pool's bandwidth booked
        self.dma_queue_free = [0.0] * target.dma_engines
        self.dma_queue_of: dict[int, int] = {}
        self.counts: Counter = Counter()
        # repeat key (operation and inputs as last written) -> (end of the instruction, its inputs): see compute()
        self.computed: dict[tuple, tuple[float, list]] = {}
        self.end = 0.0
        self.flops = 0
        self.hbm_bytes = 0
        self.hbm_use: dict[int, float] = {}
        self.dge_free = 0.0
        self.ports: dict[str, tuple[str, float]] = {}  # NC-v2 shared port -> (last engine, busy until)
        self.last_stationary = None
        self.last_tensor_cycles = 0.0
        self.throttle_from = None  # start of the current TensorE busy stretch (trn2/trn3)

    def _start(self, engine: str, free: float, reads, writes) -> float:
        """Earliest start on ``engine``; books the wait (if any) under what caused it."""
        t_in = 0.0
        for a in reads:
            if a.ready > t_in:
                t_in = a.ready
        t_buf = 0.0
        for a in writes:
            if a.ready > t_buf:
                t_buf = a.ready
            if a.read_done > t_buf:
                t_buf = a.read_done
        start = free
        if t_in > start or t_buf > start:
            cause, start = ("input", t_in) if t_in >= t_buf else ("buffer", t_buf)
            self.waited[engine][cause] += start - free
        return start

    def _port(self, engine: str, start: float, reads, writes) -> float:
        """NC-v2: Vector/GpSimd cannot touch SBUF, Vector/Scalar cannot touch PSUM, at the same time."""
        for port, pair in (("sbuf", ("vector", "gpsimd")), ("psum", ("vector", "scalar"))):
            if engine not in pair or not any(a.buffer.name == port for a in (*reads, *writes)):
                continue
            holder = self.ports.get(port)
            if holder is not None and holder[0] != engine and holder[1] > start:
                self.waited[engine]["port"] += holder[1] - start
                start = holder[1]
        return start

    def _finish(self, engine: str, start: float, end: float, reads, writes, name: str) -> float:
        self.engine_free[engine] = end
        self.busy[engine] += end - start
        return self._retire(end, reads, writes, name)

    def _retire(self, end: float, reads, writes, name: str) -> float:
        """An instruction (compute or DMA) ending at ``end``: its outputs are ready then, its inputs may be
        overwritten then, and the kernel lasts at least until then."""
        self.counts[name] += 1
        for a in writes:
            a.ready = end
        for a in reads:
            if end > a.read_done:
                a.read_done = end
        if end > self.end:
            self.end = end
        return end

    def compute(self, engine: str, cycles: float, reads, writes, name: str, flops: int = 0,
                strided: bool = False, repeat_key: tuple | None = None) -> float:
        """Charge an instruction of ``cycles`` documented cycles on ``engine``; return its end time (ns).

        ``repeat_key`` names the values the instruction computes (its operation and input regions, see
        ``isa._repeat_key``): the chip's compiler removes an instruction that recomputes the values of an earlier
        one from inputs unchanged since (common-subexpression elimination over the unrolled loops, e.g. a
        loop-invariant ``delta * u`` in the fused Mamba tutorial's v2), so a repeat costs nothing and its
        result is ready when the first one's was."""
        if repeat_key is not None:
            done = self.computed.get(repeat_key)
            if done is not None and all(ref() is not None for ref in done[1]):  # same live inputs, not reused ids
                for a in writes:
                    a.ready = max(a.ready, done[0])
                return done[0]
        end = self._compute(engine, cycles, reads, writes, name, flops, strided)
        if repeat_key is not None:
            self.computed[repeat_key] = (end, [weakref.ref(a) for a in reads])
        return end

    def _compute(self, engine: str, cycles: float, reads, writes, name: str, flops: int, strided: bool) -> float:
        free = self.engine_free[engine]
        start = self._start(engine, free, reads, writes)
        if engine != "tensor":
            if strided:
                cycles *= 2
            cycles += ACCESS_CYCLES * (len(reads) + len(writes))
            if free > 0.0 and start == free and any(a.ready == free for a in reads):
                cycles += DEPENDENT_STALL_CYCLES  # waits on the semaphore of the instruction just before
            if self.target.nc_version == 2 and engine in ("vector", "gpsimd", "scalar"):
                start = self._port(engine, start, reads, writes)
        ns = cycles / self.ghz[engine]
        end = start + ns
        if engine != "tensor" and self.target.nc_version == 2:
            for port, pair in (("sbuf", ("vector", "gpsimd")), ("psum", ("vector", "scalar"))):
                if engine in pair and any(a.buffer.name == port for a in (*reads, *writes)):
                    self.ports[port] = (engine, end)
        self.flops += flops
        return self._finish(engine, start, end, reads, writes, name)

    def matmul(self, cycles: float, stationary, reads, writes, n_stationary: int, flops: int,
               name: str = "nc_matmul") -> float:
        """A Tensor Engine matmul (or transpose): LoadStationary overlap and the trn2/trn3 power throttle."""
        free = self.engine_free["tensor"]
        start = self._start("tensor", free, reads, writes)
        if stationary is not self.last_stationary:
            load = max(MIN_II, n_stationary) / LOAD_STATIONARY_RATIO
            if start > free or load > self.last_tensor_cycles:  # nothing to hide it behind
                cycles += load if start > free else load - self.last_tensor_cycles
            self.last_stationary = stationary
        self.last_tensor_cycles = cycles
        ns = cycles / self.ghz["tensor"]
        ramp = self.target.tensor_throttle_ramp_ns
        if ramp:
            if self.throttle_from is None or start - free >= ramp:
                self.throttle_from = start  # re-engages after a ramp-long window below 50 % utilisation
            warm = (start - self.throttle_from) / ramp
            if warm < 1.0:
                low = self.target.tensor_throttle_start
                ns /= low + (1.0 - low) * warm
        self.flops += flops
        return self._finish("tensor", start, start + ns, reads, writes, name)

    def _queue(self, reads, writes) -> int:
        """DMA queue of a transfer: one per HBM tensor it moves (its transfers stay in order), at most 16."""
        hbm = [a for a in (*reads, *writes) if not a.buffer.on_chip] or list(writes) or list(reads)
        key = id(hbm[0]) if hbm else 0
        q = self.dma_queue_of.get(key)
        if q is None:
            q = self.dma_queue_of[key] = len(self.dma_queue_of) % len(self.dma_queue_free)
        return q

    def dma(self, nbytes: int, rows: int, reads, writes, name: str, hbm_bytes: int = 0) -> float:
        """Charge a DMA of ``nbytes`` over ``rows`` partition rows: queue head latency, then packets on engines."""
        t = self.target
        ready = 0.0
        for a in reads:
            if a.ready > ready:
                ready = a.ready
        for a in writes:
            if a.ready > ready:
                ready = a.ready
            if a.read_done > ready:
                ready = a.read_done
        dge = t.dma_descriptor_ns
        if dge:  # trn2/trn3: descriptors generated in hardware, one DMA instruction after another
            self.dge_free = (self.dge_free if self.dge_free > ready else ready) + dge
            ready = self.dge_free
        q = self._queue(reads, writes)
        queue_free = self.dma_queue_free[q]
        if queue_free > ready:
            self.waited["dma"]["dma_queue"] += queue_free - ready
            ready = queue_free
        nq = max(1, min(t.dma_engines, -(-rows // DMA_PARTITIONS_PER_ENGINE)))
        occupancy = rows / nq * DMA_ROW_NS + nbytes / nq / t.dma_bytes_per_ns_per_engine
        head = ready + DMA_QUEUE_HEAD_NS  # descriptors fetched, semaphores, packet set-up
        end = head + occupancy
        # the engines (and HBM) are shared by every queue: their bandwidth caps all transfers together
        pool = _reserve(self.dma_pool_use, head, nbytes / (t.dma_engines * t.dma_bytes_per_ns_per_engine))
        if pool > end:
            end = pool
        if hbm_bytes:
            hbm = _reserve(self.hbm_use, head, hbm_bytes / t.hbm_bytes_per_ns)
            if hbm > end:
                end = hbm
        self.dma_queue_free[q] = end  # one transfer in flight per queue
        self.busy["dma"] += occupancy * nq / t.dma_engines  # busy fraction of the whole DMA pool
        self.hbm_bytes += hbm_bytes
        return self._retire(end, reads, writes, name)


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
    engine_wait_ns: dict[str, dict[str, float]] = field(default_factory=dict)  # engine -> cause -> ns waited
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
            "engine_wait_ns": {e: dict(w) for e, w in self.engine_wait_ns.items()},
            "mfu": self.mfu(), "mbu": self.mbu(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def summary(self) -> str:
        lines = [f"[simulated {self.target}] estimated latency {self.latency_us:.3f} us, MFU {100 * self.mfu():.1f} %, "
                 f"MBU {100 * self.mbu():.1f} %"]
        for e, b in self.engine_busy_ns.items():
            if b:
                waits = ", ".join(f"{c} {w / 1000.0:.3f} us" for c, w in self.engine_wait_ns.get(e, {}).items() if w)
                lines.append(f"  {e:<7} busy {b / 1000.0:10.3f} us ({100.0 * b / (self.latency_ns or 1):5.1f} %)"
                             + (f", waited on {waits}" if waits else ""))
        return "\n".join(lines)

    @classmethod
    def from_cores(cls, target: Target, cores) -> CostReport:
        busy = dict.fromkeys(ENGINES, 0.0)
        waited = {e: dict.fromkeys(WAIT_CAUSES, 0.0) for e in ENGINES}
        counts: Counter = Counter()
        flops = hbm = 0
        lat = []
        for c in cores:
            tl = c.timeline
            for e in ENGINES:
                busy[e] += tl.busy[e]
                for cause, w in tl.waited[e].items():
                    waited[e][cause] += w
            counts.update(tl.counts)
            flops += tl.flops
            hbm += tl.hbm_bytes
            lat.append(tl.end)
        return cls(target.name, max(lat) if lat else 0.0, busy, dict(counts), flops, hbm, lat,
                   max((c.sbuf_peak for c in cores), default=0), max((c.psum_peak for c in cores), default=0),
                   {e: w for e, w in waited.items() if any(w.values())})
