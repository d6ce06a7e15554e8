"""Plans of Llama-3.1 training at full size with `neuron-plan` (plan_scripts/llama_3d.py): what fits, the step, and
what planning costs this host (wall and CPU seconds, the largest child's peak resident memory).

    python benchmarks/plan_llama.py                 # the 70B rows
    python benchmarks/plan_llama.py --only 405b-3d

Rows: 70B on 32 x trn1.32xlarge with TP 32 / PP 8 / DP 4, seq 8192, micro-batch 1, global batch 1,024 (1F1B,
activation checkpointing) without and with sequence parallelism (the activations kept between a stage's forward
and backward shrink by TP), with sequence parallelism and each layer compiled with backend "neuron" as torchtitan
compiles it, GPipe (keeps all 256 micro-batches in flight), and Llama-3.1-405B (TP 32 / PP 9 /
DP 4 on 36 instances, 14 layers a stage). Out-of-HBM rows on one trn1.32xlarge (`--only`): 70B with DP only (a plain
DDP script, plan_scripts/llama_train.py) and with TP 32 alone.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plan_scripts")
_70B = ["--model", "70b", "--tp", "32", "--pp", "8", "--dp", "4", "--seq", "8192", "--micro-batch", "1",
        "--global-batch", "1024", "--checkpoint"]
_GLOBAL = 1024 * 8192  # tokens a step of the 3-D rows
ROWS = {  # name: (nodes, script, its arguments, tokens a step)
    "70b-3d": (32, "llama_3d.py", _70B, _GLOBAL),
    "70b-3d-sp": (32, "llama_3d.py", [*_70B, "--sequence-parallel"], _GLOBAL),
    "70b-3d-sp-compile": (32, "llama_3d.py", [*_70B, "--sequence-parallel", "--compile"], _GLOBAL),
    "70b-3d-sp-gpipe": (32, "llama_3d.py", [*_70B, "--sequence-parallel", "--schedule", "gpipe"], _GLOBAL),
    "405b-3d-sp": (36, "llama_3d.py", ["--model", "405b", "--tp", "32", "--pp", "9", "--dp", "4", "--seq", "8192",
                                       "--micro-batch", "1", "--global-batch", "1024", "--checkpoint",
                                       "--sequence-parallel"], _GLOBAL),
    "70b-dp": (1, "llama_train.py", ["--model", "70b", "--parallel", "ddp", "--seq", "8192"], 32 * 8192),
    "70b-tp": (1, "llama_3d.py", ["--model", "70b", "--tp", "32", "--seq", "8192", "--checkpoint",
                                  "--sequence-parallel"], 8192),
}


def plan_row(name: str, nodes: int, script: str, script_args: list[str], tokens: int, jobs: int) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "plan.json")
        command = [sys.executable, "-m", "neuron_distributed.plan_cli", "--instance", "trn1.32xlarge", "--nodes",
                   str(nodes), "--steps", "1", "--jobs", str(jobs), "--tokens-per-step", str(tokens),
                   "--json", out, "--", "python", os.path.join(SCRIPTS, script), *script_args]
        before, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        after, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter() - wall
        with open(out) as handle:
            report = json.load(handle)
    return {"row": name, "fits": report["fits"], "peak_hbm_gib": report["peak_hbm_bytes"] / 2**30,
            "step_seconds": report["step_seconds"], "tokens_per_second": report["tokens_per_second"],
            "mfu": report["mfu"], "bubble": report.get("pipeline", {}).get("bubble_fraction"),
            "oom": {key: report["oom"][key] for key in ("op", "module")} if "oom" in report else None,
            "ranks_planned": len(report["ranks_planned"]),
            "plan_wall_seconds": wall,
            "plan_cpu_seconds": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
            "largest_child_rss_gib": after.ru_maxrss / 2**20}  # the largest child's peak (kB), not a sum


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=sorted(ROWS))
    parser.add_argument("--jobs", type=int, default=2, help="ranks planned at once")
    args = parser.parse_args()
    for name, row in ROWS.items():
        if args.only == name or (args.only is None and name.startswith("70b-3d")):
            print(json.dumps(plan_row(name, *row, args.jobs)), flush=True)


if __name__ == "__main__":
    main()
