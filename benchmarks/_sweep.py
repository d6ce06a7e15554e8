"""The machinery the model sweeps share (`hf_models.py`, `diffusers_models.py`): results, CPU-vs-`neuron` comparison
of whole outputs, one worker subprocess per model with a timeout, a resumable JSON-lines report and the summary
table by task.

A sweep names its units of work `(model, task)` pairs and groups them by model: the driver starts one subprocess
per model (`python SCRIPT --worker MODEL --tasks ... [--compile]`), which prints one JSON line per pair as soon as
the pair is known; a pair the subprocess did not report (it timed out or crashed) is a failure with that cause.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
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


def run_worker(script: str, model_type: str, tasks: list[str], compiled: bool, timeout: int,
               extra: Iterable[str] = ()) -> list[Result]:
    """One subprocess checks `tasks` of `model_type`; pairs it did not report fail with its timeout or exit code."""
    mode = "compile" if compiled else "eager"
    command = [sys.executable, script, "--worker", model_type, "--tasks", ",".join(tasks), *extra]
    if compiled:
        command.append("--compile")
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout or None, check=False)
        stdout, cause = done.stdout, f"worker exited with code {done.returncode}: {done.stderr.strip()[-300:]}"
        status = "fail"
    except subprocess.TimeoutExpired as expired:
        stdout = expired.stdout.decode() if isinstance(expired.stdout, bytes) else expired.stdout or ""
        status, cause = "timeout", f"timed out after {timeout}s (whole model, all its tasks)"
    reported = [Result(**json.loads(line)) for line in stdout.splitlines() if line.startswith("{")]
    seen = {r.task for r in reported}
    elapsed = time.perf_counter() - start
    return reported + [Result(model_type, status, cause, elapsed, task, mode) for task in tasks if task not in seen]


def emit(result: Result) -> None:
    """A worker reports a pair to its driver: one JSON line on stdout."""
    print(json.dumps(dataclasses.asdict(result)), flush=True)


def drive(script: str, plan: dict[str, list[str]], *, compiled: bool, timeout: int, json_path: str,
          skip_done: bool, extra: Iterable[str] = (), budget: float = 0) -> list[Result]:
    """Run `plan` (model -> tasks) one model subprocess at a time, appending each result to `json_path`; pairs
    already there are not run again with `skip_done`. Stops starting models after `budget` seconds (0: no limit)."""
    mode = "compile" if compiled else "eager"
    done = load(json_path) if skip_done else {}
    results = [done[(m, t, mode)] for m, tasks in plan.items() for t in tasks if (m, t, mode) in done]
    start = time.perf_counter()
    for model_type, tasks in plan.items():
        todo = [task for task in tasks if (model_type, task, mode) not in done]
        if not todo:
            continue
        if budget and time.perf_counter() - start > budget:
            print(f"budget of {budget:.0f}s spent: stopping before {model_type}", flush=True)
            break
        for result in run_worker(script, model_type, todo, compiled, timeout, extra):
            results.append(result)
            print(f"| {result.model_type} | {result.task} | {result.status} | {result.seconds:.1f}s |"
                  f" {result.reason} |", flush=True)
            if json_path:
                with open(json_path, "a") as out:
                    out.write(json.dumps(dataclasses.asdict(result)) + "\n")
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


def add_arguments(parser: argparse.ArgumentParser, unit: str) -> None:
    """The options every sweep script has; `unit` names what one worker process checks ("model", "model type")."""
    parser.add_argument("--compile", action="store_true", help="neuron side under torch.compile(backend='neuron')")
    parser.add_argument("--json", default="", help="append each result to this file as a JSON line")
    parser.add_argument("--skip-done", action="store_true", help="skip what the --json file already has")
    parser.add_argument("--timeout", type=int, default=0, help=f"fail a {unit} after this many seconds")
    parser.add_argument("--shuffle", type=int, default=None, help="run in a random order from this seed")
    parser.add_argument("--budget", type=float, default=0, help=f"start no {unit} after this many seconds")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    parser.add_argument("--table", nargs="+", default=None, help="summarise these JSON reports; run nothing")


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse a sweep's options (`--skip-done` needs `--json`); from here on the models' own warnings are noise."""
    args = parser.parse_args(argv)
    if args.skip_done and not args.json:
        parser.error("--skip-done needs --json")
    warnings.filterwarnings("ignore")
    return args
