"""neuron-plan's planned processes: each planned rank runs in a process of its own (`plan_rank`, fresh simulator
state), forked from one zygote that imported what every rank needs, with the environment torchrun would give it on
the whole cluster. `Ranks` plans a list of ranks, up to `--jobs` at once; with `--ranks auto` the other pipeline
stages' ranks join as soon as rank 0's schedule names them.

The zygote is neuron-plan's process forked, or under another interpreter
`python -m neuron_distributed.plan_ranks REQUESTS REPLIES STEPS SCRIPT...` (`Zygote`).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import gc
import importlib
import importlib.util
import json
import os
import pickle
import runpy
import select
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, NoReturn

import torch

from neuron_device import services
from neuron_spec.machine import INSTANCE

from . import envvars
from .plan_pipeline import (
    RoleReused,
    announcing_stage_ranks,
    exchanging_stage_outputs,
    identifying_roles,
    outputs_bytes,
    send_seconds,
)
from .planning import launcher_environment

__all__ = ["MEMOS", "ROLE", "STAGES", "VERDICT", "WANTS", "Ranks", "Roles", "Zygote", "run_script"]

STAGES = ".stages"  # suffix of the file in which a planned pipeline rank names every stage's rank
WANTS = ".wants"  # suffix of the file in which a planned rank names the rank whose stage outputs it waits for
ROLE = ".role"  # suffix of the file in which a pipeline rank gives its role's key at its first step (`Roles`)
MEMOS = ".memos"  # suffix of the file in which a rank that ended hands its memos' additions to the zygote
VERDICT = ".verdict"  # ... and of the answer it waits for: "plan" (go on) or "reuse" (stop: the role is planned)


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


def _plan_one(rank: int, steps: int | None, out: str, script: list[str], roles: bool = False) -> None:
    """Child process: plan `rank` (the environment is already the rank's) and write its plan as JSON; a pipeline
    rank first writes its stages' ranks to `out + STAGES` as soon as its schedule steps, and exchanges stage output
    shapes with the other planned ranks through files beside `out` (`_send_outputs`, `_receive_outputs`). With
    `roles`, a pipeline rank gives its role's key at its first step and stops there when told its role is planned
    (`Roles`): its JSON is then the key and what the step's layout needs of it."""
    from .planning import plan_rank

    scratch = os.path.dirname(out)
    with contextlib.ExitStack() as stack:
        stack.enter_context(announcing_stage_ranks(lambda ranks: _write_whole(out + STAGES, ranks)))
        stack.enter_context(exchanging_stage_outputs(
            lambda stage, metas: _write_whole(_outputs_file(scratch, stage), metas),
            lambda stage, peer: _receive_outputs(scratch, stage, peer, out)))
        if roles:
            stack.enter_context(identifying_roles(lambda key, probe: _ask_role(out, key, probe)))
        try:
            plan = plan_rank(lambda: run_script(script), rank=rank, world_size=envvars.WORLD_SIZE.read(),
                             steps=steps)
        except RoleReused as reused:
            # a later stage planned beside this one may wait for this stage's outputs: neuron-plan copies them from
            # the rank that planned the role; this rank's plan file appears only once they are there. Their bytes
            # price this rank's own sends to its next stages (the role's key leaves out where those are).
            sends = []
            for stage in reused.probe["stage_indices"]:
                if stage + 1 == reused.probe["num_stages"]:
                    continue
                while not os.path.exists(_outputs_file(scratch, stage)):
                    time.sleep(Ranks.POLL_SECONDS)
                with open(_outputs_file(scratch, stage)) as handle:
                    nbytes = outputs_bytes(json.load(handle))
                sends.append([stage, nbytes, send_seconds(stage, reused.probe["stage_ranks"], nbytes)])
            _write_whole(out, {"reused": reused.key, "probe": reused.probe, "sends": sends})
            return
    with open(out, "w") as handle:
        json.dump({**plan.as_dict(), "lanes": plan.lanes}, handle)


def _ask_role(out: str, key: str, probe: dict[str, Any]) -> bool:
    """Give neuron-plan this rank's role key and wait for its verdict: True when the role is planned already."""
    _write_whole(out + ROLE, {"key": key, "probe": probe})
    while not os.path.exists(out + VERDICT):
        time.sleep(Ranks.POLL_SECONDS)
    with open(out + VERDICT) as handle:
        return json.load(handle) == "reuse"


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


def _zygote(requests: int, replies: int, steps: str, script: list[str]) -> None:
    """Child process: imports what every rank needs once (`_preload`), then forks a process per rank asked for on
    the `requests` pipe (a JSON line `[rank, out, roles, world, per_node, script, log]`: its plan file, whether it
    gives its role's key, the job's world and ranks a node, the script with its arguments, and a file for its
    output or null), and writes `[plan file, exit code]` on `replies` as each ends; `"kill"` ends every rank it
    runs. A rank forked from here skips the
    5 s of imports a fresh interpreter pays (torch, transformers); `neuron-plan --search` plans every configuration
    of a script from one. What an ended rank added to its memos (`services.memo`: neuron-nki's attention estimates)
    is merged here before its reply (`_merge_memos`), so the ranks forked after it start with it."""
    _preload(script)
    children: dict[int, str] = {}  # pid -> the rank's plan file
    forked = 0
    pending, open_ = b"", True
    with os.fdopen(replies, "w", buffering=1) as outbox:
        while open_ or children:
            if open_ and select.select([requests], [], [], Ranks.POLL_SECONDS)[0]:
                chunk = os.read(requests, 1 << 16)
                open_ = bool(chunk)
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    request = json.loads(line)
                    if request == "kill":  # a plan failed: its other ranks end (their replies come as usual)
                        for pid in children:
                            with contextlib.suppress(ProcessLookupError):
                                os.kill(pid, signal.SIGKILL)
                        continue
                    rank, out, roles, world, per_node, rank_script, log = request
                    if forked == 1:
                        _warm_compile_caches()
                    # What this process holds is frozen: a rank's collections then skip it (a full one walked the
                    # 370,000 objects of torch and transformers, 0.2 s of a 70B stage's 3 s plan) and leave its pages
                    # shared with this process (a collection writes to every object it walks)
                    gc.freeze()
                    pid = os.fork()
                    forked += 1
                    if pid == 0:
                        os.close(requests)
                        outbox.close()
                        _forked_rank(rank, world, per_node, steps, out, rank_script, roles, log)
                    children[pid] = out
            elif not open_:
                time.sleep(Ranks.POLL_SECONDS)
            while children:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                out = children.pop(pid)
                _merge_memos(out)  # before the reply: the ranks neuron-plan asks for next start with them
                outbox.write(json.dumps([out, os.waitstatus_to_exitcode(status)]) + "\n")


def _merge_memos(out: str) -> None:
    """Take into this process's memos (`services.memo`) what the ended rank of plan file `out` added to its own:
    a plugin's estimates by key (neuron-nki's attention latency of a call signature), which every rank forked from
    here after it then finds instead of computing them again."""
    path = out + MEMOS
    try:
        with open(path, "rb") as handle:
            additions = pickle.load(handle)
    except FileNotFoundError:  # the rank failed, was killed, or added nothing
        return
    os.unlink(path)
    services.merge_memos(additions)


def _warm_compile_caches() -> None:
    """Compute here, once, what each rank's first `torch.compile` computes alike: the hashes of PyTorch's and Triton's
    sources that AOTAutograd's cache key holds (`torch_key`, `CacheBase.get_system`: about 0.6 s of CPU a rank, 3 %
    of a 70B torchtitan rank's plan). The zygote calls it before forking its second rank, so the ranks after the
    first inherit them, and a plan of one rank (or of a search's first configuration only) never pays it."""
    from torch._inductor.codecache import CacheBase, torch_key

    torch_key()
    CacheBase.get_system()


def _forked_zygote(requests: int, replies: int, steps: str, script: list[str]) -> None:
    """`_zygote` in a process forked from neuron-plan, with the path `python -m neuron_distributed.plan_ranks` would
    give it: the working directory first (where a script's `-m package.module` is found)."""
    sys.path.insert(0, os.getcwd())
    _zygote(requests, replies, steps, script)


def _forked_rank(rank: int, world: int, per_node: int, steps: str, out: str, script: list[str], roles: bool,
                 log: str | None) -> NoReturn:
    """A forked rank: its launcher environment, its plan, then exit (never returns)."""

    def body() -> None:
        with open(os.devnull) as stdin:
            os.dup2(stdin.fileno(), 0)
        sys.stdout.flush()
        sys.stderr.flush()
        if log is not None:
            handle = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            os.dup2(handle, 1)
            os.dup2(handle, 2)
            os.close(handle)
        # Python's output on descriptors 1 and 2, as a new interpreter's: the process forked may have had its own
        # `sys.stdout` and `sys.stderr` objects that write elsewhere (pytest's capture), and a failed rank's error
        # would be lost from its output, which names it
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)
        services.forget_memo_additions()  # the zygote's entries are not this rank's to hand back
        with launcher_environment(rank, world, per_node):
            _plan_one(rank, int(steps) if steps != "all" else None, out, script, roles)
        additions = services.memo_additions()
        if additions:  # for the zygote (`_merge_memos`), whole or absent
            with open(out + MEMOS + ".partial", "wb") as handle:
                pickle.dump(additions, handle)
            os.replace(out + MEMOS + ".partial", out + MEMOS)

    _exit_after(body)


def _exit_after(body: Callable[[], None]) -> NoReturn:
    """Run `body` in a forked process, then end it as the interpreter ends on the outcome (never returns): exit code
    0, a `SystemExit`'s (a number is the code, anything else is printed, code 1), or 1 with the exception printed;
    the process's own exit cleanups run first (`services.at_exit`: a compile's private Inductor directory), which
    `os._exit` would skip."""
    code = 1
    try:
        body()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
        if not isinstance(stop.code, int) and stop.code is not None:
            print(stop.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            services.run_at_exit()
        finally:  # never past here: the process forked runs its parent's code after `body`
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


class _Forked:
    """A zygote forked from this process, in a session of its own, with the calls of `subprocess.Popen` that
    `Zygote` and `neuron-plan --search` make (`wait`, `poll`). `close`: this process's descriptors the zygote must
    not hold (the other ends of its own pipes and of other zygotes': a zygote ends when its request pipe closes)."""

    def __init__(self, run: Callable[[], None], close: Iterable[int]) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.returncode: int | None = None
        self.pid = os.fork()
        if self.pid == 0:  # the zygote

            def body() -> None:
                os.setsid()
                for descriptor in close:
                    os.close(descriptor)
                run()

            _exit_after(body)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode


def _device_used_here() -> bool:
    """Whether this process initialised `neuron` (or is a fork of one that did): a child forked from it cannot."""
    return torch.neuron.is_initialized() or torch.neuron._is_in_bad_fork()


class Zygote:
    """The process that forks the planned ranks (`_zygote`), and its two pipes. Under neuron-plan's own interpreter
    it is forked from this process, which imported torch and the planner already (about 2 s of CPU a plan that a
    new interpreter pays again); under another (`neuron-plan -- /other/python train.py`, or interpreter options), or
    when this process has used `neuron` (a plan asked for from a process that ran on the device: its forked children
    could not initialise it again, as CUDA's cannot), it is that interpreter, started as
    `python -m neuron_distributed.plan_ranks`."""

    _held: ClassVar[set[int]] = set()  # this process's ends of every running zygote's pipes

    def __init__(self, interpreter: list[str], instance: str, steps: str, script: list[str]) -> None:
        requests, self.requests = os.pipe()
        self.replies, replies = os.pipe()
        with INSTANCE.overridden(instance):  # read by the zygote's simulator when a rank first asks for the machine
            if interpreter == [sys.executable] and not _device_used_here():
                self.process: subprocess.Popen | _Forked = _Forked(
                    lambda: _forked_zygote(requests, replies, steps, script),
                    close=(self.requests, self.replies, *Zygote._held))
            else:
                command = [*interpreter, "-m", "neuron_distributed.plan_ranks", str(requests), str(replies), steps,
                           *script]
                self.process = subprocess.Popen(command, pass_fds=(requests, replies), start_new_session=True)
        os.close(requests)
        os.close(replies)
        Zygote._held |= {self.requests, self.replies}
        self.unread = b""  # the start of a reply line not read whole yet

    def ask(self, request: list[Any]) -> None:
        os.write(self.requests, (json.dumps(request) + "\n").encode())

    def finished(self) -> list[tuple[str, int]]:
        """(plan file, exit code) of the ranks that ended since the last call (waits up to POLL_SECONDS for one)."""
        if not select.select([self.replies], [], [], Ranks.POLL_SECONDS)[0]:
            return []
        chunk = os.read(self.replies, 1 << 16)
        if not chunk:
            raise SystemExit(f"neuron-plan: the process planning the ranks ended (exit code {self.process.wait()})")
        self.unread += chunk
        *lines, self.unread = self.unread.split(b"\n")
        return [tuple(json.loads(line)) for line in lines]

    def stop(self, kill: bool) -> None:
        os.close(self.requests)
        Zygote._held -= {self.requests, self.replies}
        if kill:
            with contextlib.suppress(ProcessLookupError):  # the zygote ended already (e.g. its import failed)
                os.killpg(self.process.pid, signal.SIGKILL)  # the zygote and the ranks it forked: a session of theirs
        self.process.wait()
        os.close(self.replies)


class Ranks:
    """Plans ranks in processes forked from one zygote (`_zygote`), up to `--jobs` at once; a rank that fails stops
    the plan. With `--ranks auto` the other stages' ranks join the queue as soon as rank 0's schedule names them
    (rank 0 is still planning)."""

    POLL_SECONDS = 0.05

    def __init__(self, scratch: str, interpreter: list[str], script: list[str], options: argparse.Namespace,
                 world: int, per_node: int, *, log: str | None = None, roles: Roles | None = None,
                 zygotes: dict[tuple, Zygote] | None = None) -> None:
        self.scratch, self.script, self.options, self.world, self.per_node = scratch, script, options, world, per_node
        self.interpreter = interpreter  # the command's python and its options: the ranks run under it
        self.log = log  # a file for the ranks' output (default: this process's stdout and stderr)
        self.roles = roles  # rank plans shared by role (`Roles`); None: every rank asked for is planned
        # zygotes shared with other `Ranks` (a search's configurations), by interpreter, instance and steps; kept
        # running after a plan that succeeds. None: this plan's own, stopped at its end.
        self.shared = zygotes is not None
        self.zygotes: dict[tuple, Zygote] = zygotes if zygotes is not None else {}
        self.zygote: Zygote | None = None
        self.copies: list[tuple[str, str]] = []  # stage outputs to copy from a role's planned rank (source, target)

    def _out(self, rank: int) -> str:
        return os.path.join(self.scratch, f"rank{rank}.json")

    def _start(self, rank: int) -> None:
        if self.zygote is None:
            key = (tuple(self.interpreter), self.options.instance, str(self.options.steps))
            if key not in self.zygotes:
                self.zygotes[key] = Zygote(self.interpreter, self.options.instance, str(self.options.steps),
                                           self.script)
            self.zygote = self.zygotes[key]
        self.zygote.ask([rank, self._out(rank), self.roles is not None, self.world, self.per_node, self.script,
                         self.log])

    def _finished(self) -> list[tuple[int, int]]:
        """(rank, exit code) of this plan's ranks that ended since the last call (a shared zygote's replies for an
        earlier plan's killed ranks are not this plan's)."""
        if self.zygote is None:
            return []
        return [(int(os.path.basename(out)[len("rank"):-len(".json")]), code) for out, code in self.zygote.finished()
                if os.path.dirname(out) == self.scratch]

    def _stop(self, kill: bool) -> None:
        if self.zygote is None:
            return
        if self.shared:  # the zygote goes on for the next plan; a failed plan's ranks are ended
            if kill:
                self.zygote.ask("kill")
            return
        self.zygote.stop(kill)

    def __call__(self, ranks: list[int], *, stages_of: int | None = None) -> list[dict[str, Any]]:
        """The plans of `ranks`, and of the stage ranks rank `stages_of` announces (in rank order after them)."""
        plans: dict[int, dict[str, Any]] = {}
        order, pending, running = list(ranks), list(ranks), set()
        announced = self._out(stages_of) + STAGES if stages_of is not None else None
        reused: dict[int, dict[str, Any]] = {}  # ranks stopped at their first step: their role's key and probe
        failed = True
        try:
            while pending or running or reused:
                if self.roles is not None:
                    for rank in list(running):
                        self._judge(rank)
                    self._copy_outputs()
                    for rank, stopped in list(reused.items()):
                        if stopped["reused"] in self.roles.plans:
                            plans[rank] = self.roles.relabelled(stopped["reused"], stopped["probe"], rank,
                                                                stopped["sends"])
                            del reused[rank]
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
                        plan = json.load(handle)
                    if "reused" in plan:
                        reused[rank] = plan
                        self.roles.reused += 1
                        continue
                    if self.roles is not None:
                        self.roles.planned(self.scratch, rank, plan)
                    plans[rank] = plan
            failed = False
        finally:
            self._stop(kill=failed)
            if failed and self.roles is not None:
                self.roles.release(self.scratch)
        return [plans[rank] for rank in order]

    def _judge(self, rank: int) -> None:
        """Answer a rank that gave its role's key (`ROLE`): plan it when no rank has its role, else stop it (and copy
        the outputs the role's planned rank publishes, for a later stage that waits for them)."""
        asked_path = self._out(rank) + ROLE
        if not os.path.exists(asked_path):
            return
        with open(asked_path) as handle:
            asked = json.load(handle)
        os.remove(asked_path)
        owner = self.roles.owner(asked["key"])
        if owner is None:
            self.roles.claim(asked["key"], asked["probe"], self.scratch, rank)
        else:
            scratch, probe = owner
            self.copies += [(os.path.join(scratch, f"stage{theirs}.outputs.json"), _outputs_file(self.scratch, mine))
                            for theirs, mine in zip(probe["stage_indices"], asked["probe"]["stage_indices"])]
        _write_whole(self._out(rank) + VERDICT, "plan" if owner is None else "reuse")

    def _copy_outputs(self) -> None:
        for source, target in list(self.copies):
            if os.path.exists(source):
                with open(source) as handle:
                    _write_whole(target, json.load(handle))
                self.copies.remove((source, target))


class Roles:
    """Rank plans shared between ranks that run the same thing: a pipeline rank gives, at its first schedule step,
    the key of what it runs from there (`plan_pipeline._role_key`: its stages, their inputs, its groups and their
    placement, its state so far; not its stage index, the number of micro-batches nor where its neighbours are); the
    first rank with a key is planned, the others stop there and take its plan, their stage indices, pipeline rank,
    schedule and sends put in (`relabelled`). Shared by every `Ranks` given it (every configuration of a search)."""

    def __init__(self) -> None:
        self.plans: dict[str, dict[str, Any]] = {}  # key -> the planned rank's plan
        self.claims: dict[str, tuple[str, int, dict[str, Any]]] = {}  # key -> (scratch, rank, probe) planning it
        self.run = 0  # rank plans run (with or without a key)
        self.reused = 0  # ranks that took another rank's plan

    def owner(self, key: str) -> tuple[str, dict[str, Any]] | None:
        """(scratch, probe) of the rank that has or is planning `key`'s role, or None."""
        found = self.claims.get(key)
        return None if found is None else (found[0], found[2])

    def claim(self, key: str, probe: dict[str, Any], scratch: str, rank: int) -> None:
        self.claims[key] = (scratch, rank, probe)

    def planned(self, scratch: str, rank: int, plan: dict[str, Any]) -> None:
        """A rank's plan is done: counted, and kept as its role's plan if it claimed one."""
        self.run += 1
        for key, (where, who, _) in self.claims.items():
            if (where, who) == (scratch, rank):
                self.plans[key] = plan

    def release(self, scratch: str) -> None:
        """Forget the claims of a plan that failed (in folder `scratch`) whose ranks did not finish."""
        for key in [k for k, (where, _, _) in self.claims.items() if where == scratch and k not in self.plans]:
            del self.claims[key]

    def relabelled(self, key: str, probe: dict[str, Any], rank: int, sends: list[list[Any]]) -> dict[str, Any]:
        """The role's plan as rank `rank`'s: its stage indices, pipeline rank, stages' ranks, micro-batches and the
        schedule's programs (from `probe`, what that rank's own schedule gave), its stages' sends priced for where
        its next stages are (`sends`: [stage, bytes, seconds] that rank computed), and where it went past the HBM:
        its own, before its first step, else the role's rank's with its modules' names in this rank's (a stage's
        layers are named by their numbers in the whole model)."""
        plan = copy.deepcopy(self.plans[key])
        mapping = dict(zip(self.claims[key][2]["stage_indices"], probe["stage_indices"]))
        pipe = plan["pipeline"]
        pipe["stages"] = [{**cost, "stage_index": mapping[cost["stage_index"]]} for cost in pipe["stages"]]
        priced = {stage: (nbytes, seconds) for stage, nbytes, seconds in sends}
        for cost in pipe["stages"]:
            if cost["stage_index"] not in priced:  # a last stage: it sends nothing
                continue
            nbytes, cost["send_seconds"] = priced[cost["stage_index"]]
            if nbytes != cost["send_bytes"]:
                raise RuntimeError(f"plan mode: rank {rank}'s stage {cost['stage_index']} sends {nbytes} bytes, the "
                                   f"plan of its role {cost['send_bytes']}: the role's key missed what differs")
        pipe.update({name: probe[name] for name in ("pipeline_rank", "num_stages", "n_microbatches", "stage_ranks",
                                                   "programs")})
        plan["rank"] = rank
        if probe["oom"] is not None:  # this rank went past the HBM before its first step: where it did
            plan["oom"] = probe["oom"]
        elif plan["oom"] is not None:  # the role's rank did during its step: the module in this rank's names
            names = {theirs: mine for owner, own in zip(self.claims[key][2]["modules"], probe["modules"])
                     for theirs, mine in zip(owner, own)}
            oom = plan["oom"]
            oom["module"] = names.get(oom["module"], oom["module"])
            for entry in oom["largest_live_tensors_by_module"]:
                entry["module"] = names.get(entry["module"], entry["module"])
        return plan


if __name__ == "__main__":  # the zygote
    requests, replies, steps, *script = sys.argv[1:]
    _zygote(int(requests), int(replies), steps, script)
