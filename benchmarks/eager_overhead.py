"""Eager-mode overhead of the `neuron` device: the same work on `neuron` and on the CPU, as neuron/cpu ratios.

    python benchmarks/eager_overhead.py [--rounds 7] [--json] [--no-rss]

Every `neuron` op runs a CPU kernel on host memory, so the ratio is the per-op cost the device layer adds
(dispatch to the Python fallback, host aliasing, result adoption, bookkeeping). Tiny ops show the fixed cost; the
model forward and training step show how much of it a realistic workload pays. Both sides are measured in one run
with ABBA interleaving on one thread in process CPU time (see `_timing.py`). Each case also checks that both sides
compute the same result, so a fast wrong answer cannot pass for a speed-up.

"add (16) after a 4 MiB write" runs the add after a CPU kernel that evicts the caches, as in a real model, where each
op follows kernels that stream megabytes: the per-op path then costs several times its tight-loop time, in
proportion to the code and data it touches (this is most of the Llama forward's gap). Its line gives the op's extra
time over the CPU's for our kernel and for the floor kernel.

"llama fwd, adaptive eager" runs the same forward with adaptive eager on for the `neuron` side (queued ops, repeated
runs compiled into one kernel; its first calls, in the warm-up, include the compilation).

Peak host memory: the Llama forward runs in two fresh child processes, one per device, each reporting its peak RSS
(VmHWM) and its RSS before building the model; the table gives the ratio of the peaks and of the increases.

neuron-nki, when installed, makes its NKI kernels (flash attention, RMSNorm, softmax) the native `neuron`
implementation (`NEURON_NKI_NATIVE_KERNELS`: `1` simulates each kernel once per signature, `simulate` every call,
`0` measures the device layer alone). The report states which was measured.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Callable

import torch
from _models import LlamaConfig, TinyLlama
from _timing import Comparison, compare
from python_kernel_floor import floor_kernel, with_kernel
from torch.nn import functional as F

Case = Callable[[str], Callable[[], torch.Tensor]]


def _pair(shape: tuple[int, ...], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(shape, generator=gen).to(device), torch.randn(shape, generator=gen).to(device)


def add_16(device: str) -> Callable[[], torch.Tensor]:
    a, b = _pair((16,), device)
    return lambda: a + b


_EVICTING_BYTES = 4 << 20  # twice this machine's 2 MiB of L2 cache per core


def add_16_evicted(device: str) -> Callable[[], torch.Tensor]:
    """`add (16 elems)` right after a CPU kernel that writes 4 MiB, as every op of a real model runs after others
    that stream megabytes: the caches no longer hold the per-op path's code and data, so its cost is set by how much
    of them it touches, not by its speed in a tight loop. Both sides do the same write; the difference is the op."""
    a, b = _pair((16,), device)
    evicting = torch.zeros(_EVICTING_BYTES // 4)

    def run() -> torch.Tensor:
        evicting.add_(1.0)
        return a + b

    return run


def mul_16(device: str) -> Callable[[], torch.Tensor]:
    a, b = _pair((16,), device)
    return lambda: a * b


def matmul_64(device: str) -> Callable[[], torch.Tensor]:
    a, b = _pair((64, 64), device)
    return lambda: a @ b


def view_16(device: str) -> Callable[[], torch.Tensor]:
    a, _ = _pair((16,), device)
    return lambda: a.view(4, 4)


def index_16(device: str) -> Callable[[], torch.Tensor]:
    a, _ = _pair((16,), device)
    indices = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6], device=device)
    return lambda: a[indices]


def _llama(device: str) -> tuple[TinyLlama, torch.Tensor]:
    """The benchmark model (2 layers, hidden 256) and a batch of 2 x 128 tokens; the same weights on every device."""
    config = LlamaConfig()
    torch.manual_seed(0)
    model = copy.deepcopy(TinyLlama(config)).to(device)
    tokens = torch.randint(0, config.vocab, (2, config.max_len), generator=torch.Generator().manual_seed(0))
    return model, tokens.to(device)


def llama_forward(device: str) -> Callable[[], torch.Tensor]:
    """Inference forward, without autograd."""
    model, tokens = _llama(device)
    model.eval()

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return model(tokens)

    return forward


def llama_forward_adaptive(device: str) -> Callable[[], torch.Tensor]:
    """The inference forward with adaptive eager on the `neuron` side (`TORCH_NEURONX_ENABLE_CONCATENATION`, switched
    on at run time around each call): ops are queued and repeated runs fused. Switching it off at the end of a call
    flushes the queue, so every measured call computes its logits. The CPU side is plain eager."""
    forward = llama_forward(device)
    if device != "neuron":
        return forward
    from neuron_device.adaptive_eager import queue as adaptive_eager

    def adaptive() -> torch.Tensor:
        adaptive_eager.set_enabled(True)
        try:
            return forward()
        finally:
            adaptive_eager.set_enabled(False)

    return adaptive


def llama_train_step(device: str) -> Callable[[], torch.Tensor]:
    """One next-token training step: forward, backward, AdamW."""
    model, tokens = _llama(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


CASES: dict[str, Case] = {
    "add (16 elems)": add_16,
    "mul (16 elems)": mul_16,
    "add (16) after a 4 MiB write": add_16_evicted,
    "matmul (64x64)": matmul_64,
    "view (16 -> 4x4)": view_16,
    "index (16[8 idx])": index_16,
    "llama fwd (2L, h256, s128, b2)": llama_forward,
    "llama fwd, adaptive eager": llama_forward_adaptive,
    "llama train step (fwd+bwd+AdamW)": llama_train_step,
}


EVICTED = "add (16) after a 4 MiB write"
FLOOR_CASES = {"add (16 elems)": "add.Tensor", "mul (16 elems)": "mul.Tensor",
               EVICTED: "add.Tensor"}


def measure(rounds: int) -> dict[str, Comparison]:
    results = {}
    for name, case in CASES.items():
        on_neuron, on_cpu = case("neuron"), case("cpu")
        torch.testing.assert_close(on_neuron().cpu(), on_cpu(), atol=1e-4, rtol=1e-4, msg=f"{name}: results differ")
        results[name] = compare(on_neuron, on_cpu, rounds=rounds)
    for name, op in FLOOR_CASES.items():  # the floor kernel vs the CPU; the device's own / floor is the ratio's ratio
        floor = with_kernel(floor_kernel(getattr(torch.ops.aten, op.split(".")[0]).Tensor), CASES[name]("neuron"), op)
        results[f"{name}, floor kernel"] = compare(floor, CASES[name]("cpu"), rounds=rounds)
        floor = None  # destroys the overriding library: the device's kernel is back
    results.update(own_vs_floor(rounds))
    return results


_BINARY = {"add": torch.add, "mul": torch.mul}


def own_vs_floor(rounds: int) -> dict[str, Comparison]:
    """The device's own kernel against the floor kernel, interleaved (ABBA) in one comparison.

    One process cannot run two kernels of one op at once, so each op's own kernel is timed against the floor kernel
    installed on the other op (`add` against `mul`'s floor, then `mul` against `add`'s). The dispatch path is the
    same for both; the CPU kernels differ slightly, and the geometric mean of the two ratios cancels that exactly:
    (add/mul floor)(mul/add floor) = (add/add floor)(mul/mul floor). A ratio of two separate comparisons with the
    CPU (the rows above) carries the drift between them: it ranged from 1.29 to 1.71 over three runs.
    """
    a, b = _pair((16,), "neuron")
    results = {}
    for own, floored in (("add", "mul"), ("mul", "add")):
        op = getattr(torch.ops.aten, floored).Tensor
        floor = with_kernel(floor_kernel(op), functools.partial(_BINARY[floored], a, b), f"{floored}.Tensor")
        torch.testing.assert_close(floor().cpu(), _BINARY[floored](a.cpu(), b.cpu()), msg=f"{floored}: floor kernel")
        results[f"{own} (16), own kernel vs {floored} floor"] = compare(functools.partial(_BINARY[own], a, b), floor,
                                                                       rounds=rounds)
        floor = None  # destroys the overriding library
    return results


def _status_kib(field: str) -> int:
    """A memory field of /proc/self/status in KiB (Linux): VmRSS now, VmHWM the peak.

    Not `ru_maxrss`, which a child process inherits from the parent it was forked from (it survives `exec`).
    """
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _rss_child(device: str) -> None:
    """Child process: run the Llama forward on `device` and print its RSS before the model and its peak RSS (KiB)."""
    torch.set_num_threads(1)
    before = _status_kib("VmRSS")
    forward = llama_forward(device)
    for _ in range(3):
        forward().cpu()
    print(json.dumps({"before_kib": before, "peak_kib": _status_kib("VmHWM")}))


def peak_rss() -> dict[str, object]:
    """Peak RSS of the Llama forward on `neuron` and on `cpu`, each in a fresh process (run one after the other)."""
    sides = {}
    for device in ("neuron", "cpu"):
        output = subprocess.run([sys.executable, __file__, "--rss-child", device], check=True, capture_output=True,
                                text=True).stdout
        sides[device] = json.loads(output.strip().splitlines()[-1])
    neuron, cpu = sides["neuron"], sides["cpu"]
    return {
        "neuron": neuron,
        "cpu": cpu,
        "peak_ratio": neuron["peak_kib"] / cpu["peak_kib"],
        "increase_ratio": (neuron["peak_kib"] - neuron["before_kib"]) / max(cpu["peak_kib"] - cpu["before_kib"], 1),
    }


def _report(results: dict[str, Comparison], rounds: int, rss: dict[str, object] | None) -> dict[str, object]:
    return {
        "benchmark": "eager_overhead",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "clock": "process CPU time",
        "rounds": rounds,
        "nki_native_kernels": os.environ.get("NEURON_NKI_NATIVE_KERNELS", "1"),
        "peak_rss": rss,
        "results": [
            {
                "case": name,
                "neuron_us": result.a_seconds * 1e6,
                "cpu_us": result.b_seconds * 1e6,
                "ratio": result.ratio,
                "calls_per_sample": result.calls_per_sample,
            }
            for name, result in results.items()
        ],
    }


def _print_table(report: dict[str, object]) -> None:
    print(f"eager overhead: neuron vs cpu, torch {report['torch']}, {report['threads']} thread, "
          f"{report['clock']}, ABBA x {report['rounds']} rounds (medians)")
    print(f"{'case':<32} {'neuron us':>11} {'cpu us':>11} {'neuron/cpu':>11}")
    interleaved = [row for row in report["results"] if ", own kernel vs " in row["case"]]
    for row in report["results"]:
        if row in interleaved:
            continue  # not a neuron/cpu row: printed below
        print(f"{row['case']:<32} {row['neuron_us']:>11.1f} {row['cpu_us']:>11.1f} {row['ratio']:>10.1f}x")
    ratios = {row["case"]: row["ratio"] for row in report["results"]}
    for row in interleaved:  # a: the device's own kernel, b: the floor kernel
        print(f"{row['case']}: {row['neuron_us']:.1f} us / {row['cpu_us']:.1f} us = {row['ratio']:.2f}x")
    print(f"add, mul (16 elems): own kernel / floor kernel of python_kernel_floor.py (geometric mean of the two "
          f"above) = {math.sqrt(interleaved[0]['ratio'] * interleaved[1]['ratio']):.3f}x (target <= 1.35)")
    rows = {row["case"]: row for row in report["results"]}
    own, floor = rows[EVICTED], rows[EVICTED + ", floor kernel"]
    own_extra, floor_extra = own["neuron_us"] - own["cpu_us"], floor["neuron_us"] - floor["cpu_us"]
    print(f"{EVICTED}: the op costs {own_extra:.1f} us more on neuron than on cpu, {floor_extra:.1f} us with the "
          f"floor kernel ({own_extra / max(floor_extra, 1e-9):.2f}x): the host path once caches are evicted")
    plain, adaptive = ratios["llama fwd (2L, h256, s128, b2)"], ratios["llama fwd, adaptive eager"]
    print(f"llama fwd: neuron / cpu eager = {plain:.3f}x (target <= 1.25); adaptive eager: {adaptive:.3f}x, "
          f"{adaptive / plain:.3f}x plain eager's (target <= 1.0; the two rows' ratio, each against its own CPU run)")
    print(f"NEURON_NKI_NATIVE_KERNELS={report['nki_native_kernels']}")
    rss = report["peak_rss"]
    if rss is not None:
        print(f"peak RSS, llama fwd: neuron {rss['neuron']['peak_kib'] / 1024:.1f} MiB, cpu "
              f"{rss['cpu']['peak_kib'] / 1024:.1f} MiB: {rss['peak_ratio']:.2f}x "
              f"(increase over start-up: {rss['increase_ratio']:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="ABBA rounds per case (median taken; at least 5)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    parser.add_argument("--no-rss", action="store_true", help="skip the peak-RSS comparison (two child processes)")
    parser.add_argument("--rss-child", choices=("neuron", "cpu"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        _rss_child(args.rss_child)
        return
    if args.rounds < 5:
        parser.error("--rounds must be at least 5")
    torch.set_num_threads(1)
    results = measure(args.rounds)
    report = _report(results, args.rounds, None if args.no_rss else peak_rss())
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_table(report)


if __name__ == "__main__":
    main()
