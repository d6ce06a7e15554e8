"""The machinery the model sweeps share (`hf_models.py`, `diffusers_models.py`): results, CPU-vs-`neuron` comparison
of whole outputs, a pool of long-lived worker subprocesses with a per-pair timeout, a resumable JSON-lines report
and the summary table by task.

A sweep names its units of work `(model, task)` pairs. Starting Python and importing torch and transformers costs
seconds, more than most tiny models take, so the driver keeps up to `--jobs` long-lived worker subprocesses
(`python SCRIPT --serve [--compile]`), each checking a list of pairs in order (CPU reference and `neuron` run in the
same process), and still isolates every pair: a pair that crashes its worker or outlives the per-pair timeout fails
alone with that cause, and a fresh worker takes the pairs that were left.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import queue
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable

import torch

DEVICE = "neuron"
RTOL, ATOL = 1e-3, 1e-4
# Statuses: "pass"; "fail" (neuron differs from the CPU or errors); "cpu-fail" (the CPU run itself fails with the
# sweep's tiny config and inputs: listed, not counted); "timeout" (counted as a failure).
COUNTED = ("pass", "fail", "timeout")


@dataclasses.dataclass
class Result:
    model_type: str
    status: str
    reason: str = ""
    seconds: float = 0.0
    task: str = "causal-lm"
    mode: str = "eager"

    @property
    def key(self) -> tuple[str, str, str]:
        return self.model_type, self.task, self.mode


def reason(error: BaseException) -> str:
    """One line naming the error and the innermost frame it came from."""
    frame = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
    where = f" ({os.path.basename(frame.filename)}:{frame.lineno})" if frame else ""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:300]}{where}"


def compare(cpu: torch.Tensor, dev: torch.Tensor, what: str) -> None:
    """`dev` (any device) equals `cpu`: within the sweep's tolerance for floating tensors, exactly otherwise."""
    if cpu.is_floating_point() or cpu.is_complex():
        torch.testing.assert_close(dev.cpu(), cpu, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {m}")
    elif not torch.equal(dev.cpu(), cpu):
        raise AssertionError(f"{what}: {dev.cpu().tolist()} != {cpu.tolist()}")


def tensors(value: object, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor inside a (nested) model output, by path: ModelOutput, dict, tuple or list."""
    if isinstance(value, torch.Tensor):
        return {prefix or "output": value}
    if hasattr(value, "to_tuple") and hasattr(value, "keys"):  # transformers ModelOutput / diffusers BaseOutput
        value = {key: value[key] for key in value.keys()}
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    found: dict[str, torch.Tensor] = {}
    for key, item in items:
        found.update(tensors(item, f"{prefix}.{key}" if prefix else str(key)))
    return found


def compare_outputs(cpu: object, dev: object) -> None:
    """Every tensor of `dev`'s output equals the CPU's; both outputs have the same tensors."""
    cpu_tensors, dev_tensors = tensors(cpu), tensors(dev)
    if cpu_tensors.keys() != dev_tensors.keys():
        raise AssertionError(f"outputs differ in their tensors: {sorted(cpu_tensors.keys() ^ dev_tensors.keys())}")
    for name, expected in cpu_tensors.items():
        compare(expected.detach(), dev_tensors[name].detach(), name)


def scalar(output: object) -> torch.Tensor:
    """What backward starts from: the output's loss if it has one, else the sum of the means of its floating
    tensors that require grad (every head then propagates gradients into every parameter it uses)."""
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss
    terms = [t.float().mean() for t in tensors(output).values() if t.is_floating_point() and t.requires_grad]
    if not terms:
        raise RuntimeError("the output has no floating tensor that requires grad")
    return torch.stack(terms).sum()


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def compare_gradients(cpu: dict[str, torch.Tensor], dev: dict[str, torch.Tensor]) -> None:
    if cpu.keys() != dev.keys():
        raise AssertionError(f"gradients for different parameters: {sorted(cpu.keys() ^ dev.keys())}")
    for name, grad in cpu.items():
        compare(grad, dev[name], f"grad {name}")


def load(path: str) -> dict[tuple[str, str, str], Result]:
    """Results already written to the JSON-lines file `path` (none if it does not exist); the last one per pair."""
    if not path or not os.path.exists(path):
        return {}
    with open(path) as lines:
        results = [Result(**json.loads(line)) for line in lines if line.strip()]
    return {r.key: r for r in results}


# ---- the worker pool: long-lived subprocesses, each checking a queue of pairs, replaced on a crash or hang ----
# A worker writes {"start": [model, task]} before each pair, {"phase": "neuron"} once the pair's CPU reference is
# done, and the pair's Result after it, on its protocol stream (the stdout it was started with; the models' own
# prints go to stderr). A pair that gets no Result within the timeout, or whose worker dies, fails alone (`cpu-fail`
# if it was still on the CPU side): the driver kills the worker and starts another on the pairs left.


_protocol = None  # a serving worker's protocol stream


def _send(message: dict) -> None:
    _protocol.write(json.dumps(message) + "\n")
    _protocol.flush()


def serve(check: Callable[[str, str, bool], Result], compiled: bool, memory_gb: float = 0) -> None:
    """The worker's side: check the JSON list of [model, task] pairs on stdin, in order, with `check`. With
    `memory_gb`, the worker's address space is capped there (an allocation beyond fails the pair with an error
    instead of waking the shared machine's out-of-memory killer), and past half of it after a pair the worker
    exits so that the driver starts a fresh one."""
    global _protocol
    if memory_gb:
        limit = int(memory_gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    _protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # a model that prints must not corrupt the protocol
    sys.stdout = sys.stderr
    for model, task in json.load(sys.stdin):
        _send({"start": [model, task]})
        _send(dataclasses.asdict(check(model, task, compiled)))
        torch._dynamo.reset()
        if memory_gb and _resident_bytes() > limit // 2:
            return


def cpu_reference_done() -> None:
    """A check says its CPU run is over: a crash or hang before this is the CPU's (the pair is `cpu-fail`), after
    it `neuron`'s."""
    if _protocol is not None:
        _send({"phase": "neuron"})


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line)
    into.put(None)


@dataclasses.dataclass
class Pool:
    """Runs (model, task) pairs in at most `jobs` worker subprocesses (`python SCRIPT --serve ...`); `record` gets
    every Result as soon as it is known (called from the pool's threads, one at a time)."""

    script: str
    compiled: bool
    timeout: float
    record: Callable[[Result], None]
    extra: Iterable[str] = ()
    jobs: int = 1
    deadline: float = 0.0  # perf_counter() after which no pair is started (0: none)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def run(self, pairs: list[tuple[str, str]]) -> None:
        """Check `pairs`, split between the workers in runs of whole models (a model's tasks share one worker)."""
        models = list(dict.fromkeys(model for model, _ in pairs))
        shards = [[p for p in pairs if models.index(p[0]) % self.jobs == slot] for slot in range(self.jobs)]
        threads = [threading.Thread(target=self._slot, args=(shard,)) for shard in shards if shard]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _report(self, result: Result) -> None:
        with self._lock:
            self.record(result)

    def _slot(self, pairs: list[tuple[str, str]]) -> None:
        remaining = list(pairs)
        while remaining and not self._past_deadline():
            remaining = self._one_worker(remaining)

    def _past_deadline(self) -> bool:
        return bool(self.deadline) and time.perf_counter() > self.deadline

    def _one_worker(self, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Start a worker on `pairs`; return those it did not get to (it crashed, hung or was recycled). The pair
        it was running when it crashed or hung (or, if it died between pairs, the next one) fails with the cause."""
        command = [sys.executable, self.script, "--serve", *self.extra, *(["--compile"] if self.compiled else [])]
        left, running, started, cause, on_cpu = list(pairs), None, time.perf_counter(), "", True
        with tempfile.TemporaryFile("w+") as stderr:
            worker = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                      text=True, start_new_session=True,
                                      env={**os.environ, "OMP_NUM_THREADS": "1"})  # jobs share the cores
            worker.stdin.write(json.dumps(pairs))
            worker.stdin.close()
            lines: queue.Queue[str | None] = queue.Queue()
            threading.Thread(target=_lines, args=(worker.stdout, lines), daemon=True).start()
            while True:
                limit = (self.timeout or None) if running else STARTUP_SECONDS  # imports are not a pair's time
                try:
                    line = lines.get(timeout=limit)
                except queue.Empty:
                    line, cause = None, f"timed out after {limit:.0f}s"
                    os.killpg(worker.pid, signal.SIGKILL)
                if line is None:
                    code = worker.wait()
                    if not cause and code != 0:
                        stderr.seek(0)
                        cause = f"worker exited with code {code}: {' '.join(stderr.read().split())[-300:]}"
                    break
                message = json.loads(line)
                if "phase" in message:
                    on_cpu = False
                elif "start" not in message:
                    self._report(Result(**message))
                    left.remove(running)
                    running = None
                elif self._past_deadline():
                    os.killpg(worker.pid, signal.SIGKILL)
                    worker.wait()
                    return []
                else:
                    running, started, on_cpu = tuple(message["start"]), time.perf_counter(), True
        if not cause:  # recycled between pairs, or done
            return left
        blamed = running or left[0]
        status = "timeout" if running and cause.startswith("timed out") else "fail"
        if running and on_cpu:
            status, cause = "cpu-fail", f"on the CPU run: {cause}"
        self._report(Result(blamed[0], status, cause, time.perf_counter() - started, blamed[1],
                            "compile" if self.compiled else "eager"))
        left.remove(blamed)
        return left


STARTUP_SECONDS = 300  # longest wait for a worker's next "start": its imports on a loaded machine


def drive(script: str, plan: dict[str, list[str]], *, compiled: bool, timeout: int, json_path: str,
          skip_done: bool, extra: Iterable[str] = (), budget: float = 0, jobs: int = 1,
          memory_gb: float = 0) -> list[Result]:
    """Run `plan` (model -> tasks) in a pool of `jobs` workers with a per-pair `timeout`, appending each result to
    `json_path`; pairs already there are not run again with `skip_done`. Starts no pair after `budget` seconds
    (0: no limit)."""
    mode = "compile" if compiled else "eager"
    done = load(json_path) if skip_done else {}
    results = [done[(m, t, mode)] for m, tasks in plan.items() for t in tasks if (m, t, mode) in done]
    todo = [(m, t) for m, tasks in plan.items() for t in tasks if (m, t, mode) not in done]

    def record(result: Result) -> None:
        results.append(result)
        print(f"| {result.model_type} | {result.task} | {result.status} | {result.seconds:.1f}s |"
              f" {result.reason} |", flush=True)
        if json_path:
            with open(json_path, "a") as out:
                out.write(json.dumps(dataclasses.asdict(result)) + "\n")

    deadline = time.perf_counter() + budget if budget else 0.0
    extra = [*extra, *(["--memory-gb", str(memory_gb)] if memory_gb else [])]
    Pool(script, compiled, timeout or 0, record, extra, jobs, deadline).run(todo)
    if deadline and len(results) < len(todo) + len(done):
        print(f"budget of {budget:.0f}s spent: {len(todo) + len(done) - len(results)} pairs not run", flush=True)
    return results


def summary(results: list[Result], existing: dict[str, int] | None = None) -> str:
    """Markdown table by task: pairs that exist (if given), run, not runnable on CPU, pass, fail, pass rate."""
    header = "| task | mode | exist | run | cpu-fail | pass | fail | pass rate |\n|---|---|---|---|---|---|---|---|\n"
    rows = []
    for (task, mode), group in sorted(_by(results, lambda r: (r.task, r.mode)).items()):
        counted = [r for r in group if r.status in COUNTED]
        passed = sum(r.status == "pass" for r in counted)
        exist = (existing or {}).get(task, "")
        rate = f"{100 * passed / len(counted):.1f} %" if counted else "-"
        rows.append(f"| {task} | {mode} | {exist} | {len(group)} | {len(group) - len(counted)} | {passed} |"
                    f" {len(counted) - passed} | {rate} |")
    return header + "\n".join(rows)


def totals(results: list[Result]) -> str:
    lines = []
    for mode, group in sorted(_by(results, lambda r: r.mode).items()):
        counted = [r for r in group if r.status in COUNTED]
        passed = sum(r.status == "pass" for r in counted)
        lines.append(f"coverage ({mode}): {passed}/{len(counted)} CPU-runnable (model type, task) pairs pass"
                     f" = {100 * passed / max(len(counted), 1):.1f} %; {len(group) - len(counted)} not runnable on"
                     f" CPU; {sum(r.seconds for r in group):.0f}s of checks")
    return "\n".join(lines)


def failures(results: list[Result]) -> str:
    """Every failure and every CPU failure, one line each, as a markdown list."""
    order = {"fail": 0, "timeout": 1, "cpu-fail": 2}
    bad = sorted((r for r in results if r.status != "pass"), key=lambda r: (order[r.status], r.mode, r.task,
                                                                           r.model_type))
    return "\n".join(f"- {r.status} ({r.mode}) `{r.model_type}` / {r.task}: {r.reason.replace('|', '/')}"
                     for r in bad)


def _by(results: list[Result], key: Callable[[Result], object]) -> dict:
    groups: dict = defaultdict(list)
    for r in results:
        groups[key(r)].append(r)
    return groups


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every sweep script has."""
    parser.add_argument("--compile", action="store_true", help="neuron side under torch.compile(backend='neuron')")
    parser.add_argument("--json", default="", help="append each result to this file as a JSON line")
    parser.add_argument("--skip-done", action="store_true", help="skip what the --json file already has")
    parser.add_argument("--timeout", type=float, default=0, help="fail a pair after this many seconds (0: never)")
    parser.add_argument("--jobs", type=int, default=1, help="worker subprocesses running at once")
    parser.add_argument("--memory-gb", type=float, default=8, help="cap each worker's address space (0: none)")
    parser.add_argument("--shuffle", type=int, default=None, help="run in a random order from this seed")
    parser.add_argument("--budget", type=float, default=0, help="start no pair after this many seconds")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--table", nargs="+", default=None, help="summarise these JSON reports; run nothing")


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse a sweep's options (`--skip-done` needs `--json`); from here on the models' own warnings are noise."""
    args = parser.parse_args(argv)
    if args.skip_done and not args.json:
        parser.error("--skip-done needs --json")
    warnings.filterwarnings("ignore")
    return args
