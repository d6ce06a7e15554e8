"""`neuron-plan --serve`: a serving script planned at each batch size, its throughput against latency, and the
largest batch that fits.

    neuron-plan --serve --batch 1,8,32,128 [--instance trn1.32xlarge] [--nodes N] [--price-per-hour USD]
                [--json FILE] -- torchrun --nproc-per-node 32 serve.py --batch {batch} --input 128 --output 16

The script calls transformers' `generate` (docs/planning.md, "Serving"); `{batch}` in its arguments is replaced by
each batch size, the input and output lengths are the script's own. Each batch is planned as `neuron-plan` plans
it alone (`plan_search.search`: one process imports the script's modules once for every batch); the table gives
each batch's time to first token, time per output token, output tokens a second (the whole batch's, and a
sequence's), KV cache and peak HBM a core, whether it fits, and with a price the cost of a million output tokens.
The largest batch that fits is the largest of the batches given whose plan fits, and the smallest that does not
is named with where it runs out of HBM.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .plan_command import positive, writable
from .plan_search import Configuration, configurations, search

__all__ = ["format_curve", "main", "serving_curve"]

_COLUMNS = ("batch", "TTFT ms", "TPOT ms", "output tok/s", "tok/s a sequence", "KV cache GiB", "peak HBM GiB",
            "fits", "$/M output tokens")


def _batches(text: str) -> list[int]:
    try:
        batches = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SystemExit(f"neuron-plan: --batch {text!r} is not a list of batch sizes, e.g. 1,8,32") from None
    if not batches or any(b < 1 for b in batches):
        raise SystemExit(f"neuron-plan: --batch {text!r}: batch sizes are at least 1")
    return sorted(set(batches))


def serving_curve(configs: list[Configuration]) -> dict[str, Any]:
    """Each batch's serving figures (in batch order), the largest batch that fits and the smallest that does not
    (with where it ran out), from the planned configurations of a sweep over `batch`."""
    points = []
    for config in sorted(configs, key=lambda c: c.values["batch"]):
        report = config.report or {}
        point: dict[str, Any] = {"batch_size": config.values["batch"], "status": config.status}
        if config.reason is not None:
            point["error"] = config.reason
        if config.status == "planned" and "ttft_seconds" not in report:
            point["status"], point["error"] = "failed", "the script made no generate call (no serving figures)"
        if point["status"] == "planned":
            point.update({key: report[key] for key in (
                "ttft_seconds", "tpot_seconds", "output_tokens_per_second", "output_tokens", "kv_cache_bytes",
                "peak_hbm_bytes", "hbm_capacity_bytes", "fits", "cost_per_million_output_tokens_usd", "oom")
                if key in report})
            point["output_tokens_per_second_per_sequence"] = (
                report["output_tokens_per_second"] / report["batch_size"] if report["batch_size"] else 0.0)
        points.append(point)
    fitting = [p["batch_size"] for p in points if p.get("fits")]
    over = [p for p in points if p.get("fits") is False]
    curve: dict[str, Any] = {"points": points, "largest_batch_that_fits": max(fitting) if fitting else None}
    if over:
        first = min(over, key=lambda p: p["batch_size"])
        curve["smallest_batch_that_does_not_fit"] = first["batch_size"]
        if "oom" in first:
            curve["runs_out_at"] = first["oom"]
    return curve


def _row(point: dict[str, Any]) -> list[str]:
    if point["status"] != "planned":
        return [str(point["batch_size"]), point["status"] + ": " + point.get("error", "")]
    price = point.get("cost_per_million_output_tokens_usd")
    return [str(point["batch_size"]), f"{point['ttft_seconds'] * 1e3:.3f}", f"{point['tpot_seconds'] * 1e3:.3f}",
            f"{point['output_tokens_per_second']:.4g}", f"{point['output_tokens_per_second_per_sequence']:.4g}",
            f"{point['kv_cache_bytes'] / 2**30:.3f}", f"{point['peak_hbm_bytes'] / 2**30:.2f} of "
            f"{point['hbm_capacity_bytes'] / 2**30:.0f}", "yes" if point["fits"] else "no",
            "-" if price is None else f"{price:.4g}"]


def format_curve(curve: dict[str, Any], header: str) -> str:
    """The curve as a text table, then the largest batch that fits."""
    rows = [list(_COLUMNS), *(_row(p) for p in curve["points"])]
    full = [row for row in rows if len(row) == len(_COLUMNS)]
    widths = [max(len(row[i]) for row in full) for i in range(len(_COLUMNS))]
    lines = [header] + ["  " + "  ".join(cell.rjust(width) for cell, width in zip(row, widths))
                        if len(row) == len(_COLUMNS) else "  " + row[0].rjust(widths[0]) + "  " + row[1]
                        for row in rows]
    largest = curve["largest_batch_that_fits"]
    lines.append(f"  largest batch that fits: {largest if largest is not None else 'none of those planned'}")
    if "smallest_batch_that_does_not_fit" in curve:
        where = curve.get("runs_out_at")
        lines.append(f"  batch {curve['smallest_batch_that_does_not_fit']} does not fit"
                     + (f": out of HBM at {where['op']} in {where['module']}, called at {where['code']}"
                        if where else ""))
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """`neuron-plan --serve ...` (plan_cli hands the command line over when it holds `--serve`)."""
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="neuron-plan --serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--batch", required=True, help="the batch sizes, comma-separated: the script's {batch}")
    parser.add_argument("--instance", default="trn1.32xlarge")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=1, help="ranks planned at once (one process each)")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--price-per-hour", type=float)
    options = parser.parse_args(argv[:split])
    for option, value in (("--nodes", options.nodes), ("--jobs", options.jobs)):
        positive(option, value)
    writable("--json", options.json_path)
    command = argv[split + 1:]
    if not command:
        raise SystemExit("neuron-plan: give the command after '--', e.g. -- torchrun --nproc-per-node 32 serve.py "
                         "--batch {batch}")
    if not any("{batch}" in arg for arg in command):
        raise SystemExit("neuron-plan: --serve replaces {batch} in the script's arguments with each batch size; the "
                         "command has none (e.g. serve.py --batch {batch})")
    configs = configurations({"batch": _batches(options.batch)}, command, instance=options.instance,
                             nodes=options.nodes)
    prices = {} if options.price_per_hour is None else {None: options.price_per_hour}
    search(configs, steps=2, jobs=options.jobs, prices=prices, reuse=False, progress=sys.stderr,
           command="neuron-plan --serve")
    curve = serving_curve(configs)
    print(format_curve(curve, f"neuron-plan --serve: {options.nodes} x {options.instance}, {' '.join(command)}"))
    if options.json_path:
        with open(options.json_path, "w") as handle:
            json.dump({"serve": {"instance": options.instance, "nodes": options.nodes, "command": command, **curve},
                       "configurations": [c.record() for c in configs]}, handle, indent=2)
    return 0
