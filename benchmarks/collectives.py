"""Collective bandwidth on backend `neuron` (neuron tensors) against plain Gloo on CPU tensors, 2 ranks, 64 MB.

    python benchmarks/collectives.py [--mib 64] [--rounds 5]

The `neuron` backend moves data through Gloo on zero-copy host aliases, so its bandwidth should match Gloo's
(target: ratio >= 0.9). Both ranks run the same fixed schedule in lock step, interleaved A B B A per round so drift
hits both sides equally; time is wall time (a collective waits on its peer) and the ratio is the median over rounds.
Printed ratios are neuron / Gloo-CPU bus bandwidth (higher is better).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable


def _measure(run: Callable[[], None], calls: int) -> float:
    import torch.distributed as dist

    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        run()
    return (time.perf_counter() - start) / calls


def worker(mib: int, rounds: int, calls: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("neuron")
    world = dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    device = torch.device("neuron", torch.neuron.current_device())
    numel = mib * (1 << 20) // 4

    def workloads(where: torch.device, group: dist.ProcessGroup | None):
        tensor = torch.ones(numel, device=where)
        gathered = torch.empty(numel * world, device=where)
        return {
            "all_reduce": lambda: dist.all_reduce(tensor, group=group),
            "all_gather": lambda: dist.all_gather_into_tensor(gathered, tensor, group=group),
        }

    neuron, cpu = workloads(device, None), workloads(torch.device("cpu"), gloo)
    nbytes = numel * 4
    # bus bytes per rank of the ring algorithms (as nccl-tests count them)
    bus = {"all_reduce": 2 * (world - 1) / world * nbytes, "all_gather": (world - 1) * nbytes}
    for name in neuron:
        neuron[name](), cpu[name]()  # warm-up
        ratios, neuron_times, cpu_times = [], [], []
        for _ in range(rounds):
            a1, b1 = _measure(neuron[name], calls), _measure(cpu[name], calls)
            b2, a2 = _measure(cpu[name], calls), _measure(neuron[name], calls)
            neuron_times += [a1, a2]
            cpu_times += [b1, b2]
            ratios.append((b1 + b2) / (a1 + a2))  # bandwidth ratio = inverse time ratio
        if dist.get_rank() == 0:
            a, b = statistics.median(neuron_times), statistics.median(cpu_times)
            print(
                f"{name:<11} {mib} MiB x{world}: neuron {bus[name] / a / 1e9:6.2f} GB/s, gloo-cpu "
                f"{bus[name] / b / 1e9:6.2f} GB/s, neuron/gloo bandwidth ratio {statistics.median(ratios):.3f}",
                flush=True,
            )
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    if "RANK" in os.environ:
        worker(args.mib, args.rounds, args.calls)
        sys.stdout.flush()
        os._exit(0)  # skip interpreter teardown racing Gloo's threads (pytorch#190489)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, *sys.argv[1:]],
            env={
                **os.environ,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(args.world_size),
                "PYTHONWARNINGS": "ignore",
            },
        )
        for rank in range(args.world_size)
    ]
    codes = [p.wait(timeout=1800) for p in procs]
    if any(codes):
        raise SystemExit(f"ranks exited with {codes}")


if __name__ == "__main__":
    main()
