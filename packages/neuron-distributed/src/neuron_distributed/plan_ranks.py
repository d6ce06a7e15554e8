"""neuron-plan's planned processes: each planned rank runs in a process of its own (`plan_rank`, fresh simulator
state), forked from one zygote that imported what every rank needs, with the environment torchrun would give it on
the whole cluster. `Ranks` plans a list of ranks, up to `--jobs` at once; with `--ranks auto` the other pipeline
stages' ranks join as soon as rank 0's schedule names them.

The zygote is `python -m neuron_distributed.plan_ranks REQUESTS REPLIES WORLD PER_NODE STEPS SCRIPT...`.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import time
import traceback
from typing import Any

from neuron_spec.machine import INSTANCE

from . import envvars
from .plan_pipeline import announcing_stage_ranks, exchanging_stage_outputs
from .planning import launcher_environment

__all__ = ["STAGES", "WANTS", "Ranks", "run_script"]

STAGES = ".stages"  # suffix of the file in which a planned pipeline rank names every stage's rank
WANTS = ".wants"  # suffix of the file in which a planned rank names the rank whose stage outputs it waits for


def run_script(script: list[str]) -> None:
    """Run a script (`[path, *args]`) or a module (`["-m", name, *args]`) as `python` runs it."""
    sys.argv = _script_argv(script)
    if script[0] == "-m":
        runpy.run_module(script[1], run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(script[0])))
        runpy.run_path(script[0], run_name="__main__")


def _script_argv(script: list[str]) -> list[str]:
    """`sys.argv` as `python` gives it to the script (or module) and its arguments."""
    return [script[1], *script[2:]] if script[0] == "-m" else list(script)


def _write_whole(path: str, value: Any) -> None:
    """`value` as JSON at `path`, whole or absent for a reader that polls for it."""
    with open(path + ".partial", "w") as handle:
        json.dump(value, handle)
    os.replace(path + ".partial", path)


def _plan_one(rank: int, steps: int | None, out: str, script: list[str]) -> None:
    """Child process: plan `rank` (the environment is already the rank's) and write its plan as JSON; a pipeline
    rank first writes its stages' ranks to `out + STAGES` as soon as its schedule steps, and exchanges stage output
    shapes with the other planned ranks through files beside `out` (`_send_outputs`, `_receive_outputs`)."""
    from .planning import plan_rank

    scratch = os.path.dirname(out)
    with announcing_stage_ranks(lambda ranks: _write_whole(out + STAGES, ranks)), \
            exchanging_stage_outputs(lambda stage, metas: _write_whole(_outputs_file(scratch, stage), metas),
                                     lambda stage, peer: _receive_outputs(scratch, stage, peer, out)):
        plan = plan_rank(lambda: run_script(script), rank=rank, world_size=envvars.WORLD_SIZE.read(), steps=steps)
    with open(out, "w") as handle:
        json.dump({**plan.as_dict(), "lanes": plan.lanes}, handle)


def _outputs_file(scratch: str, stage: int) -> str:
    return os.path.join(scratch, f"stage{stage}.outputs.json")


def _receive_outputs(scratch: str, stage: int, peer: int, out: str) -> list[dict[str, Any]]:
    """The output shapes of pipeline stage `stage`, published by `peer`, the rank planning it: this rank names it in
    `out + WANTS` (neuron-plan plans it, if it was not asked to) and waits for its file."""
    _write_whole(out + WANTS, peer)
    path, peer_plan = _outputs_file(scratch, stage), os.path.join(scratch, f"rank{peer}.json")
    while not os.path.exists(path):
        if os.path.exists(peer_plan):
            raise RuntimeError(f"plan mode: rank {peer} was planned without publishing pipeline stage {stage}'s "
                               "outputs, whose shapes this rank's next stage needs")
        time.sleep(Ranks.POLL_SECONDS)
    with open(path) as handle:
        return json.load(handle)


def _preload(script: list[str]) -> None:
    """Import once what every planned rank imports: the planner (torch with it) and the modules the script imports
    at its top level. A module that fails to import here is left to the rank's own run, which reports it."""
    from . import planning  # noqa: F401

    # The script's argv while its imports run, as `python` gives it: a module may read it at import (torchtitan's
    # `ConfigManager.parse_args(args=sys.argv[1:])` default is evaluated then), and the ranks forked from here keep it.
    sys.argv = _script_argv(script)
    if script[0] == "-m":
        try:
            spec = importlib.util.find_spec(script[1])
        except (ImportError, ValueError):  # the rank's own run reports it
            return
        path = spec.origin if spec is not None and spec.submodule_search_locations is None else None
        if path is None:  # a package run by its __main__, or nothing found: left to the rank's run
            return
    else:
        path = script[0]
        sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        with open(path) as handle:
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
            if open_ and select.select([requests], [], [], Ranks.POLL_SECONDS)[0]:
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
                time.sleep(Ranks.POLL_SECONDS)
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


class Ranks:
    """Plans ranks in processes forked from one zygote (`_zygote`), up to `--jobs` at once; a rank that fails stops
    the plan. With `--ranks auto` the other stages' ranks join the queue as soon as rank 0's schedule names them
    (rank 0 is still planning)."""

    POLL_SECONDS = 0.05

    def __init__(self, scratch: str, interpreter: list[str], script: list[str], options: argparse.Namespace,
                 world: int, per_node: int) -> None:
        self.scratch, self.script, self.options, self.world, self.per_node = scratch, script, options, world, per_node
        self.interpreter = interpreter  # the command's python and its options: the ranks run under it
        self.zygote: subprocess.Popen | None = None
        self.unread = b""  # the start of a reply line not read whole yet

    def _out(self, rank: int) -> str:
        return os.path.join(self.scratch, f"rank{rank}.json")

    def _start(self, rank: int) -> None:
        if self.zygote is None:
            requests, self.requests = os.pipe()
            self.replies, replies = os.pipe()
            command = [*self.interpreter, "-m", "neuron_distributed.plan_ranks", str(requests), str(replies),
                       str(self.world), str(self.per_node), str(self.options.steps), *self.script]
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
            with contextlib.suppress(ProcessLookupError):  # the zygote ended already (e.g. its import failed)
                os.killpg(self.zygote.pid, signal.SIGKILL)  # the zygote and the ranks it forked: a session of theirs
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
                for rank in list(running):  # a rank waiting for a stage's shapes: its rank starts now, past --jobs
                    wants = self._out(rank) + WANTS
                    if os.path.exists(wants):
                        with open(wants) as handle:
                            peer = json.load(handle)
                        os.remove(wants)
                        if peer not in order or peer in pending:
                            order += [] if peer in order else [peer]
                            pending = [p for p in pending if p != peer]
                            self._start(peer)
                            running.add(peer)
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


if __name__ == "__main__":  # the zygote
    requests, replies, world, per_node, steps, *script = sys.argv[1:]
    _zygote(int(requests), int(replies), int(world), int(per_node), steps, script)
