"""Simulated device time per layer of a small transformer block: eager on trn1/trn2/trn3, and compiled on trn2.

Eager: each layer's forward runs once on `neuron` (trn2); the per-signature work the runtime recorded
(`ledger.launches()`) is re-estimated for each target, as the simulation report does. Kernels recorded as
seconds only (the NKI library's norm and attention kernels, when neuron-nki is installed) count at their trn2
time on every target; the table says how much of each layer that is. Compiled: the same layer
under `torch.compile(backend="neuron")`, timed as the simulated time its graph charges to the stream (trn2 only:
a compiled graph's estimate is recorded as seconds and is not re-estimated). Prints a table and writes the plot
used in the docs:

    python benchmarks/sim_time_per_layer.py [--out docs/img/sim_time_per_layer.png] [--no-compile]
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import torch

from neuron_device import timeline, topology
from neuron_device.progress import progress
from neuron_device.simulation import ledger

HIDDEN, HEADS, SEQ, BATCH = 512, 8, 256, 4


class Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(HIDDEN, 3 * HIDDEN)
        self.out = torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(BATCH, SEQ, 3, HEADS, HIDDEN // HEADS).unbind(2)
        y = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                             is_causal=True)
        return self.out(y.transpose(1, 2).reshape(BATCH, SEQ, HIDDEN))


def layers() -> dict[str, torch.nn.Module]:
    mlp = torch.nn.Sequential(torch.nn.Linear(HIDDEN, 4 * HIDDEN), torch.nn.GELU(), torch.nn.Linear(4 * HIDDEN, HIDDEN))
    return {"layer norm": torch.nn.LayerNorm(HIDDEN), "attention": Attention(), "MLP": mlp,
            "LM head": torch.nn.Linear(HIDDEN, 8192, bias=False)}


def _stream_busy() -> float:
    return timeline.timeline(0).busy.get(0, 0.0)


def eager_seconds(layer: torch.nn.Module, x: torch.Tensor) -> dict[str, float]:
    """Simulated seconds of one forward of `layer` per target (re-estimated from the recorded work where there is
    some), plus "as recorded": the part that could not be re-estimated."""
    ledger.clear_op_tracking()
    with torch.no_grad():
        layer(x)
    launches = ledger.launches()
    recorded = sum(launch.calls * launch.seconds for launch in launches if launch.work is None)
    seconds = {name: recorded + sum(launch.calls * launch.work.seconds(target) for launch in launches
                                    if launch.work is not None)
               for name, target in topology.TARGETS.items()}
    return {**seconds, "as recorded": recorded}


def compiled_seconds(layer: torch.nn.Module, x: torch.Tensor) -> float:
    """Simulated seconds one compiled forward of `layer` charges to the stream (after a warm-up call compiles), or
    NaN (printed and left out of the plot) if compiling or running it fails."""
    compiled = torch.compile(layer, backend="neuron", dynamic=False)
    try:
        with torch.no_grad():
            compiled(x)
            before = _stream_busy()
            compiled(x)
    except Exception as error:  # a compiler bug must not hide the other layers' figures
        print(f"{type(layer).__name__}: compiled run failed: {type(error).__name__}: {str(error).splitlines()[0]}")
        return float("nan")
    return _stream_busy() - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/img/sim_time_per_layer.png")
    parser.add_argument("--no-compile", action="store_true", help="eager only")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    x = torch.randn(BATCH, SEQ, HIDDEN, device="neuron")
    rows = {}
    for name, layer in progress(layers().items(), "layers", total=4):
        layer = layer.to("neuron").eval()
        rows[name] = eager_seconds(layer, x)
        if not args.no_compile:
            rows[name]["trn2 compiled"] = compiled_seconds(layer, x)
    columns = [column for column in next(iter(rows.values())) if column != "as recorded"]
    print(f"simulated forward time per layer (us), batch {BATCH} x seq {SEQ} x hidden {HIDDEN}, fp32")
    print(f"{'layer':<12}" + "".join(f"{c:>15}" for c in columns) + f"{'not re-estimated':>18}")
    for name, row in rows.items():
        print(f"{name:<12}" + "".join(f"{row[c] * 1e6:>15.1f}" for c in columns) + f"{row['as recorded'] * 1e6:>18.1f}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(columns)
    for i, column in enumerate(columns):
        ax.bar([j + i * width for j in range(len(rows))], [row[column] * 1e6 for row in rows.values()], width,
               label=column if column.endswith("compiled") else f"{column} eager")
    ax.set_xticks([j + width * (len(columns) - 1) / 2 for j in range(len(rows))], list(rows))
    ax.set_ylabel("simulated device time (µs)")
    ax.set_title(f"Forward time per layer (batch {BATCH}, seq {SEQ}, hidden {HIDDEN}, fp32) — simulated estimate")
    ax.legend()
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
