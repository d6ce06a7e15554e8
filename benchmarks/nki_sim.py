"""Benchmark: the NKI simulator's host time against NumPy doing the same math.

Two cases (``--case``):

* ``matmul``: the fully optimised 1024×1024×1024 bf16 NKI matmul vs ``numpy.matmul`` on the same data (the bf16
  arrays themselves, ml_dtypes' matmul, and float32 copies, BLAS sgemm);
* ``flash_bwd``: ``nki.library``'s flash-attention backward (bf16, causal, one head, d = 128, seq 8192 by default)
  vs a NumPy implementation of the same math: the same 128×128 tiles, the same skipped (fully masked) tiles, float32
  arithmetic and the kernel's bf16 roundings (P and dS before their matmuls). BLAS is single-threaded on both sides
  (the simulator always runs that way). Target: simulator ≤ 1.5× NumPy (issue 20).

Both sides run interleaved ABBA (A = simulator, B = NumPy) for several rounds and are timed in process CPU time; we
report medians and the ratio simulator / NumPy as a table and as JSON. On a loaded machine the ratio moves by a few
percent between runs.

Run: ``python benchmarks/nki_sim.py [--case matmul|flash_bwd] [--rounds 5] [--size N]``
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
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def _abba(sides: dict, baselines: tuple[str, ...], rounds: int) -> dict[str, float]:
    """Median process CPU seconds per side, each baseline interleaved A B B A with the simulator."""
    times: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(rounds):
        for base in baselines:
            for name in ("simulator", base, base, "simulator"):
                times[name].append(_time(sides[name]))
    return {k: statistics.median(v) for k, v in times.items()}


def _matmul_case(args) -> dict:
    n = args.size or 1024
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
    med = _abba(sides, ("numpy_bf16", "numpy_f32"), args.rounds)
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


TILE = 128


def _flash_bwd_numpy(q, k, v, o, do, lse, scale: float, causal: bool):
    """FlashAttention-2 backward of one head in NumPy, tile by tile exactly as the NKI kernel computes it."""
    bf16 = ml_dtypes.bfloat16
    qf, kf, vf, of, dof = (np.asarray(a, np.float32) for a in (q, k, v, o, do))
    seq_q, seq_k = qf.shape[0], kf.shape[0]
    dsum = (dof * of).sum(1, keepdims=True)
    neg_lse = -lse
    dq, dk, dv = (np.zeros_like(x) for x in (qf, kf, vf))
    for k0 in range(0, seq_k, TILE):
        kt, vt = kf[k0:k0 + TILE], vf[k0:k0 + TILE]
        for q0 in range(0, seq_q, TILE):
            if causal and k0 > q0 + TILE - 1:
                continue  # fully masked tile
            qt, dot = qf[q0:q0 + TILE], dof[q0:q0 + TILE]
            s = (qt @ kt.T) * scale
            if causal and k0 + TILE - 1 > q0:
                s = np.where(np.arange(k0, k0 + TILE)[None, :] <= np.arange(q0, q0 + TILE)[:, None], s, -1.0e30)
            p = np.exp(s + neg_lse[q0:q0 + TILE])
            dv[k0:k0 + TILE] += p.astype(bf16).astype(np.float32).T @ dot
            ds = ((dot @ vt.T - dsum[q0:q0 + TILE]) * p).astype(bf16).astype(np.float32)
            dk[k0:k0 + TILE] += scale * (ds.T @ qt)
            dq[q0:q0 + TILE] += scale * (ds @ kt)
    return dq.astype(bf16), dk.astype(bf16), dv.astype(bf16)


def _flash_bwd_case(args) -> dict:
    from nki import _blas
    from nki.library.attention import flash_attention_bwd

    seq, d, causal = args.size or 8192, 128, True
    bf16 = ml_dtypes.bfloat16
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((1, 1, seq, d), dtype=np.float32).astype(bf16) for _ in range(4))
    scale = 1.0 / np.sqrt(d)
    # forward in float32 (not timed): the output and the logsumexp the backward pass reads
    s = np.asarray(q[0, 0], np.float32) @ np.asarray(k[0, 0], np.float32).T * scale
    s = np.where(np.tril(np.ones((seq, seq), bool)), s, -np.inf) if causal else s
    m = s.max(1, keepdims=True)
    p = np.exp(s - m)
    total = p.sum(1, keepdims=True)
    lse = (m + np.log(total)).astype(np.float32)
    o = ((p / total) @ np.asarray(v[0, 0], np.float32)).astype(bf16)[None, None]
    del s, p

    def swap(a):
        return np.swapaxes(a, 2, 3)

    def simulator():
        return flash_attention_bwd[1, 1].run(q, swap(q), k, swap(k), swap(v), o, do, swap(do), lse[None, None],
                                             scale, causal)

    def numpy_side():
        with _blas.single_threaded():
            return _flash_bwd_numpy(q[0, 0], k[0, 0], v[0, 0], o[0, 0], do[0, 0], lse, scale, causal)

    run = simulator()  # warm-up + agreement
    ref = numpy_side()
    err = max(float(np.max(np.abs(np.asarray(a[0, 0], np.float32) - np.asarray(b, np.float32))))
              for a, b in zip(run.outputs, ref))
    med = _abba({"simulator": simulator, "numpy": numpy_side}, ("numpy",), args.rounds)
    result = {
        "benchmark": "nki_sim flash_attention_bwd", "seq": seq, "head_dim": d, "causal": causal, "dtype": "bfloat16",
        "rounds": args.rounds, "median_cpu_s": med, "ratio_vs_numpy": med["simulator"] / med["numpy"],
        "target_ratio_max": 1.5, "max_abs_diff_vs_numpy": err,
        "simulated_latency_us": run.cost.latency_us, "simulated_target": run.cost.target,
    }
    print(f"{'side':<12}{'median CPU s':>14}")
    print(f"{'simulator':<12}{med['simulator']:>14.3f}")
    print(f"{'numpy':<12}{med['numpy']:>14.3f}")
    print(f"simulator / numpy: {result['ratio_vs_numpy']:.2f} (target <= 1.5); max |diff| {err:.4g}")
    print(json.dumps(result))
    return result


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=("matmul", "flash_bwd"), default="matmul")
    ap.add_argument("--rounds", type=int, default=5, help="ABBA rounds (each times every side twice)")
    ap.add_argument("--size", type=int, default=0, help="matmul: n (default 1024); flash_bwd: seq (default 8192)")
    args = ap.parse_args()
    return _flash_bwd_case(args) if args.case == "flash_bwd" else _matmul_case(args)


if __name__ == "__main__":
    main()
