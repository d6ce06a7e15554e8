"""Benchmark: simulated device time of NKI flash attention vs torch's unfused eager SDPA on `neuron`, per length.

Both run on the same `neuron` tensors in one process: the fused path is `F.scaled_dot_product_attention` (routed to
the NKI flash kernel when neuron-nki is installed), the unfused path is `aten::_scaled_dot_product_attention_math`
(what SDPA on `neuron` runs without neuron-nki). Device times are the simulator's estimates (not measured on
hardware); the table reports both and their ratio, plus the host wall time the simulation took.

Run: ``python benchmarks/nki_attention.py [--heads 2] [--head-dim 64] [--lengths 512 1024 2048]``
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

import torch_neuronx  # noqa: F401  (registers the device)
from neuron_device import timeline


def _device_seconds(fn) -> tuple[float, float]:
    """(simulated device seconds, host wall seconds) of `fn` on neuron:0."""
    line = timeline.timeline(0)
    torch.neuron.synchronize()
    start, wall = line.host, time.perf_counter()
    fn()
    torch.neuron.synchronize()
    return line.host - start, time.perf_counter() - wall


def main() -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048])
    args = ap.parse_args()
    rows = []
    for n in args.lengths:
        q, k, v = (torch.randn(1, args.heads, n, args.head_dim, device="neuron") for _ in range(3))
        fused, fused_wall = _device_seconds(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v,
                                                                                                 is_causal=True))
        unfused, unfused_wall = _device_seconds(
            lambda q=q, k=k, v=v: torch.ops.aten._scaled_dot_product_attention_math(q, k, v, is_causal=True))
        rows.append({"seq": n, "nki_flash_us": fused * 1e6, "unfused_us": unfused * 1e6, "ratio": unfused / fused,
                     "sim_wall_s": fused_wall, "unfused_wall_s": unfused_wall})
    print(f"{'seq':>6} {'NKI flash (sim us)':>19} {'unfused (sim us)':>17} {'unfused/flash':>14} {'sim wall s':>11}")
    for r in rows:
        print(f"{r['seq']:>6} {r['nki_flash_us']:>19.1f} {r['unfused_us']:>17.1f} {r['ratio']:>14.2f} "
              f"{r['sim_wall_s']:>11.2f}")
    print(json.dumps(rows))
    return rows


if __name__ == "__main__":
    main()
