"""`neuron-plan --search`: which configuration of a job is fastest or cheapest, planned from the user's own script.

    neuron-plan --search space.toml [--axis NAME=V1,V2 ...] [--objective time|cost|tokens-per-dollar]
                [--model-config config.json] [--json FILE] [--html FILE] -- python train.py --tp {tp} --pp {pp} ...

The script's arguments are templates: `{name}` is replaced by the configuration's value of axis `name`, and an
argument that becomes empty is dropped (an axis `ac = ["--checkpoint", ""]` switches a flag). The space (a TOML
or JSON file, its axes under `[axes]` or at the top level, and/or repeated `--axis`) is the product of the axes'
values, in their order. Axes `instance` and `nodes` set neuron-plan's own options; `tp`, `pp` and `dp` are the
parallel degrees (`dp`, when not an axis, is the world size over tp x pp), `mbs` the micro-batch and
`global_batch` the sequences a step.

Each configuration is, before anything is planned: invalid (with the reason: the world size is not dp x tp x pp,
the degrees do not divide the world, the global batch or, with `--model-config`, the heads or layers), pruned (its
parameters' bytes a core, weights + gradients + optimizer states, exceed one core's HBM by arithmetic), or planned
as `neuron-plan` plans it alone (`plan_ranks`, `plan_report.build_report`); a configuration whose script fails
is reported failed, with the script's error, and the search goes on. Rank plans are shared between ranks that run
the same thing (`plan_ranks.Roles`). The report is `plan_search_report`'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import re
import sys
import tempfile
import time
import tomllib
from typing import Any

from neuron_spec.hardware import INSTANCE_TYPES
from neuron_spec.machine import INSTANCE, read_topology

from .plan_command import parse_command, positive, writable
from .plan_ranks import Ranks, Roles, Zygote
from .plan_report import build_report

__all__ = ["Configuration", "ModelShape", "configurations", "load_space", "main", "search"]

STATUSES = ("planned", "failed", "pruned", "invalid")
_NAME = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def load_space(path: str | None, axes: list[str]) -> dict[str, list[Any]]:
    """The search space: a TOML or JSON file's axes (under `axes`, else the top-level table), then each `--axis
    name=v1,v2` (numbers read as numbers); a value that is not a list is an axis of one value."""
    space: dict[str, list[Any]] = {}
    if path:
        try:
            with open(path, "rb") as handle:
                data = tomllib.load(handle) if not path.endswith(".json") else json.load(handle)
        except (OSError, ValueError) as error:  # tomllib.TOMLDecodeError and JSONDecodeError are ValueErrors
            raise SystemExit(f"neuron-plan: cannot read the search space {path}: {error}") from None
        table = data.get("axes", data)
        if not isinstance(table, dict):
            raise SystemExit(f"neuron-plan: the search space {path} is not a table of axes")
        space.update({name: values if isinstance(values, list) else [values] for name, values in table.items()})
    for axis in axes:
        name, _, values = axis.partition("=")
        if not _ or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name.strip()):
            raise SystemExit(f"neuron-plan: --axis {axis!r} is not NAME=V1,V2,...")
        space[name.strip()] = [_number(v.strip()) for v in values.split(",")]
    for name, values in space.items():
        if not values:
            raise SystemExit(f"neuron-plan: axis {name!r} has no values")
    if not space:
        raise SystemExit("neuron-plan: --search needs a space: a TOML or JSON file of axes, or --axis NAME=V1,V2")
    return space


def _number(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the validity checks and the pruning need of the model: a Hugging Face `config.json` of a decoder."""

    heads: int
    layers: int
    parameters: int

    @classmethod
    def from_config(cls, path: str) -> ModelShape:
        """From `config.json` (a Llama-shaped decoder: embedding, attention with `num_key_value_heads`, gated MLP,
        two norms a layer, final norm, head unless tied)."""
        with open(path) as handle:
            c = json.load(handle)
        try:
            hidden, layers, heads = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]
            kv, inter, vocab = c.get("num_key_value_heads", heads), c["intermediate_size"], c["vocab_size"]
        except KeyError as missing:
            raise SystemExit(f"neuron-plan: --model-config {path} has no {missing}") from None
        head_dim = c.get("head_dim") or hidden // heads
        layer = hidden * heads * head_dim * 2 + hidden * kv * head_dim * 2 + 3 * hidden * inter + 2 * hidden
        embeddings = vocab * hidden * (1 if c.get("tie_word_embeddings") else 2)
        return cls(heads, layers, layers * layer + embeddings + hidden)


@dataclasses.dataclass
class Configuration:
    """One point of the space, its command, and what became of it."""

    index: int
    values: dict[str, Any]  # the axes' values, then the derived ones (dp, world_size)
    instance: str
    nodes: int
    command: list[str]
    tokens_per_step: int | None = None
    status: str = "pending"
    reason: str | None = None  # why invalid or pruned; the error of a failed one
    report: dict[str, Any] | None = None
    rank_plans: int = 0  # rank plans run for it
    reused: int = 0  # its ranks whose plan another rank's plan gave
    seconds: float = 0.0  # wall seconds planning it

    def label(self) -> str:
        return " ".join(f"{name}={value}" for name, value in self.values.items()
                        if name not in ("world_size",) and value != "")

    def record(self) -> dict[str, Any]:
        """The JSON record: the configuration, its status, its reason or error, its report."""
        out = {"index": self.index, "values": self.values, "instance": self.instance, "nodes": self.nodes,
               "command": self.command, "status": self.status}
        if self.reason is not None:
            out["error" if self.status == "failed" else "reason"] = self.reason
        if self.status in ("planned", "failed"):
            out.update(rank_plans_run=self.rank_plans, rank_plans_reused=self.reused,
                       planning_wall_seconds=self.seconds)
        if self.report is not None:
            out["report"] = self.report
        return out


def _fill(text: str, values: dict[str, Any]) -> str:
    """`text` with every `{name}` replaced by its value (other braces kept: JSON arguments pass as they are)."""
    return _NAME.sub(lambda m: str(values[m[1]]) if m[1] in values else m[0], text)


def _templates(command: list[str], extra: list[str]) -> set[str]:
    return {m for text in (*command, *extra) for m in _NAME.findall(text)}


def configurations(space: dict[str, list[Any]], command: list[str], *, instance: str, nodes: int,
                   tokens_per_step: str | None = None, model: ModelShape | None = None,
                   state_bytes: float = 8.0, sharded_by: tuple[str, ...] = ("tp", "pp")) -> list[Configuration]:
    """Every configuration of the space, checked (invalid with the reason) and pruned by arithmetic (pruned with
    the reason); the others are left "pending", to be planned."""
    names = _templates(command, [tokens_per_step or ""])
    known = set(space) | {"dp", "world_size", "instance", "nodes"}
    unknown = sorted(names - known)
    if unknown:
        raise SystemExit(f"neuron-plan: the command names {', '.join('{' + n + '}' for n in unknown)}, which no "
                         f"axis gives (axes: {', '.join(space)})")
    for name in ("instance", "nodes"):
        if name in space and any(not isinstance(v, (str, int)) for v in space[name]):
            raise SystemExit(f"neuron-plan: axis {name!r} takes instance names / node counts")
    for name in space.get("instance", [instance]):
        if name not in INSTANCE_TYPES:
            raise SystemExit(f"neuron-plan: unknown instance type {name!r}; known: {sorted(INSTANCE_TYPES)}")
    out = []
    for index, combination in enumerate(itertools.product(*space.values())):
        values = dict(zip(space, combination))
        config = Configuration(index, values, str(values.get("instance", instance)), int(values.get("nodes", nodes)),
                               [])
        _check(config, "dp" in names or "dp" in space, model)
        config.command = [arg for arg in (_fill(a, config.values) for a in command) if arg != ""]
        if tokens_per_step is not None and config.status == "pending":
            config.tokens_per_step = math.prod(int(part) for part in _fill(tokens_per_step, config.values).split("*"))
        if config.status == "pending":
            _prune(config, model, state_bytes, sharded_by)
        out.append(config)
    return out


def _topology(instance: str) -> Any:
    return read_topology({INSTANCE.name: instance})


def _check(config: Configuration, wants_dp: bool, model: ModelShape | None) -> None:
    """Validity before planning: the world is dp x tp x pp, the degrees divide what they split."""
    values = config.values
    per_node = _topology(config.instance).device_count
    world = per_node * config.nodes
    tp, pp = int(values.get("tp", 1)), int(values.get("pp", 1))
    cluster = f"{config.nodes} x {config.instance} = {world} NeuronCores"
    reason = None
    if "dp" in values:
        dp = int(values["dp"])
        if dp * tp * pp != world:
            reason = f"world size: dp {dp} x tp {tp} x pp {pp} = {dp * tp * pp} ranks, but {cluster}"
    elif world % (tp * pp):
        reason = f"world size: {cluster}, not divisible by tp {tp} x pp {pp} = {tp * pp}"
    dp = int(values.get("dp", max(1, world // (tp * pp))))
    if wants_dp and "dp" not in values and reason is None:
        values["dp"] = dp
    values["world_size"] = world
    if reason is None and "global_batch" in values:
        mbs, batch = int(values.get("mbs", 1)), int(values["global_batch"])
        if batch % (dp * mbs):
            reason = f"global batch {batch} is not divisible by dp {dp} x micro-batch {mbs} = {dp * mbs}"
        elif batch // (dp * mbs) < pp:  # PyTorch's pipelining schedules refuse it
            reason = (f"{batch // (dp * mbs)} micro-batches (global batch {batch} / dp {dp} / micro-batch {mbs}) "
                      f"are fewer than the {pp} pipeline stages")
    if reason is None and model is not None:
        if model.heads % tp:
            reason = f"{model.heads} attention heads are not divisible by tp {tp}"
        elif model.layers % pp:
            reason = f"{model.layers} layers are not divisible by pp {pp}"
    if reason is not None:
        config.status, config.reason = "invalid", reason


def _prune(config: Configuration, model: ModelShape | None, state_bytes: float, sharded_by: tuple[str, ...]) -> None:
    """Pruned when the parameters' state alone (weights, gradients, optimizer states: `state_bytes` a parameter)
    cannot fit one core: each replica's cores hold every parameter, so the fullest core holds at least the
    parameters over the degrees that shard them (`sharded_by`)."""
    if model is None:
        return
    shards = math.prod(int(config.values.get(axis, 1)) for axis in sharded_by)
    need = model.parameters / shards * state_bytes
    capacity = _topology(config.instance).hbm_bytes_per_device
    if need > capacity:
        config.status = "pruned"
        config.reason = (f"weights + gradients + optimizer states need at least {need / 2**30:.1f} GiB a core "
                         f"({model.parameters / 1e9:.2f} B parameters / {shards} ({' x '.join(sharded_by)}) x "
                         f"{state_bytes:g} B), more than its {capacity / 2**30:.0f} GiB of HBM")


def _price(prices: dict[str | None, float], instance: str) -> float | None:
    """The price of an hour of `instance`: given for it, given for all, else the spec's cited one, else None."""
    if instance in prices:
        return prices[instance]
    if None in prices:
        return prices[None]
    return INSTANCE_TYPES[instance].usd_per_hour


def _last_error(log_path: str) -> str:
    """The last line a failed plan's processes wrote to stderr (the exception or the script's exit message)."""
    with open(log_path, errors="replace") as handle:
        lines = [line.strip() for line in handle if line.strip()]
    return lines[-1] if lines else "no message"


def search(configs: list[Configuration], *, steps: int, jobs: int, prices: dict[str | None, float],
           reuse: bool = True, progress: Any = sys.stderr, command: str = "neuron-plan --search") -> dict[str, int]:
    """Plan every pending configuration as `neuron-plan` plans it alone, sharing rank plans between ranks that run
    the same thing (`reuse`); a failure is recorded in its configuration and the search goes on; each one done is
    told on `progress`, as `command`'s. Returns the counts of rank plans run and reused."""
    pending = [c for c in configs if c.status == "pending"]
    started, done = time.monotonic(), 0
    with tempfile.TemporaryDirectory(prefix="neuron-plan-search-") as scratch:
        roles = Roles() if reuse else None
        zygotes: dict[tuple, Zygote] = {}  # one for every configuration (of an instance): imports paid once
        for config in pending:
            begin = time.monotonic()
            folder = os.path.join(scratch, f"config{config.index}")
            os.makedirs(folder)
            log_path = os.path.join(folder, "log")
            topo = _topology(config.instance)
            options = argparse.Namespace(instance=config.instance, steps=steps, jobs=jobs)
            before = (roles.run, roles.reused) if roles is not None else (0, 0)
            try:
                interpreter, script = parse_command(config.command, topo.device_count, config.nodes)
                world = topo.device_count * config.nodes
                plans = Ranks(folder, interpreter, script, options, world, topo.device_count, log=log_path,
                              roles=roles, zygotes=zygotes)([0], stages_of=0)
                config.report = build_report(plans, instance=config.instance, nodes=config.nodes,
                                             tokens_per_step=config.tokens_per_step,
                                             price_per_hour=_price(prices, config.instance))
                config.status = "planned"
            except SystemExit as stop:
                config.status = "failed"
                config.reason = f"{stop.code}: {_last_error(log_path)}" if os.path.exists(log_path) else str(
                    stop.code)
            except Exception as error:  # the report of a broken plan: that configuration's row, not the search's end
                config.status, config.reason = "failed", f"{type(error).__name__}: {error}"
            for key, zygote in list(zygotes.items()):  # one that ended (crashed) is not asked again
                if zygote.process.poll() is not None:
                    zygote.stop(kill=False)
                    del zygotes[key]
            after = (roles.run, roles.reused) if roles is not None else (0, 0)
            config.rank_plans, config.reused = after[0] - before[0], after[1] - before[1]
            if roles is None and config.report is not None:
                config.rank_plans = len(config.report["ranks_planned"])
            config.seconds = time.monotonic() - begin
            done += 1
            elapsed = time.monotonic() - started
            eta = elapsed / done * (len(pending) - done)
            print(f"{command}: {done}/{len(pending)} planned configurations done "
                  f"({len(configs)} in the space), elapsed {_clock(elapsed)}, ETA {_clock(eta)}; "
                  f"{config.label()}: {config.status}", file=progress, flush=True)
        for zygote in zygotes.values():
            zygote.stop(kill=False)
    run = sum(c.rank_plans for c in configs)
    return {"rank_plans_run": run, "rank_plans_reused": sum(c.reused for c in configs),
            "ranks_needed": run + sum(c.reused for c in configs)}


def _clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s"


def _prices(given: list[str]) -> dict[str | None, float]:
    """`--price-per-hour USD` (every instance) or `--price-per-hour INSTANCE=USD` (repeatable)."""
    out: dict[str | None, float] = {}
    for text in given:
        name, _, value = text.rpartition("=")
        if name and name not in INSTANCE_TYPES:
            raise SystemExit(f"neuron-plan: --price-per-hour {text!r}: unknown instance type {name!r}")
        try:
            out[name or None] = float(value)
        except ValueError:
            raise SystemExit(f"neuron-plan: --price-per-hour {text!r} is not USD or INSTANCE=USD") from None
    return out


def main(argv: list[str]) -> int:
    """`neuron-plan --search ...` (plan_cli hands the command line over when it holds `--search`)."""
    from .plan_search_report import format_table, rank, write_html

    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="neuron-plan --search", description=__doc__.split("\n\n")[0])
    parser.add_argument("--search", nargs="?", const="", metavar="SPACE", help="a TOML or JSON file of axes")
    parser.add_argument("--axis", action="append", default=[], metavar="NAME=V1,V2", help="an axis (repeatable)")
    parser.add_argument("--objective", default="time", choices=("time", "cost", "tokens-per-dollar"))
    parser.add_argument("--instance", default="trn1.32xlarge")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps to plan (the last one is reported)")
    parser.add_argument("--jobs", type=int, default=1, help="ranks planned at once (one process each)")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--html", dest="html_path", help="a self-contained page: the front's chart, the table, "
                        "each configuration's step breakdown")
    parser.add_argument("--tokens-per-step", help="a number, or a product of templates: '{global_batch}*{seq}'")
    parser.add_argument("--price-per-hour", action="append", default=[], metavar="[INSTANCE=]USD")
    parser.add_argument("--model-config", help="the model's config.json: heads and layers checked against tp and "
                        "pp, parameters for the pruning")
    parser.add_argument("--state-bytes-per-parameter", type=float, default=8.0,
                        help="weights + gradients + optimizer states a parameter (8: bf16 weights, gradients and "
                        "AdamW's two states; 16 with fp32 master weights and states)")
    parser.add_argument("--sharded-by", default="tp,pp", help="the axes that divide the parameters between cores")
    parser.add_argument("--no-reuse", action="store_true", help="plan every rank role of every configuration")
    options = parser.parse_args(argv[:split])
    for option, value in (("--nodes", options.nodes), ("--steps", options.steps), ("--jobs", options.jobs)):
        positive(option, value)
    writable("--json", options.json_path)
    writable("--html", options.html_path)
    command = argv[split + 1:]
    if not command:
        raise SystemExit("neuron-plan: give the command after '--', e.g. -- python train.py --tp {tp}")
    space = load_space(options.search, options.axis)
    model = ModelShape.from_config(options.model_config) if options.model_config else None
    configs = configurations(space, command, instance=options.instance, nodes=options.nodes,
                             tokens_per_step=options.tokens_per_step, model=model,
                             state_bytes=options.state_bytes_per_parameter,
                             sharded_by=tuple(a.strip() for a in options.sharded_by.split(",") if a.strip()))
    prices = _prices(options.price_per_hour)
    if options.objective != "time":
        unpriced = sorted({c.instance for c in configs if _price(prices, c.instance) is None})
        if unpriced:
            raise SystemExit(f"neuron-plan: --objective {options.objective} needs a price for {', '.join(unpriced)}: "
                             "the spec cites none; give --price-per-hour [INSTANCE=]USD")
        if options.objective == "tokens-per-dollar" and any(c.tokens_per_step is None for c in configs
                                                            if c.status == "pending"):
            raise SystemExit("neuron-plan: --objective tokens-per-dollar needs --tokens-per-step")
    started, cpu = time.monotonic(), _cpu_seconds()
    counts = search(configs, steps=options.steps, jobs=options.jobs, prices=prices, reuse=not options.no_reuse)
    summary = {"configurations": len(configs), **{s: sum(c.status == s for c in configs) for s in STATUSES},
               **counts, "objective": options.objective, "wall_seconds": time.monotonic() - started,
               "cpu_seconds": _cpu_seconds() - cpu, "command": command, "space": space}
    ordered = rank(configs, options.objective)
    print(format_table(ordered, summary))
    if options.json_path:
        with open(options.json_path, "w") as handle:
            json.dump({"search": summary, "configurations": [c.record() for c in ordered]}, handle, indent=2)
    if options.html_path:
        write_html(options.html_path, ordered, summary)
    return 0


def _cpu_seconds() -> float:
    """CPU seconds of this process and its ended children (the planned ranks)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system
