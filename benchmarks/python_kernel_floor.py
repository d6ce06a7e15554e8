"""The least a pure-Python `neuron` op can cost, next to what ours costs: `a + b` on 16 elements, as ratios to the CPU.

    python benchmarks/python_kernel_floor.py [--rounds 7] [--json]

A `neuron` op is a Python kernel the dispatcher calls. Whatever the kernel does, it pays for that call, and a
zero-copy kernel must also alias its inputs as CPU tensors, run the CPU kernel and adopt the result as device
storage (`hostmem`). This script swaps `aten::add.Tensor`'s `neuron` kernel for two stripped ones and measures each
against the CPU in one run (ABBA, process CPU time, one thread; see `_timing.py`):

* **dispatch only**: a kernel that returns its first input. The dispatcher's round trip into Python.
* **floor**: host aliases of both inputs, the CPU kernel, the result adopted. No allocator model, no cost model, no
  checks: the least any kernel of this design does.
* **neuron**: the device's own kernel (`ops/fastpath.py`): the floor plus device-memory accounting, the simulated
  timeline and the checks that send every other call to the fallback.

The gap between "floor" and the CPU is what no Python-level optimisation can remove; the gap between "neuron" and
"floor" is our bookkeeping.
"""

from __future__ import annotations

import argparse
import json
import warnings
from collections.abc import Callable

import torch
from _timing import Comparison, compare

import neuron_device  # noqa: F401  (registers `neuron` when torch's autoload is off)
from neuron_device import storage as hostmem

_ADD = torch.ops.aten.add.Tensor
_cpu_add = _ADD._op  # the CPU kernel, reached through the dispatcher without `OpOverload.__call__`'s frame


def _dispatch_only(a: torch.Tensor, b: torch.Tensor, alpha=1) -> torch.Tensor:
    return a


def _floor(a: torch.Tensor, b: torch.Tensor, alpha=1) -> torch.Tensor:
    return hostmem.adopt(_cpu_add(hostmem.host_alias(a), hostmem.host_alias(b), alpha=alpha), a.device.index)


def _with_kernel(kernel: Callable | None, work: Callable[[], object]) -> Callable[[], object]:
    """`work`, run while `kernel` replaces `aten::add.Tensor`'s `neuron` kernel (None: the device's own)."""
    if kernel is None:
        return work
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel": that is the point
        library.impl("add.Tensor", kernel, "PrivateUse1")

    def run() -> object:
        return work()

    run.library = library  # the override lasts as long as `run`; `measure` drops it before the next case
    return run


KERNELS: dict[str, Callable | None] = {"dispatch only": _dispatch_only, "floor": _floor, "neuron": None}


def measure(rounds: int) -> dict[str, Comparison]:
    gen = torch.Generator().manual_seed(0)
    a_cpu, b_cpu = torch.randn(16, generator=gen), torch.randn(16, generator=gen)
    a, b = a_cpu.to("neuron"), b_cpu.to("neuron")
    results = {}
    for name, kernel in KERNELS.items():
        on_neuron = _with_kernel(kernel, lambda: a + b)
        if kernel is not _dispatch_only:
            torch.testing.assert_close(on_neuron().cpu(), a_cpu + b_cpu, msg=f"{name}: wrong sum")
        results[name] = compare(on_neuron, lambda: a_cpu + b_cpu, rounds=rounds)
        on_neuron = None  # destroys the overriding library: the device's kernel is back
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="ABBA rounds per case (median taken; at least 5)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    args = parser.parse_args()
    if args.rounds < 5:
        parser.error("--rounds must be at least 5")
    torch.set_num_threads(1)
    results = measure(args.rounds)
    rows = [{"kernel": name, "neuron_us": r.a_seconds * 1e6, "cpu_us": r.b_seconds * 1e6, "ratio": r.ratio}
            for name, r in results.items()]
    if args.json:
        print(json.dumps({"benchmark": "python_kernel_floor", "torch": torch.__version__, "rounds": args.rounds,
                          "results": rows}, indent=2))
        return
    print(f"add (16 elems) on neuron with each kernel vs cpu, torch {torch.__version__}, 1 thread, process CPU time, "
          f"ABBA x {args.rounds} rounds (medians)")
    print(f"{'kernel':<16} {'neuron us':>10} {'cpu us':>8} {'neuron/cpu':>11}")
    for row in rows:
        print(f"{row['kernel']:<16} {row['neuron_us']:>10.2f} {row['cpu_us']:>8.2f} {row['ratio']:>10.1f}x")


if __name__ == "__main__":
    main()
