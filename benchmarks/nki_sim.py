"""Benchmark: simulate the fully optimised 1024×1024×1024 bf16 NKI matmul vs numpy.matmul on the same data.

Both sides run interleaved ABBA (A = simulator, B = NumPy) for several rounds; we report medians and the ratio
simulator / numpy as a table and as JSON. Baselines: ``numpy.matmul`` on the bf16 arrays themselves (the same
data; ml_dtypes' matmul) and, as the stricter reference, on float32 copies (BLAS sgemm).

Run: ``PYTHONPATH=packages/neuron-nki/src python benchmarks/nki_sim.py [--rounds 5]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import ml_dtypes
import numpy as np

from nki.tutorials.matmul import matmul_fully_optimized


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="ABBA rounds (each times every side twice)")
    ap.add_argument("--size", type=int, default=1024)
    args = ap.parse_args()
    n = args.size
    rng = np.random.default_rng(0)
    lhsT = rng.standard_normal((n, n)).astype(ml_dtypes.bfloat16)
    rhs = rng.standard_normal((n, n)).astype(ml_dtypes.bfloat16)
    lhsT_f32, rhs_f32 = lhsT.astype(np.float32), rhs.astype(np.float32)

    run = matmul_fully_optimized.run(lhsT, rhs)  # warm-up + correctness
    ref = lhsT_f32.T @ rhs_f32
    err = float(np.max(np.abs(run.outputs.astype(np.float32) - ref)) / np.max(np.abs(ref)))

    sides = {
        "simulator": lambda: matmul_fully_optimized.run(lhsT, rhs),
        "numpy_bf16": lambda: np.matmul(lhsT.T, rhs),
        "numpy_f32": lambda: np.matmul(lhsT_f32.T, rhs_f32),
    }
    times: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(args.rounds):
        for base in ("numpy_bf16", "numpy_f32"):  # ABBA against each baseline
            for name in ("simulator", base, base, "simulator"):
                times[name].append(_time(sides[name]))
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "benchmark": "nki_sim matmul_fully_optimized",
        "shape": [n, n, n], "dtype": "bfloat16", "rounds": args.rounds,
        "median_s": med,
        "ratio_vs_numpy_bf16": med["simulator"] / med["numpy_bf16"],
        "ratio_vs_numpy_f32": med["simulator"] / med["numpy_f32"],
        "target_ratio_max": 10.0,
        "max_rel_error": err,
        "simulated_latency_us": run.cost.latency_us,
        "simulated_target": run.cost.target,
        "simulated_tensor_engine_utilisation": run.cost.utilisation()["tensor"],
    }
    print(f"{'side':<14}{'median ms':>12}{'ratio':>10}")
    print(f"{'simulator':<14}{med['simulator'] * 1e3:>12.1f}{'':>10}")
    print(f"{'numpy_bf16':<14}{med['numpy_bf16'] * 1e3:>12.1f}{result['ratio_vs_numpy_bf16']:>10.2f}")
    print(f"{'numpy_f32':<14}{med['numpy_f32'] * 1e3:>12.1f}{result['ratio_vs_numpy_f32']:>10.2f}")
    print(f"simulated {run.cost.target} latency: {run.cost.latency_us:.1f} us (estimate, not a measurement)")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
