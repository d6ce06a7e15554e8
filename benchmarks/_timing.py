"""Ratios of two workloads measured in one run, robust to machine drift and noise.

Both sides run the same number of calls per sample and are interleaved A B B A in every round, so slow drift (CPU
frequency, other processes) hits both sides equally. Time is process CPU time (`time.process_time_ns`): with
`torch.set_num_threads(1)` that is the work the process did, not wall time another process stole. Each round yields
one ratio; we report the median over rounds, and the median per-call time of each side.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

Workload = Callable[[], object]


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Result of `compare`: median seconds per call of each side and the median per-round ratio a / b."""

    a_seconds: float
    b_seconds: float
    ratio: float
    calls_per_sample: int
    rounds: int


def _sample(fn: Workload, calls: int) -> float:
    """Process CPU seconds per call of `fn`, over `calls` back-to-back calls."""
    start = time.process_time_ns()
    for _ in range(calls):
        fn()
    return (time.process_time_ns() - start) / calls / 1e9


def _calls_for(fn: Workload, target_seconds: float) -> int:
    """How many calls of `fn` take about `target_seconds` (at least one), so clock resolution does not matter."""
    calls = 1
    while True:
        elapsed = _sample(fn, calls) * calls
        if elapsed >= target_seconds / 4 or calls >= 1 << 20:
            return max(1, round(calls * target_seconds / max(elapsed, 1e-9)))
        calls *= 4


def compare(a: Workload, b: Workload, *, rounds: int = 7, target_seconds: float = 0.05, warmup: int = 3) -> Comparison:
    """Measure `a` against `b`: `rounds` ABBA rounds, each sample about `target_seconds` of the slower side."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    for _ in range(warmup):
        a()
        b()
    calls = min(_calls_for(a, target_seconds), _calls_for(b, target_seconds))
    a_times, b_times, ratios = [], [], []
    for _ in range(rounds):
        a1 = _sample(a, calls)
        b1 = _sample(b, calls)
        b2 = _sample(b, calls)
        a2 = _sample(a, calls)
        a_times += [a1, a2]
        b_times += [b1, b2]
        ratios.append((a1 + a2) / max(b1 + b2, 1e-12))
    return Comparison(
        a_seconds=statistics.median(a_times),
        b_seconds=statistics.median(b_times),
        ratio=statistics.median(ratios),
        calls_per_sample=calls,
        rounds=rounds,
    )
