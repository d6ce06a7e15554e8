"""`torch.compile(backend="neuron")` against CPU Inductor and against eager `neuron`, as ratios from one run.

    python benchmarks/compile.py [--rounds 7] [--json]

Model: the benchmark tiny Llama (2 layers, hidden 256, batch 2 x 128 tokens), inference forward.

* steady state, `backend="neuron"` on `neuron` / Inductor on CPU: the price of the device boundary on compiled code;
* steady state, `backend="neuron"` / eager, both on `neuron`: what compilation saves over per-op execution;
* steady state, CPU Inductor / CPU eager: what compiling saves on this model with no device in the way. Compiled
  `neuron` runs Inductor's host code, so this bounds the previous ratio: compiled / eager on `neuron` is about
  (Inductor / CPU eager) x (CPU eager / `neuron` eager);
* first compile, `backend="neuron"` / Inductor (each in a fresh process with empty caches, wall time of the first
  call, which includes tracing, lowering and the C++ compiler);
* cache hit: a second fresh process with the first one's `TORCH_NEURONX_NEFF_CACHE_DIR`, first-call time / the
  first process's;
* simulated device time of one forward, compiled / eager (the fused kernels' plan vs per-op charges).

Steady-state sides are interleaved ABBA on one thread in process CPU time (`_timing.py`); each case also checks that
both sides compute the same logits.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import torch
from _models import LlamaConfig, TinyLlama
from _timing import compare

_ROLE = "--first-compile"


def _llama(device: str) -> tuple[TinyLlama, torch.Tensor]:
    config = LlamaConfig()
    torch.manual_seed(0)
    model = copy.deepcopy(TinyLlama(config)).to(device).eval()
    tokens = torch.randint(0, config.vocab, (2, config.max_len), generator=torch.Generator().manual_seed(0))
    return model, tokens.to(device)


def _forward(model: Callable, tokens: torch.Tensor) -> Callable[[], torch.Tensor]:
    def forward() -> torch.Tensor:
        with torch.no_grad():
            return model(tokens)

    return forward


def first_compile(backend: str) -> float:
    """Wall seconds of the first call of the compiled model (run in a fresh process)."""
    device = "neuron" if backend == "neuron" else "cpu"
    model, tokens = _llama(device)
    compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=False)
    started = time.perf_counter()
    _forward(compiled, tokens)()
    return time.perf_counter() - started


def _fresh_process(backend: str, cache_dir: str, inductor_dir: str) -> float:
    env = {**os.environ, "TORCH_NEURONX_NEFF_CACHE_DIR": cache_dir, "TORCHINDUCTOR_CACHE_DIR": inductor_dir}
    done = subprocess.run([sys.executable, __file__, _ROLE, backend], env=env, capture_output=True, text=True,
                          check=True)
    return float(done.stdout.strip().splitlines()[-1])


def _simulated_forward_seconds(fn: Callable[[], torch.Tensor]) -> float:
    from neuron_device import timeline

    clock = timeline.timeline(0)
    start = clock.synchronize()
    fn()
    return clock.synchronize() - start


def measure(rounds: int) -> dict[str, object]:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="neuron-compile-bench-") as scratch:  # compile caches: removed after
        compile_times = {
            "neuron": _fresh_process("neuron", f"{scratch}/neff", f"{scratch}/inductor-1"),
            "inductor": _fresh_process("inductor", f"{scratch}/neff-unused", f"{scratch}/inductor-2"),
            "neuron_cache_hit": _fresh_process("neuron", f"{scratch}/neff", f"{scratch}/inductor-3"),
        }

        os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] = f"{scratch}/neff"
        model, tokens = _llama("neuron")
        cpu_model, cpu_tokens = _llama("cpu")
        eager = _forward(model, tokens)
        compiled = _forward(torch.compile(model, backend="neuron", fullgraph=True, dynamic=False), tokens)
        inductor = _forward(torch.compile(cpu_model, fullgraph=True, dynamic=False), cpu_tokens)
        cpu_eager = _forward(cpu_model, cpu_tokens)
        torch.testing.assert_close(compiled().cpu(), eager().cpu(), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(compiled().cpu(), inductor(), atol=1e-4, rtol=1e-4)

        vs_inductor = compare(compiled, inductor, rounds=rounds)
        vs_eager = compare(compiled, eager, rounds=rounds)
        inductor_vs_cpu_eager = compare(inductor, cpu_eager, rounds=rounds)
        simulated = {"compiled": _simulated_forward_seconds(compiled), "eager": _simulated_forward_seconds(eager)}
        return {
            "model": "tiny Llama, 2 layers, hidden 256, batch 2 x 128, inference forward",
            "machine": {"python": platform.python_version(), "torch": torch.__version__, "threads": 1},
            "steady_state": {
                "neuron_compiled_ms": vs_inductor.a_seconds * 1e3,
                "cpu_inductor_ms": vs_inductor.b_seconds * 1e3,
                "neuron_eager_ms": vs_eager.b_seconds * 1e3,
                "neuron_compiled_over_cpu_inductor": vs_inductor.ratio,
                "neuron_compiled_over_neuron_eager": vs_eager.ratio,
                "cpu_inductor_over_cpu_eager": inductor_vs_cpu_eager.ratio,
                "cpu_inductor_vs_cpu_eager_ms": [inductor_vs_cpu_eager.a_seconds * 1e3,
                                                 inductor_vs_cpu_eager.b_seconds * 1e3],
            },
            "first_compile_seconds": compile_times,
            "first_compile_neuron_over_inductor": compile_times["neuron"] / compile_times["inductor"],
            "cache_hit_over_first_compile": compile_times["neuron_cache_hit"] / compile_times["neuron"],
            "simulated_forward_ms": {k: v * 1e3 for k, v in simulated.items()},
            "simulated_compiled_over_eager": simulated["compiled"] / simulated["eager"],
            "targets": {"neuron_compiled_over_cpu_inductor": 1.1, "neuron_compiled_over_neuron_eager": 0.33,
                        "first_compile_neuron_over_inductor": 1.5, "cache_hit_over_first_compile": 0.2},
            "rounds": rounds,
        }


def _print_table(report: dict) -> None:
    steady, first = report["steady_state"], report["first_compile_seconds"]
    rows = [
        ("steady state: neuron compiled / CPU Inductor", steady["neuron_compiled_over_cpu_inductor"], 1.1,
         f"{steady['neuron_compiled_ms']:.2f} ms vs {steady['cpu_inductor_ms']:.2f} ms"),
        ("steady state: neuron compiled / neuron eager", steady["neuron_compiled_over_neuron_eager"], 0.33,
         f"{steady['neuron_compiled_ms']:.2f} ms vs {steady['neuron_eager_ms']:.2f} ms"),
        ("steady state: CPU Inductor / CPU eager", steady["cpu_inductor_over_cpu_eager"], None,
         "{:.2f} ms vs {:.2f} ms".format(*steady["cpu_inductor_vs_cpu_eager_ms"])),
        ("first compile: neuron / Inductor", report["first_compile_neuron_over_inductor"], 1.5,
         f"{first['neuron']:.1f} s vs {first['inductor']:.1f} s"),
        ("cache hit (2nd process) / first compile", report["cache_hit_over_first_compile"], 0.2,
         f"{first['neuron_cache_hit']:.1f} s vs {first['neuron']:.1f} s"),
        ("simulated device time: compiled / eager", report["simulated_compiled_over_eager"], None,
         "{compiled:.3f} ms vs {eager:.3f} ms".format(**report["simulated_forward_ms"])),
    ]
    print(f"{report['model']}")
    print(f"{'ratio':<45} {'value':>7} {'target':>7}  detail")
    for name, value, target, detail in rows:
        print(f"{name:<45} {value:>7.3f} {'<= ' + str(target) if target else '':>7}  {detail}")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == _ROLE:
        torch.set_num_threads(1)
        print(first_compile(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print the results as JSON after the table")
    args = parser.parse_args()
    report = measure(args.rounds)
    _print_table(report)
    if args.json:
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
