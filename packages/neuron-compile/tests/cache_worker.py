"""Run in a fresh process by the cache tests and the benchmark: compile a tiny model (forward and backward) with
`backend="neuron"`, check it against eager, and print as JSON the compile metrics, the compile wall time, and what
a cache hit must reproduce exactly: the outputs, the gradients and the simulation report (simulated device time
and memory; its compile counters, which differ between a miss and a hit, are reported as the metrics).
`--tensor-parallel`: the model's linear layers sharded with DTensor over a one-rank mesh (a `neuron` process group:
neuron-distributed), compiled for inference; its graph takes the `DeviceMesh` as an input. It also prints what the
first compiled call (compile and run) added to the op ledger's call counts and fallbacks, and its device time."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter

import torch

import neuron_compile.metrics


def main() -> None:
    from neuron_device.simulation import report

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).to("neuron")
    x = torch.randn(4, 8, device="neuron")
    if "--tensor-parallel" in sys.argv:
        return tensor_parallel(model, x)
    compiled = torch.compile(model, backend="neuron", fullgraph=True)
    started = time.perf_counter()
    out = compiled(x)
    compile_seconds = time.perf_counter() - started
    out.sum().backward()
    simulation = report.collect()
    simulation.pop("graphs")
    torch.testing.assert_close(out.detach().cpu(), model(x).detach().cpu())
    from torch._dynamo.utils import counters

    print(json.dumps({**neuron_compile.metrics.counters(), "first_call_seconds": compile_seconds,
                      "grad_ok": bool(model[0].weight.grad is not None),
                      "autograd_cache_hits": counters["aot_autograd"]["autograd_cache_hit"],
                      "output": out.detach().cpu().tolist(),
                      "grads": [p.grad.cpu().tolist() for p in model.parameters()],
                      "simulation": simulation}))


def tensor_parallel(model: torch.nn.Module, x: torch.Tensor) -> None:
    import torch.distributed as dist
    from torch._dynamo.utils import counters
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from neuron_device import services
    from neuron_device.simulation import ledger, report

    dist.init_process_group("neuron", rank=0, world_size=1)  # MASTER_ADDR and MASTER_PORT from the test
    parallelize_module(model, init_device_mesh("neuron", (1,)), {"0": ColwiseParallel(), "2": RowwiseParallel()})
    with torch.no_grad():
        calls, busy = Counter(ledger.executed_ops), sum(services.timeline(0).busy.values())
        out = torch.compile(model, backend="neuron", fullgraph=True)(x)
        first_call = {"calls": dict(ledger.executed_ops - calls), "fallback_ops": ledger.get_fallback_ops(),
                      "device_seconds": sum(services.timeline(0).busy.values()) - busy}
        torch.testing.assert_close(out.cpu(), model(x).cpu())
    simulation = report.collect()
    simulation.pop("graphs")
    print(json.dumps({**neuron_compile.metrics.counters(), "output": out.cpu().tolist(), "simulation": simulation,
                      "autograd_cache_hits": counters["aot_autograd"]["autograd_cache_hit"],
                      "first_call": first_call}))
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
