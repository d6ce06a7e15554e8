"""`neuron-plan`: plan a Trainium job at full scale (HBM fit, step time, cost) from an unmodified script.

    neuron-plan [--instance trn1.32xlarge] [--nodes N] [--steps N] [--ranks 0,31] [--json FILE] [--trace FILE]
                [--breakdown] [--tokens-per-step N] [--price-per-hour USD] -- python train.py ARGS
    neuron-plan ... -- torchrun --nproc-per-node 32 --nnodes 1 train.py ARGS
    neuron-plan --search space.toml [--axis NAME=V1,V2] ... -- python train.py --tp {tp} ...   (`plan_search`)

Each planned rank runs in its own process (`plan_ranks`), with the environment torchrun would give it on the whole
cluster; the report (`plan_report`) takes the slowest rank's step and the largest per-core HBM peak. Ranks that do the same work need planning once: by default
(`--ranks auto`) rank 0 is planned and, when it turns out to be a pipeline stage, one rank of every other stage (the
stages differ: first, middle, last), started as soon as rank 0's schedule names them; `--ranks 0,31` plans the
listed ranks. Up to `--jobs` ranks are planned at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from neuron_spec.hardware import INSTANCE_TYPES, TARGETS

from .plan_pipeline import combine
from .plan_ranks import Ranks
from .plan_report import build_report, format_report, write_trace

__all__ = ["cores_per_node", "main", "parse_command"]


def cores_per_node(instance: str) -> int:
    """Logical NeuronCores (one rank each) of one instance: chips x physical cores per chip / default LNC."""
    found = INSTANCE_TYPES.get(instance)
    if found is None:
        raise SystemExit(f"neuron-plan: unknown instance type {instance!r}; known: {sorted(INSTANCE_TYPES)}")
    target = TARGETS[found.target]
    return found.chips * target.physical_cores_per_chip // target.default_lnc


def _option(args: list[str], names: tuple[str, ...]) -> tuple[str | None, list[str]]:
    """Remove `--name VALUE` / `--name=VALUE` (any spelling in `names`) from `args`; return the value and the rest."""
    rest, value, i = [], None, 0
    while i < len(args):
        arg = args[i]
        key = arg.split("=", 1)[0]
        if key in names:
            value = arg.split("=", 1)[1] if "=" in arg else args[i + 1]
            i += 1 if "=" in arg else 2
            continue
        rest.append(arg)
        i += 1
    return value, rest


# Interpreter options that take a value (`python -W ignore train.py`).
_PYTHON_VALUE_OPTIONS = frozenset({"-W", "-X", "--check-hash-based-pycs"})


def _is_python(path: str) -> bool:
    """`path` names a Python interpreter (`python`, `python3.11`, a venv's `bin/python`, a symlink to one)."""
    return any(os.path.basename(name).startswith("python") for name in (path, os.path.realpath(path)))


def _python_command(command: list[str]) -> tuple[list[str], list[str]]:
    """`python [options] (script | -m module) args` -> ([python, *options], [script | -m module, *args])."""
    interpreter, i = [command[0]], 1
    while i < len(command) and command[i].startswith("-") and command[i] != "-m":
        if command[i] == "-c" or command[i] == "-":
            raise SystemExit("neuron-plan: plans a script or a module (python train.py, python -m package.module), "
                             f"not {command[i]!r}")
        takes_value = command[i] in _PYTHON_VALUE_OPTIONS
        interpreter += command[i:i + 1 + takes_value]
        i += 1 + takes_value
    script = command[i:]
    if not script or script == ["-m"]:
        raise SystemExit(f"neuron-plan: no script or module in {' '.join(command)!r}")
    return interpreter, script


def parse_command(command: list[str], per_node: int, nodes: int) -> tuple[list[str], list[str]]:
    """The interpreter (`[python, *options]`: the command's own, else this one) and the script with its arguments
    (`[script, *args]` or `["-m", module, *args]`) of a `python ...` or `torchrun ...` command; a torchrun world the
    cluster cannot hold is refused with the arithmetic."""
    if not command:
        raise SystemExit("neuron-plan: give the command after '--', e.g. neuron-plan -- python train.py")
    head, rest = os.path.basename(command[0]), command[1:]
    if head.startswith("torchrun"):
        nproc, rest = _option(rest, ("--nproc-per-node", "--nproc_per_node"))
        nnodes, rest = _option(rest, ("--nnodes",))
        for flag in ("--standalone",):
            rest = [a for a in rest if a != flag]
        if nproc is not None and nproc.isdigit() and int(nproc) > per_node:
            raise SystemExit(f"neuron-plan: torchrun asks for {nproc} processes per node, but one instance has "
                             f"{per_node} NeuronCores (one rank each)")
        if nnodes is not None and nnodes.isdigit() and int(nnodes) != nodes:
            raise SystemExit(f"neuron-plan: torchrun asks for {nnodes} nodes but --nodes is {nodes}")
        if nproc is not None and nproc.isdigit() and int(nproc) != per_node:
            raise SystemExit(f"neuron-plan: torchrun asks for {nproc} processes per node; plan mode plans the whole "
                             f"cluster, {nodes} x {per_node} NeuronCores = {nodes * per_node} ranks (use every core)")
        return [sys.executable], ["-m" if arg == "--module" else arg for arg in rest]
    if _is_python(command[0]):
        return _python_command(command)
    return [sys.executable], command  # a script path given directly


def _writable(option: str, path: str | None) -> None:
    """Refuse, before planning, an output file that cannot be written (its directory missing or read-only)."""
    if path is None:
        return
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise SystemExit(f"neuron-plan: cannot write {option} {path}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise SystemExit(f"neuron-plan: cannot write {option} {path}: permission denied")


def _positive(option: str, value: int) -> None:
    if value < 1:
        raise SystemExit(f"neuron-plan: {option} must be at least 1, got {value}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    if any(arg.split("=", 1)[0] in ("--search", "--axis") for arg in argv[:split]):
        from .plan_search import main as search

        return search(argv)
    parser = argparse.ArgumentParser(prog="neuron-plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--instance", default="trn1.32xlarge")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps to plan (the last one is reported)")
    parser.add_argument("--ranks", default="auto",
                        help="comma-separated ranks to plan (the distinct roles); auto: rank 0, then every other "
                        "pipeline stage")
    parser.add_argument("--jobs", type=int, default=1, help="ranks planned at once (one process each)")
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
        _positive(option, value)
    _writable("--json", options.json_path)
    _writable("--trace", options.trace)
    world = per_node * options.nodes
    interpreter, script = parse_command(argv[split + 1:], per_node, options.nodes)
    ranks = [0] if options.ranks == "auto" else [int(r) for r in options.ranks.split(",")]
    for rank in ranks:
        if not 0 <= rank < world:
            raise SystemExit(f"neuron-plan: rank {rank} is outside the world: {options.nodes} x {options.instance} "
                             f"= {options.nodes} x {per_node} NeuronCores = {world} ranks")
    with tempfile.TemporaryDirectory() as scratch:
        plans = Ranks(scratch, interpreter, script, options, world, per_node)(
            ranks, stages_of=0 if options.ranks == "auto" else None)
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
