"""`torch.compile(backend="neuron")` against CPU Inductor and against eager `neuron`, as ratios from one run.

    python benchmarks/compile.py [--rounds 7] [--json]

Model: the benchmark tiny Llama (2 layers, hidden 256, batch 2 x 128 tokens). The `neuron` backend has two host
codes (`options={"host_code": ...}`): "aten" (default: the AOT graph calls ATen CPU kernels, no C++ compiler) and
"inductor" (Inductor's C++ code generation). Ratios:

* first compile of a training step (forward + backward), `backend="neuron"` per host code / CPU Inductor, each in a
  fresh process with empty caches: the process's CPU time (its own + the C++ compilers it waited for) around the
  first step, which includes tracing, lowering and, for Inductor, the C++ compiler. Wall time is shown too;
* cache hit: a second fresh process with the first one's `TORCH_NEURONX_NEFF_CACHE_DIR`, first-step CPU time / the
  first process's, per host code;
* steady state of the inference forward, `backend="neuron"` per host code / CPU Inductor, and / eager `neuron`;
  CPU Inductor / CPU eager (what compiling saves with no device in the way);
* simulated device time of one forward, compiled / eager, and compiled "aten" / compiled "inductor" (must be 1);
* transformers `generate(cache_implementation="static")` of a tiny `LlamaForCausalLM` (2 layers, hidden 32, 8 new
  tokens; generate compiles its forward with the `neuron` backend), first call in a fresh process: "aten" /
  "inductor" (today's host code), and a second process with the first one's compile cache / the first (skipped
  without transformers).

Steady-state sides are interleaved ABBA on one thread in process CPU time (`_timing.py`); each case also checks that
both sides compute the same logits.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import torch
from _models import LlamaConfig, TinyLlama
from _timing import compare

_ROLE = "--first-compile"
_GENERATE_ROLE = "--first-generate"
HOST_CODES = ("aten", "inductor")


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


def _cpu_seconds() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def first_compile(backend: str) -> tuple[float, float]:
    """CPU and wall seconds of the first training step of the compiled model (run in a fresh process).
    `backend`: "inductor" (CPU) or "neuron-<host code>"."""
    device = "cpu" if backend == "inductor" else "neuron"
    model, tokens = _llama(device)
    model.train()
    if backend == "inductor":
        compiled = torch.compile(model, fullgraph=True, dynamic=False)
    else:
        compiled = torch.compile(model, backend="neuron", fullgraph=True, dynamic=False,
                                 options={"host_code": backend.split("-", 1)[1]})
    cpu, wall = _cpu_seconds(), time.perf_counter()
    compiled(tokens).float().pow(2).mean().backward()
    return _cpu_seconds() - cpu, time.perf_counter() - wall


def first_generate() -> tuple[float, float]:
    """CPU and wall seconds of the first static-cache `generate` on `neuron` (run in a fresh process; the host code
    is the one `NEURON_COMPILE_HOST_CODE` names)."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    transformers.set_seed(0)
    model = transformers.LlamaForCausalLM(config).to("neuron").eval()
    prompt = torch.tensor([[1, 17, 42, 99, 5, 63]], device="neuron")
    cpu, wall = _cpu_seconds(), time.perf_counter()
    model.generate(prompt, max_new_tokens=8, pad_token_id=0, do_sample=False, cache_implementation="static")
    return _cpu_seconds() - cpu, time.perf_counter() - wall


def _fresh_process(backend: str, cache_dir: str, inductor_dir: str, role: str = _ROLE) -> tuple[float, float]:
    env = {**os.environ, "TORCH_NEURONX_NEFF_CACHE_DIR": cache_dir, "TORCHINDUCTOR_CACHE_DIR": inductor_dir,
           "TORCHINDUCTOR_COMPILE_THREADS": "1"}  # C++ compiles as waited-for children: counted in CPU time
    if role == _GENERATE_ROLE:
        env["NEURON_COMPILE_HOST_CODE"] = backend
    done = subprocess.run([sys.executable, __file__, role, backend], env=env, capture_output=True, text=True,
                          check=True)
    cpu, wall = done.stdout.strip().splitlines()[-1].split()
    return float(cpu), float(wall)


def _simulated_forward_seconds(fn: Callable[[], torch.Tensor]) -> float:
    from neuron_device import timeline

    clock = timeline.timeline(0)
    start = clock.synchronize()
    fn()
    return clock.synchronize() - start


def measure(rounds: int) -> dict[str, object]:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="neuron-compile-bench-") as scratch:  # compile caches: removed after
        first = {"cpu_inductor": _fresh_process("inductor", f"{scratch}/neff-unused", f"{scratch}/inductor-cpu")}
        hits = {}
        for host_code in HOST_CODES:
            backend = f"neuron-{host_code}"
            first[host_code] = _fresh_process(backend, f"{scratch}/neff-{host_code}", f"{scratch}/ind-{host_code}-1")
            hits[host_code] = _fresh_process(backend, f"{scratch}/neff-{host_code}", f"{scratch}/ind-{host_code}-2")
        generate = {}
        if importlib.util.find_spec("transformers") is not None:
            for host_code in HOST_CODES:
                cache = f"{scratch}/generate-{host_code}"
                generate[host_code] = _fresh_process(host_code, cache, f"{cache}-ind-1", _GENERATE_ROLE)
                generate[f"{host_code}_cache_hit"] = _fresh_process(host_code, cache, f"{cache}-ind-2",
                                                                    _GENERATE_ROLE)

        os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] = f"{scratch}/neff-steady"
        model, tokens = _llama("neuron")
        cpu_model, cpu_tokens = _llama("cpu")
        eager = _forward(model, tokens)
        inductor = _forward(torch.compile(cpu_model, fullgraph=True, dynamic=False), cpu_tokens)
        cpu_eager = _forward(cpu_model, cpu_tokens)
        compiled = {
            host_code: _forward(torch.compile(copy.deepcopy(model), backend="neuron", fullgraph=True, dynamic=False,
                                              options={"host_code": host_code}), tokens)
            for host_code in HOST_CODES
        }
        for fn in compiled.values():
            torch.testing.assert_close(fn().cpu(), eager().cpu(), atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(fn().cpu(), inductor(), atol=1e-4, rtol=1e-4)

        steady = {}
        for host_code, fn in compiled.items():
            vs_inductor = compare(fn, inductor, rounds=rounds)
            vs_eager = compare(fn, eager, rounds=rounds)
            steady[host_code] = {"ms": vs_inductor.a_seconds * 1e3, "over_cpu_inductor": vs_inductor.ratio,
                                 "over_neuron_eager": vs_eager.ratio, "cpu_inductor_ms": vs_inductor.b_seconds * 1e3,
                                 "neuron_eager_ms": vs_eager.b_seconds * 1e3}
        inductor_vs_cpu_eager = compare(inductor, cpu_eager, rounds=rounds)
        simulated = {"eager": _simulated_forward_seconds(eager)}
        simulated.update({host_code: _simulated_forward_seconds(fn) for host_code, fn in compiled.items()})
        return {
            "model": "tiny Llama, 2 layers, hidden 256, batch 2 x 128",
            "machine": {"python": platform.python_version(), "torch": torch.__version__, "threads": 1},
            "first_compile_cpu_wall_seconds": first,
            "cache_hit_cpu_wall_seconds": hits,
            "generate_static_cpu_wall_seconds": generate,
            "steady_state": steady,
            "cpu_inductor_over_cpu_eager": inductor_vs_cpu_eager.ratio,
            "simulated_forward_ms": {k: v * 1e3 for k, v in simulated.items()},
            "rounds": rounds,
        }


def _print_table(report: dict) -> None:
    first, hits, steady = report["first_compile_cpu_wall_seconds"], report["cache_hit_cpu_wall_seconds"], \
        report["steady_state"]
    simulated = report["simulated_forward_ms"]
    rows = []
    for host_code, target in (("aten", 0.35), ("inductor", None)):
        (cpu, wall), (cpu_inductor, wall_inductor) = first[host_code], first["cpu_inductor"]
        rows.append((f"first compile fwd+bwd: neuron {host_code} / CPU Inductor", cpu / cpu_inductor, target,
                     f"{cpu:.1f} s vs {cpu_inductor:.1f} s CPU ({wall:.1f} s vs {wall_inductor:.1f} s wall)"))
    rows.append(("first compile: neuron aten / neuron inductor", first["aten"][0] / first["inductor"][0], None,
                 "the host-code choice alone"))
    for host_code in HOST_CODES:
        rows.append((f"cache hit (2nd process) / first, {host_code}", hits[host_code][0] / first[host_code][0], 0.15,
                     f"{hits[host_code][0]:.1f} s vs {first[host_code][0]:.1f} s CPU"))
    for host_code, target in (("aten", 1.2), ("inductor", 1.1)):
        rows.append((f"steady fwd: neuron {host_code} / CPU Inductor", steady[host_code]["over_cpu_inductor"], target,
                     f"{steady[host_code]['ms']:.2f} ms vs {steady[host_code]['cpu_inductor_ms']:.2f} ms"))
    for host_code in HOST_CODES:
        rows.append((f"steady fwd: neuron {host_code} / neuron eager", steady[host_code]["over_neuron_eager"], None,
                     f"{steady[host_code]['ms']:.2f} ms vs {steady[host_code]['neuron_eager_ms']:.2f} ms"))
    rows.append(("steady fwd: CPU Inductor / CPU eager", report["cpu_inductor_over_cpu_eager"], None, ""))
    rows.append(("simulated device time: compiled / eager", simulated["aten"] / simulated["eager"], None,
                 f"{simulated['aten']:.3f} ms vs {simulated['eager']:.3f} ms"))
    rows.append(("simulated device time: aten / inductor", simulated["aten"] / simulated["inductor"], 1.0,
                 "must be exactly 1"))
    generate = report["generate_static_cpu_wall_seconds"]
    if generate:
        rows.append(("generate(static) first call: aten / inductor (today)", generate["aten"][0] / generate["inductor"][0],
                     0.4, "{:.1f} s vs {:.1f} s CPU".format(generate["aten"][0], generate["inductor"][0])))
        for host_code in HOST_CODES:
            hit, first_call = generate[f"{host_code}_cache_hit"][0], generate[host_code][0]
            rows.append((f"generate(static) warm cache / first, {host_code}", hit / first_call, 0.15,
                         f"{hit:.1f} s vs {first_call:.1f} s CPU"))
    print(f"{report['model']} (process CPU time, 1 thread)")
    print(f"{'ratio':<52} {'value':>7} {'target':>8}  detail")
    for name, value, target, detail in rows:
        print(f"{name:<52} {value:>7.3f} {'<= ' + str(target) if target else '':>8}  {detail}")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] in (_ROLE, _GENERATE_ROLE):
        torch.set_num_threads(1)
        print(*(first_compile(sys.argv[2]) if sys.argv[1] == _ROLE else first_generate()))
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
