"""The OpInfo correctness sweep: every OpInfo of PyTorch's `op_db`, every sample input, on `neuron` against CPU.

One (op, dtype) *pair* passes when every sample gives on `neuron` what it gives on CPU:

Samples are made on `neuron` and copied to CPU, as upstream's `TestCommon.test_compare_cpu` does (so a sample
that deliberately keeps a tensor on CPU, like `tensor_split`'s indices, keeps it there on both sides).

* deterministic samples: the same results (values, dtypes, shapes; tensors on `neuron`) and the same inputs after
  the call (an op that mutates an input must mutate it the same way); when CPU raises, `neuron` must raise too;
* random samples (a run drew from its device's generator, or upstream marks the op's output as
  non-deterministic, e.g. `empty_like`): the same shapes, dtypes and structure, tensors on `neuron`, and, when the
  op draws random numbers, two runs under the same `torch.manual_seed` give identical results on `neuron`.

A *crash* (the process dies or hangs) must never happen. So the sweep runs in worker subprocesses (`run_sweep`):
each worker reports one JSON line per pair; a worker that dies or stops reporting is replaced, the pair it was
running is recorded as a crash, and the sweep continues with the next pair.

Run it alone: `python opinfo_support.py [--ops name,name] [--dtypes float32,bool]` prints the report.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import queue
import re
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.int64, torch.bool)
SEED = 20260
# Samples compared per pair. Every pair is swept; beyond this many samples a pair's list is thinned evenly (the
# same samples every run), which keeps the sweep within CI time without dropping any (op, dtype) pair.
MAX_SAMPLES = 64
PAIR_TIMEOUT_S = 240.0
_LOW_PRECISION = (torch.bfloat16, torch.float16)  # a worker silent for this long is hung: its pair counts as a crash

# Upstream's own markers of ops whose output cannot be compared: a skip of `TestCommon.test_compare_cpu` because
# the "output is non-deterministic" (random ops), or a skip anywhere because it "is not comparable" (`empty*`).
_UNCOMPARABLE_REASONS = (("test_compare_cpu", "non-deterministic"), (None, "is not comparable"))


@dataclasses.dataclass
class Outcome:
    """The verdict on one (op, dtype) pair."""

    op: str
    dtype: str
    status: str  # "pass", "fail", "crash"
    reason: str = ""
    samples: int = 0  # samples compared
    available: int = 0  # samples the OpInfo offers (more than `samples` when the list was thinned)
    random: bool = False
    seconds: float = 0.0


def op_key(op) -> str:
    """A readable, unique name of an OpInfo (`name` or `name.variant`)."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def load_op_db() -> dict[str, object]:
    """`op_db` by `op_key` (keys are unique in torch 2.13; a clash would make a pair ambiguous, so it fails)."""
    from torch.testing._internal.common_methods_invocations import op_db

    ops = {op_key(op): op for op in op_db}
    if len(ops) != len(op_db):
        raise RuntimeError("op_db has OpInfos with the same name and variant; op_key must be made unique")
    return ops


def all_pairs(ops: dict[str, object], dtypes: Iterable[torch.dtype] = DTYPES) -> list[tuple[str, str]]:
    """Every (op, dtype) pair the op supports on CPU, in op_db order."""
    pairs = []
    for key, op in ops.items():
        supported = op.supported_dtypes("cpu")
        pairs.extend((key, dtype_name(d)) for d in dtypes if d in supported)
    return pairs


def _skip_reasons(info) -> Iterator[str]:
    """The reasons of the `unittest.skip` decorators of a DecorateInfo (kept in the decorator's closure)."""
    for decorator in getattr(info, "decorators", ()):
        for cell in getattr(decorator, "__closure__", None) or ():
            if isinstance(cell.cell_contents, str):
                yield cell.cell_contents


def _upstream_nondeterministic(op) -> bool:
    """Whether upstream marks the op's output as not comparable with CPU (random, or uninitialised like `empty`)."""
    for info in op.decorators:
        if getattr(info, "device_type", None) not in (None, "cpu"):
            continue
        for test_name, marker in _UNCOMPARABLE_REASONS:
            if test_name in (None, getattr(info, "test_name", None)) and any(
                marker in reason for reason in _skip_reasons(info)
            ):
                return True
    return False


# --- copying a sample between devices ------------------------------------------------------------------------------


def _copy_tensor(tensor: torch.Tensor, device: str) -> torch.Tensor:
    """A copy of `tensor` on `device` with the same storage layout (sizes, strides, offset, overlap)."""
    if tensor.layout != torch.strided or tensor.is_conj() or tensor.is_neg():
        return tensor.to(device, copy=True)
    storage = tensor.untyped_storage()
    source_bytes = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)
    copied = torch.empty(storage.nbytes(), dtype=torch.uint8, device=device).copy_(source_bytes)
    result = torch.empty(0, dtype=tensor.dtype, device=device)
    return result.set_(copied.untyped_storage(), tensor.storage_offset(), tensor.size(), tensor.stride())


def _copy_sample(value, source: str, target: str):
    """Copy a sample (or part of one) from device type `source` to `target`: its tensors on `source` move, other
    tensors are cloned in place, device names and objects follow, containers keep their types."""
    if isinstance(value, torch.Tensor):
        return _copy_tensor(value, target if value.device.type == source else str(value.device))
    if isinstance(value, torch.device):
        return torch.device(target) if value.type == source else value
    if isinstance(value, str):  # samples name their device as they were given it
        return target if value == source else value
    if type(value) in (list, tuple):
        return type(value)(_copy_sample(v, source, target) for v in value)
    if isinstance(value, dict):
        return {k: _copy_sample(v, source, target) for k, v in value.items()}
    return value


# --- comparing ----------------------------------------------------------------------------------------------------


class Mismatch(AssertionError):
    """The `neuron` run of a sample differs from the CPU run."""


def _leaves(value) -> tuple[list, object]:
    return tree_flatten(value)


def _names_cpu(call_args) -> bool:
    """Whether a sample asks for the CPU by name (e.g. `randint(..., device="cpu")`): then its results are on CPU."""
    return any(
        (isinstance(leaf, str) and leaf == "cpu") or (isinstance(leaf, torch.device) and leaf.type == "cpu")
        for leaf in tree_flatten(call_args)[0]
    )


def _check_device(actual: list, expected_device: str) -> None:
    for leaf in actual:
        if isinstance(leaf, torch.Tensor) and leaf.device.type != expected_device:
            raise Mismatch(f"a result is on {leaf.device}, expected a {expected_device} tensor")


def _compare(actual, expected, *, values: bool, what: str, tensors_only: bool = False) -> None:
    """Compare a `neuron` result tree with a CPU one (values too when `values`; only tensors if `tensors_only`)."""
    actual_leaves, actual_spec = _leaves(actual)
    expected_leaves, expected_spec = _leaves(expected)
    if tensors_only:
        actual_leaves = [leaf for leaf in actual_leaves if isinstance(leaf, torch.Tensor)]
        expected_leaves = [leaf for leaf in expected_leaves if isinstance(leaf, torch.Tensor)]
        if len(actual_leaves) != len(expected_leaves):
            raise Mismatch(f"{what}: {len(actual_leaves)} tensors != CPU's {len(expected_leaves)}")
    elif actual_spec != expected_spec:
        raise Mismatch(f"{what}: structure {actual_spec} != CPU's {expected_spec}")
    for a, e in zip(actual_leaves, expected_leaves):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise Mismatch(f"{what}: got {type(a).__name__}, CPU gave a tensor")
            if values:
                try:
                    torch.testing.assert_close(a.cpu(), e, equal_nan=True, check_device=False)
                except AssertionError as error:
                    raise Mismatch(f"{what}: {str(error).strip().splitlines()[0]}") from None
            elif a.shape != e.shape or a.dtype != e.dtype:
                raise Mismatch(f"{what}: {a.dtype}{list(a.shape)} != CPU's {e.dtype}{list(e.shape)}")
        elif isinstance(e, float) and isinstance(a, float) and math.isnan(e) and math.isnan(a):
            continue
        elif values and a != e:
            raise Mismatch(f"{what}: {a!r} != CPU's {e!r}")


class _SeededOpDetector(TorchDispatchMode):
    """Notes whether a run calls an ATen op that draws random numbers (tag `nondeterministic_seeded`).

    Watching the generators is not enough: OpInfos of random ops reseed and restore them (`wrapper_set_seed`).
    """

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen = self.seen or torch.Tag.nondeterministic_seeded in func.tags
        return func(*args, **(kwargs or {}))


def _call(op, call_args, device: str):
    """Call the op on (input, args, kwargs). A sample without any tensor or device (a factory call such as
    `arange(5)`) runs with `device` as the default device: it has no other way to say where its result goes."""
    input, args, kwargs = call_args
    if "device" in kwargs or any(isinstance(leaf, torch.Tensor) for leaf in tree_flatten(call_args)[0]):
        return op(input, *args, **kwargs)
    with torch.device(device):
        return op(input, *args, **kwargs)


class _RecordWarnings(warnings.catch_warnings):
    """Record every warning raised inside, as text with device names made neutral (`neuron:0` and `cpu` read
    `<device>`), leaving out the fallback notices the device is meant to give."""

    def __init__(self) -> None:
        super().__init__(record=True)
        self.texts: set[str] = set()

    def __enter__(self):
        self._caught = super().__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self.texts = {
            f"{w.category.__name__}: {_DEVICE_NAME.sub('<device>', str(w.message))}"
            for w in self._caught
            if "fell back to CPU" not in str(w.message)
        }


_DEVICE_NAME = re.compile(r"\b(neuron|cpu)(:\d+)?\b", re.IGNORECASE)


def _check_sample(op, sample, nondeterministic: bool) -> bool:
    """Compare one sample (made on `neuron`) with its CPU copy; return whether it was random. Raises Mismatch."""
    device_args = (sample.input, sample.args, sample.kwargs)
    cpu_args = _copy_sample(device_args, "neuron", "cpu")
    rerun_args = _copy_sample(device_args, "neuron", "neuron")  # pristine inputs for the reproducibility run
    torch.manual_seed(SEED)
    detector, cpu_warnings, device_warnings = _SeededOpDetector(), _RecordWarnings(), _RecordWarnings()
    try:
        with detector, cpu_warnings:
            expected = _call(op, cpu_args, "cpu")
        cpu_error = None
    except Exception as error:  # the CPU behaviour to reproduce, whatever it is
        cpu_error = error
    drew_random = detector.seen

    torch.manual_seed(SEED)
    before = torch.neuron.get_rng_state()
    try:
        with device_warnings:
            actual = _call(op, device_args, "neuron")
    except Exception as error:
        if cpu_error is not None:
            return drew_random
        raise Mismatch(f"neuron raised {type(error).__name__}: {str(error).strip()[:300]}") from None
    drew_random |= not torch.equal(before, torch.neuron.get_rng_state())
    if cpu_error is not None:
        raise Mismatch(f"CPU raised {type(cpu_error).__name__} ({str(cpu_error).strip()[:150]}) but neuron did not")

    _check_device(_leaves(actual)[0], "cpu" if _names_cpu(device_args) else "neuron")
    random = drew_random or nondeterministic
    try:
        _compare(actual, expected, values=not random, what="result")
    except Mismatch:
        if not _at_least_as_accurate(op, cpu_args, actual, expected):
            raise
    _compare(device_args, cpu_args, values=not random, what="inputs after the call", tensors_only=True)
    extra = device_warnings.texts - cpu_warnings.texts
    if extra:
        raise Mismatch(f"neuron warned where the CPU did not: {sorted(extra)[0][:300]}")
    if drew_random:
        torch.manual_seed(SEED)
        again = _call(op, rerun_args, "neuron")
        _compare(tree_map(_host_copy, again), tree_map(_host_copy, actual), values=True,
                 what="rerun under the same seed")
    return random


def _at_least_as_accurate(op, cpu_args, actual, expected) -> bool:
    """Whether a low-precision `neuron` result that differs from CPU's is at least as close as CPU's to the op
    computed in float64: the numerics policy may legitimately round differently (bfloat16 matmuls accumulate in
    float32 and round once), as upstream accepts a reference that is more accurate than torch."""
    actual_leaves, actual_spec = _leaves(actual)
    expected_leaves, expected_spec = _leaves(expected)
    if actual_spec != expected_spec or not any(
        isinstance(e, torch.Tensor) and e.dtype in _LOW_PRECISION for e in expected_leaves
    ):
        return False
    precise_args = tree_map(
        lambda v: v.double() if isinstance(v, torch.Tensor) and v.dtype in _LOW_PRECISION else v, cpu_args
    )
    try:
        precise_leaves, precise_spec = _leaves(_call(op, precise_args, "cpu"))
    except Exception:
        return False
    if precise_spec != expected_spec:
        return False
    for a, e, p in zip(actual_leaves, expected_leaves, precise_leaves):
        if not (isinstance(e, torch.Tensor) and e.is_floating_point()):
            if not (torch.equal(a.cpu(), e) if isinstance(e, torch.Tensor) else a == e):
                return False
        elif a.shape != e.shape or a.dtype != e.dtype or _error(a.cpu(), p) > _error(e, p):
            return False
    return True


def _error(value: torch.Tensor, precise: torch.Tensor) -> float:
    """Largest absolute difference to the float64 result (NaN where both are NaN is no error; elsewhere infinite)."""
    value, precise = value.double(), precise.double()
    both_nan = value.isnan() & precise.isnan()
    difference = (value - precise).abs().masked_fill(both_nan, 0).nan_to_num(nan=math.inf)
    return difference.max().item() if difference.numel() else 0.0


def _host_copy(value):
    return value.cpu() if isinstance(value, torch.Tensor) else value


def _thin(samples: list, limit: int) -> list:
    """At most `limit` samples, spread evenly over the list (deterministic)."""
    if len(samples) <= limit:
        return samples
    step = len(samples) / limit
    return [samples[int(i * step)] for i in range(limit)]


def check_pair(op, dtype: torch.dtype) -> Outcome:
    """Run every (thinned) sample of `op` at `dtype` on CPU and on `neuron` and give the verdict."""
    start = time.perf_counter()
    outcome = Outcome(op_key(op), dtype_name(dtype), "pass")
    torch.manual_seed(SEED)  # sample generation draws random numbers
    try:
        nondeterministic = _upstream_nondeterministic(op)
        samples = list(op.sample_inputs("neuron", dtype, requires_grad=False))
        outcome.available = len(samples)
        samples = _thin(samples, MAX_SAMPLES)
        for index, sample in enumerate(samples):
            try:
                outcome.random |= _check_sample(op, sample, nondeterministic)
            except Mismatch as error:
                outcome.status, outcome.reason = "fail", f"sample {index}: {error}"
                break
            outcome.samples += 1
    except Exception as error:  # a failure outside the comparison (sample generation, moving, comparing)
        outcome.status, outcome.reason = "fail", f"{type(error).__name__}: {str(error).strip()[:300]}"
    outcome.seconds = time.perf_counter() - start
    return outcome


# --- running the sweep in crash-proof workers ---------------------------------------------------------------------


def _worker(pairs: Sequence[tuple[str, str]]) -> None:
    """Check `pairs` in this process, one JSON line on stdout before ("start") and after ("done") each pair."""
    warnings.simplefilter("ignore")
    ops = load_op_db()
    out = sys.stdout
    for key, dtype in pairs:
        out.write(json.dumps({"start": [key, dtype]}) + "\n")
        out.flush()
        outcome = check_pair(ops[key], getattr(torch, dtype))
        out.write(json.dumps({"done": dataclasses.asdict(outcome)}) + "\n")
        out.flush()


def _pump(stream, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _run_worker_slot(pairs: list[tuple[str, str]], results: list[Outcome], timeout: float,
                     command: Sequence[str]) -> None:
    """Run `pairs` in worker subprocesses, replacing a worker that crashes or hangs, until every pair has a result."""
    remaining = list(pairs)
    while remaining:
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
        )
        process.stdin.write(json.dumps(remaining))
        process.stdin.close()
        lines: queue.Queue[str | None] = queue.Queue()
        stderr_tail: list[str] = []
        threading.Thread(target=_pump, args=(process.stdout, lines), daemon=True).start()
        threading.Thread(target=stderr_tail.extend, args=(process.stderr,), daemon=True).start()
        running: tuple[str, str] | None = None
        while True:
            try:
                line = lines.get(timeout=timeout)
            except queue.Empty:
                process.kill()
                process.wait()
                crash = f"hang: no result after {timeout:.0f} s"
                break
            if line is None:
                code = process.wait()
                crash = f"worker exited with code {code}: {''.join(stderr_tail[-5:]).strip()[-500:]}"
                break
            message = json.loads(line)
            if "start" in message:
                running = tuple(message["start"])
            else:
                results.append(Outcome(**message["done"]))
                remaining.remove(running)
                running = None
        if running is None:
            if remaining:  # died between pairs: nothing to blame, but nothing may be lost either
                raise RuntimeError(f"sweep worker failed outside any pair: {crash}")
            break
        results.append(Outcome(running[0], running[1], "crash", crash))
        remaining.remove(running)


def run_sweep(pairs: Sequence[tuple[str, str]], workers: int = 2, timeout: float = PAIR_TIMEOUT_S,
              command: Sequence[str] | None = None) -> list[Outcome]:
    """Check `pairs` in `workers` parallel subprocesses; a crash or hang is recorded, never fatal.

    `command` starts one worker (default: this file with `--worker`); it reads the JSON list of pairs on stdin.
    """
    command = command or [sys.executable, __file__, "--worker"]
    shards = [list(pairs[i::workers]) for i in range(workers)]
    results: list[Outcome] = []
    threads = [threading.Thread(target=_run_worker_slot, args=(shard, results, timeout, command)) for shard in shards]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if len(results) != len(pairs):
        raise RuntimeError(f"the sweep lost results: {len(results)} of {len(pairs)} pairs reported")
    order = {pair: i for i, pair in enumerate(pairs)}
    return sorted(results, key=lambda o: order[(o.op, o.dtype)])


def report(results: Sequence[Outcome]) -> str:
    """Pass rate per dtype and overall, then every failing pair with its reason."""
    lines = ["OpInfo sweep on neuron vs CPU (pairs of op and dtype):"]
    for dtype in [dtype_name(d) for d in DTYPES] + [None]:
        chosen = [r for r in results if dtype is None or r.dtype == dtype]
        if not chosen:
            continue
        passed = sum(r.status == "pass" for r in chosen)
        lines.append(f"  {dtype or 'overall':>9}: {passed}/{len(chosen)} = {100 * passed / len(chosen):.2f} %")
    lines.append(f"  random pairs (checked for metadata and seeded reproducibility): {sum(r.random for r in results)}")
    compared, available = sum(r.samples for r in results), sum(r.available for r in results)
    thinned = sum(r.available > MAX_SAMPLES for r in results)
    lines.append(f"  samples compared: {compared} of {available} ({thinned} pairs thinned to {MAX_SAMPLES})")
    lines.append(f"  crashes: {sum(r.status == 'crash' for r in results)}")
    for r in results:
        if r.status != "pass":
            lines.append(f"  {r.status.upper()} {r.op} [{r.dtype}]: {r.reason}")
    return "\n".join(lines)


def _main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help="internal: check the JSON list of pairs on stdin")
    parser.add_argument("--ops", help="comma-separated op keys (default: all of op_db)")
    parser.add_argument("--dtypes", help="comma-separated dtypes (default: float32,bfloat16,int64,bool)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    if args.worker:
        _worker([tuple(pair) for pair in json.load(sys.stdin)])
        return
    ops = load_op_db()
    if args.ops:
        ops = {key: ops[key] for key in args.ops.split(",")}
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")] if args.dtypes else DTYPES
    results = run_sweep(all_pairs(ops, dtypes), workers=args.workers)
    print(report(results))
    slowest = sorted(results, key=lambda r: -r.seconds)[:10]
    print("slowest pairs: " + ", ".join(f"{r.op}[{r.dtype}] {r.seconds:.1f}s" for r in slowest))


if __name__ == "__main__":
    _main()
