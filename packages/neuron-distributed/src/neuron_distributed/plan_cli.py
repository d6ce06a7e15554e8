"""`neuron-plan`: plan a Trainium job at full scale (HBM fit, step time, cost) from an unmodified script.

    neuron-plan [--instance trn1.32xlarge] [--nodes N] [--steps N] [--ranks 0,31] [--json FILE] [--trace FILE]
                [--tokens-per-step N] [--price-per-hour USD] -- python train.py ARGS
    neuron-plan ... -- torchrun --nproc-per-node 32 --nnodes 1 train.py ARGS

Each planned rank runs in its own process (`plan_rank`, fresh simulator state), forked from one that imported what
every rank needs, with the environment torchrun would give it on the whole cluster; the report takes the slowest
rank's step and the largest per-core HBM peak. Ranks that do the same work need planning once: by default
(`--ranks auto`) rank 0 is planned and, when it turns out to be a pipeline stage, one rank of every other stage (the
stages differ: first, middle, last), started as soon as rank 0's schedule names them; `--ranks 0,31` plans the
listed ranks. Up to `--jobs` ranks are planned at once.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

from neuron_spec.hardware import INSTANCE_TYPES, TARGETS
from neuron_spec.machine import INSTANCE

from . import envvars
from .plan_pipeline import announcing_stage_ranks, combine
from .planning import launcher_environment

__all__ = ["build_report", "cores_per_node", "main", "parse_command"]

STAGES = ".stages"  # suffix of the file in which a planned pipeline rank names every stage's rank

_REPORT_ORDER = ("world_size", "step_seconds", "compute_seconds", "communication_seconds",
                 "exposed_communication_seconds", "flops_per_step", "mfu", "peak_hbm_bytes", "peak_allocated_bytes", "hbm_capacity_bytes",
                 "fits", "tokens_per_second", "cost_per_step_usd", "cost_per_million_tokens_usd")


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


def parse_command(command: list[str], per_node: int, nodes: int) -> list[str]:
    """The script and its arguments (`[script, *args]` or `["-m", module, *args]`) of a `python ...` or
    `torchrun ...` command; a torchrun world the cluster cannot hold is refused with the arithmetic."""
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
        return rest
    if head.startswith("python"):
        return rest
    return command  # a script path given directly


def _run_script(script: list[str]) -> None:
    if script[0] == "-m":
        sys.argv = [script[1], *script[2:]]
        runpy.run_module(script[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(script)
        sys.path.insert(0, os.path.dirname(os.path.abspath(script[0])))
        runpy.run_path(script[0], run_name="__main__")


def _plan_one(rank: int, steps: int | None, out: str, script: list[str]) -> None:
    """Child process: plan `rank` (the environment is already the rank's) and write its plan as JSON; a pipeline
    rank first writes its stages' ranks to `out + STAGES` as soon as its schedule steps."""
    from .planning import plan_rank

    def announce(ranks: list[int]) -> None:
        with open(out + ".partial", "w") as handle:
            json.dump(ranks, handle)
        os.replace(out + ".partial", out + STAGES)  # whole or absent for the parent, which polls for it

    with announcing_stage_ranks(announce):
        plan = plan_rank(lambda: _run_script(script), rank=rank, world_size=envvars.WORLD_SIZE.read(), steps=steps)
    with open(out, "w") as handle:
        json.dump({**plan.as_dict(), "lanes": plan.lanes}, handle)


def build_report(plans: list[dict[str, Any]], *, instance: str, nodes: int, tokens_per_step: int | None,
                 price_per_hour: float | None) -> dict[str, Any]:
    """The job's report from its planned ranks: the slowest rank's step, the largest per-core HBM peak (a pipeline's
    schedule laid out first from every stage's costs)."""
    plans = combine(plans)
    slowest = max(plans, key=lambda p: p["step_seconds"])
    found = INSTANCE_TYPES[instance]
    target = TARGETS[found.target]
    peak_flops = target.tensor_tflops_bf16 * 1e12 * target.default_lnc  # one logical core
    step = slowest["step_seconds"]
    report: dict[str, Any] = {
        "instance": instance, "nodes": nodes, "world_size": slowest["world_size"],
        "ranks_planned": [p["rank"] for p in plans], "steps_observed": slowest["steps_observed"],
        "step_seconds": step, "compute_seconds": slowest["compute_seconds"],
        "communication_seconds": slowest["communication_seconds"],
        "exposed_communication_seconds": slowest["exposed_communication_seconds"],
        "flops_per_step": slowest["flops_per_step"],
        "mfu": slowest["flops_per_step"] / (step * peak_flops) if step > 0 else 0.0,
        "peak_hbm_bytes": max(p["peak_hbm_bytes"] for p in plans),
        "peak_allocated_bytes": max(p["peak_allocated_bytes"] for p in plans),
        "hbm_capacity_bytes": slowest["hbm_capacity_bytes"],
        "fits": all(p["fits"] for p in plans),
    }
    if slowest.get("pipeline"):
        pipe = slowest["pipeline"]
        report["pipeline"] = {key: pipe[key] for key in ("schedule", "num_stages", "n_microbatches", "pipeline_rank",
                                                         "bubble_fraction")}
        report["pipeline"]["stages"] = sorted({c["stage_index"]: c for p in plans for c in p["pipeline"]["stages"]}
                                              .values(), key=lambda c: c["stage_index"])
    oom = next((p for p in plans if p["oom"] is not None), None)
    if oom is not None:
        report["oom"] = {"rank": oom["rank"], **oom["oom"]}
    if tokens_per_step:
        report["tokens_per_second"] = tokens_per_step / step if step > 0 else 0.0
    if price_per_hour is None and found.usd_per_hour is not None:
        price_per_hour = found.price_per_hour()
    if price_per_hour is not None:
        report["price_per_hour_usd"] = price_per_hour
        report["cost_per_step_usd"] = step * price_per_hour * nodes / 3600
        if tokens_per_step:
            report["cost_per_million_tokens_usd"] = report["cost_per_step_usd"] / tokens_per_step * 1e6
    return report


def format_report(report: dict[str, Any]) -> str:
    """The report as text, one key a line, bytes in GiB."""
    lines = [f"neuron-plan: {report['nodes']} x {report['instance']}, world size {report['world_size']} "
             f"(ranks planned: {report['ranks_planned']})"]
    for key in _REPORT_ORDER:
        if key not in report:
            continue
        value = report[key]
        if key.endswith("_bytes"):
            text = f"{value / 2**30:.2f} GiB"
        elif isinstance(value, float):
            text = f"{value:.6g}"
        else:
            text = str(value)
        lines.append(f"  {key:32s} {text}")
    if "pipeline" in report:
        pipe = report["pipeline"]
        lines.append(f"  pipeline: {pipe['schedule']}, {pipe['num_stages']} stages, {pipe['n_microbatches']} "
                     f"micro-batches, bubble {pipe['bubble_fraction']:.1%} on pipeline rank {pipe['pipeline_rank']}")
        lines += [f"    stage {c['stage_index']:3d}: forward {c['forward_seconds'] * 1e3:9.3f} ms, backward "
                  f"{c['backward_seconds'] * 1e3:9.3f} ms, activations {c['activation_bytes'] / 2**30:7.2f} GiB a "
                  "micro-batch" for c in pipe["stages"]]
    if "oom" in report:
        oom = report["oom"]
        lines.append(f"  out of HBM on rank {oom['rank']} at {oom['op']} in {oom['module']}; largest live tensors:")
        lines += [f"    {e['module']:60s} {e['bytes'] / 2**30:8.2f} GiB in {e['tensors']} tensors"
                  for e in oom["largest_live_tensors_by_module"]]
    return "\n".join(lines)


def _trace(path: str, plans: list[dict[str, Any]]) -> None:
    """A Perfetto (Chrome JSON) trace of the planned step: a process per planned rank, a thread per stream."""
    events = []
    for plan in plans:
        events.append({"ph": "M", "name": "process_name", "pid": plan["rank"], "args": {"name": f"rank {plan['rank']}"}})
        for name, stream, start, end in plan["lanes"]:
            events.append({"ph": "X", "name": name, "pid": plan["rank"], "tid": stream, "ts": start * 1e6,
                           "dur": (end - start) * 1e6})
        if plan.get("schedule_lanes"):  # a pipeline stage: the whole schedule on a lane of its own
            events.append({"ph": "M", "name": "thread_name", "pid": plan["rank"], "tid": "schedule",
                           "args": {"name": "pipeline schedule"}})
            events += [{"ph": "X", "name": name, "pid": plan["rank"], "tid": "schedule", "ts": start * 1e6,
                        "dur": (end - start) * 1e6} for name, start, end in plan["schedule_lanes"]]
    with open(path, "w") as handle:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, handle)


def _preload(script: list[str]) -> None:
    """Import once what every planned rank imports: the planner (torch with it) and the modules the script imports
    at its top level. A module that fails to import here is left to the rank's own run, which reports it."""
    from . import planning  # noqa: F401

    if script[0] == "-m":
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(script[0])))
    try:
        with open(script[0]) as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError):  # the rank's own run reports it
        return
    for node in tree.body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            try:
                importlib.import_module(name)
            except Exception:  # the rank's own import raises it again, in context
                continue


def _zygote(requests: int, replies: int, world: int, per_node: int, steps: str, script: list[str]) -> None:
    """Child process: imports what every rank needs once (`_preload`), then forks a process per rank asked for on
    the `requests` pipe (a JSON line `[rank, out]`), and writes `[rank, exit code]` on `replies` as each ends. A
    rank forked from here skips the 5 s of imports a fresh interpreter pays (torch, transformers)."""
    _preload(script)
    children: dict[int, int] = {}
    pending, open_ = b"", True
    with os.fdopen(replies, "w", buffering=1) as outbox:
        while open_ or children:
            if open_ and select.select([requests], [], [], _Ranks.POLL_SECONDS)[0]:
                chunk = os.read(requests, 1 << 16)
                open_ = bool(chunk)
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    rank, out = json.loads(line)
                    pid = os.fork()
                    if pid == 0:
                        os.close(requests)
                        outbox.close()
                        _forked_rank(rank, world, per_node, steps, out, script)
                    children[pid] = rank
            elif not open_:
                time.sleep(_Ranks.POLL_SECONDS)
            while children:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                outbox.write(json.dumps([children.pop(pid), os.waitstatus_to_exitcode(status)]) + "\n")


def _forked_rank(rank: int, world: int, per_node: int, steps: str, out: str, script: list[str]) -> None:
    """A forked rank: its launcher environment, its plan, then exit (never returns)."""
    code = 1
    try:
        with open(os.devnull) as stdin:
            os.dup2(stdin.fileno(), 0)
        with launcher_environment(rank, world, per_node):
            _plan_one(rank, int(steps) if steps != "all" else None, out, script)
        code = 0
    except SystemExit as stop:  # as the interpreter ends on it: a number is the exit code, anything else is printed
        code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
        if not isinstance(stop.code, int) and stop.code is not None:
            print(stop.code, file=sys.stderr)
    except BaseException:  # printed as the interpreter prints an uncaught exception, exit code 1
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class _Ranks:
    """Plans ranks in processes forked from one zygote (`_zygote`), up to `--jobs` at once; a rank that fails stops
    the plan. With `--ranks auto` the other stages' ranks join the queue as soon as rank 0's schedule names them
    (rank 0 is still planning)."""

    POLL_SECONDS = 0.05

    def __init__(self, scratch: str, script: list[str], options: argparse.Namespace, world: int,
                 per_node: int) -> None:
        self.scratch, self.script, self.options, self.world, self.per_node = scratch, script, options, world, per_node
        self.zygote: subprocess.Popen | None = None
        self.unread = b""  # the start of a reply line not read whole yet

    def _out(self, rank: int) -> str:
        return os.path.join(self.scratch, f"rank{rank}.json")

    def _start(self, rank: int) -> None:
        if self.zygote is None:
            requests, self.requests = os.pipe()
            self.replies, replies = os.pipe()
            command = [sys.executable, "-m", "neuron_distributed.plan_cli", "--_zygote", str(requests),
                       str(replies), str(self.world), str(self.per_node), str(self.options.steps), *self.script]
            with INSTANCE.overridden(self.options.instance):
                self.zygote = subprocess.Popen(command, pass_fds=(requests, replies), start_new_session=True)
            os.close(requests)
            os.close(replies)
        os.write(self.requests, (json.dumps([rank, self._out(rank)]) + "\n").encode())

    def _finished(self) -> list[tuple[int, int]]:
        """(rank, exit code) of the ranks that ended since the last call (waits up to POLL_SECONDS for one)."""
        if not select.select([self.replies], [], [], self.POLL_SECONDS)[0]:
            return []
        chunk = os.read(self.replies, 1 << 16)
        if not chunk:
            raise SystemExit(f"neuron-plan: the process planning the ranks ended (exit code {self.zygote.wait()})")
        self.unread += chunk
        *lines, self.unread = self.unread.split(b"\n")
        return [tuple(json.loads(line)) for line in lines]

    def _stop(self, kill: bool) -> None:
        if self.zygote is None:
            return
        os.close(self.requests)
        if kill:
            os.killpg(self.zygote.pid, signal.SIGKILL)  # the zygote and the ranks it forked: a session of their own
        self.zygote.wait()
        os.close(self.replies)

    def __call__(self, ranks: list[int], *, stages_of: int | None = None) -> list[dict[str, Any]]:
        """The plans of `ranks`, and of the stage ranks rank `stages_of` announces (in rank order after them)."""
        plans: dict[int, dict[str, Any]] = {}
        order, pending, running = list(ranks), list(ranks), set()
        announced = self._out(stages_of) + STAGES if stages_of is not None else None
        failed = True
        try:
            while pending or running:
                while pending and len(running) < max(1, self.options.jobs):
                    rank = pending.pop(0)
                    self._start(rank)
                    running.add(rank)
                if announced is not None and os.path.exists(announced):
                    with open(announced) as handle:
                        others = sorted(set(json.load(handle)) - set(order))
                    order += others
                    pending += others
                    announced = None
                    continue
                for rank, code in self._finished():
                    running.discard(rank)
                    if code != 0:
                        raise SystemExit(f"neuron-plan: planning rank {rank} failed (exit code {code})")
                    with open(self._out(rank)) as handle:
                        plans[rank] = json.load(handle)
            failed = False
        finally:
            self._stop(kill=failed)
        return [plans[rank] for rank in order]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--_zygote"]:  # child process: forks the planned ranks
        requests, replies, world, per_node, steps, *script = argv[1:]
        _zygote(int(requests), int(replies), int(world), int(per_node), steps, script)
        return 0
    split = argv.index("--") if "--" in argv else len(argv)
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
    parser.add_argument("--tokens-per-step", type=int)
    parser.add_argument("--price-per-hour", type=float)
    options = parser.parse_args(argv[:split])
    per_node = cores_per_node(options.instance)
    if options.nodes < 1:
        raise SystemExit(f"neuron-plan: --nodes must be at least 1, got {options.nodes}")
    world = per_node * options.nodes
    script = parse_command(argv[split + 1:], per_node, options.nodes)
    ranks = [0] if options.ranks == "auto" else [int(r) for r in options.ranks.split(",")]
    for rank in ranks:
        if not 0 <= rank < world:
            raise SystemExit(f"neuron-plan: rank {rank} is outside the world: {options.nodes} x {options.instance} "
                             f"= {options.nodes} x {per_node} NeuronCores = {world} ranks")
    with tempfile.TemporaryDirectory() as scratch:
        plans = _Ranks(scratch, script, options, world, per_node)(ranks, stages_of=0 if options.ranks == "auto"
                                                                 else None)
    report = build_report(plans, instance=options.instance, nodes=options.nodes,
                          tokens_per_step=options.tokens_per_step, price_per_hour=options.price_per_hour)
    print(format_report(report))
    if options.json_path:
        with open(options.json_path, "w") as handle:
            json.dump(report, handle, indent=2)
    if options.trace:
        _trace(options.trace, combine(plans))
    return 0


if __name__ == "__main__":
    sys.exit(main())
