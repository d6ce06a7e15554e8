"""`neuron-plan`: plan a Trainium job at full scale (HBM fit, step time, cost) from an unmodified script.

    neuron-plan [--instance trn1.32xlarge] [--nodes N] [--steps N] [--ranks 0,31] [--json FILE] [--trace FILE]
                [--breakdown] [--tokens-per-step N] [--price-per-hour USD] -- python train.py ARGS
    neuron-plan ... -- torchrun --nproc-per-node 32 --nnodes 1 train.py ARGS
    neuron-plan --search space.toml [--axis NAME=V1,V2] ... -- python train.py --tp {tp} ...   (`plan_search`)
    neuron-plan --serve --batch 1,8,32 ... -- torchrun ... serve.py --batch {batch} ...   (`plan_serve`)

Each planned rank runs in its own process (`plan_ranks`), with the environment torchrun would give it on the whole
cluster; the report (`plan_report`) takes the slowest rank's step and the largest per-core HBM peak. Ranks that do the same work need planning once: by default
(`--ranks auto`) rank 0 is planned and, when it turns out to be a pipeline stage, one rank of every other stage (the
stages differ: first, middle, last), started as soon as rank 0's schedule names them; `--ranks 0,31` plans the
listed ranks. Up to `--jobs` ranks are planned at once. Pipeline ranks that run the same thing (the middle stages of
a model of equal blocks, wherever their neighbours are) are planned once: the others stop at their first schedule
step and take that plan, their sends priced for their own neighbours (`plan_ranks.Roles`; `--no-reuse` plans each).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

from .plan_command import cores_per_node, parse_command, positive, writable
from .plan_pipeline import combine
from .plan_ranks import Ranks, Roles
from .plan_report import build_report, format_report, write_trace

__all__ = ["cores_per_node", "main", "parse_command"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    if any(arg.split("=", 1)[0] in ("--search", "--axis") for arg in argv[:split]):
        from .plan_search import main as search

        return search(argv)
    if "--serve" in argv[:split]:
        from .plan_serve import main as serve

        return serve(argv)
    parser = argparse.ArgumentParser(prog="neuron-plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--instance", default="trn1.32xlarge")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps to plan (the last one is reported)")
    parser.add_argument("--ranks", default="auto",
                        help="comma-separated ranks to plan (the distinct roles); auto: rank 0, then every other "
                        "pipeline stage")
    parser.add_argument("--jobs", type=int, default=1, help="ranks planned at once (one process each)")
    parser.add_argument("--no-reuse", action="store_true",
                        help="plan every pipeline rank asked for, also those whose role another rank plans")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--trace")
    parser.add_argument("--breakdown", action="store_true",
                        help="print the step split by what it went to (matmul, attention, vector/scalar chains, "
                        "optimizer, recompute, exposed collectives by kind, pipeline bubble, ...); always in --json")
    parser.add_argument("--tokens-per-step", type=int)
    parser.add_argument("--price-per-hour", type=float)
    options = parser.parse_args(argv[:split])
    per_node = cores_per_node(options.instance)
    for option, value in (("--nodes", options.nodes), ("--steps", options.steps), ("--jobs", options.jobs)):
        positive(option, value)
    writable("--json", options.json_path)
    writable("--trace", options.trace)
    world = per_node * options.nodes
    interpreter, script = parse_command(argv[split + 1:], per_node, options.nodes)
    ranks = [0] if options.ranks == "auto" else [int(r) for r in options.ranks.split(",")]
    for rank in ranks:
        if not 0 <= rank < world:
            raise SystemExit(f"neuron-plan: rank {rank} is outside the world: {options.nodes} x {options.instance} "
                             f"= {options.nodes} x {per_node} NeuronCores = {world} ranks")
    roles = None if options.no_reuse else Roles()
    with tempfile.TemporaryDirectory() as scratch:
        plans = Ranks(scratch, interpreter, script, options, world, per_node, roles=roles)(
            ranks, stages_of=0 if options.ranks == "auto" else None)
    if roles is not None and roles.reused:
        print(f"neuron-plan: {roles.reused} of {len(plans)} ranks took the plan of a rank that runs the same thing "
              "(--no-reuse plans each)", file=sys.stderr)
    report = build_report(plans, instance=options.instance, nodes=options.nodes,
                          tokens_per_step=options.tokens_per_step, price_per_hour=options.price_per_hour)
    print(format_report(report, breakdown=options.breakdown))
    if options.json_path:
        with open(options.json_path, "w") as handle:
            json.dump(report, handle, indent=2)
    if options.trace:
        write_trace(options.trace, combine(plans))
    return 0


if __name__ == "__main__":
    sys.exit(main())
