"""Run in a fresh process by the cache tests and the benchmark: compile a tiny model (forward and backward) with
`backend="neuron"`, check it against eager, and print the compile metrics and compile wall time as JSON."""

from __future__ import annotations

import json
import sys
import time

import torch

import neuron_compile.metrics


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).to("neuron")
    x = torch.randn(4, 8, device="neuron")
    compiled = torch.compile(model, backend="neuron", fullgraph=True)
    started = time.perf_counter()
    out = compiled(x)
    compile_seconds = time.perf_counter() - started
    out.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), model(x).detach().cpu())
    from torch._dynamo.utils import counters

    print(json.dumps({**neuron_compile.metrics.counters(), "first_call_seconds": compile_seconds,
                      "grad_ok": bool(model[0].weight.grad is not None),
                      "autograd_cache_hits": counters["aot_autograd"]["autograd_cache_hit"]}))


if __name__ == "__main__":
    sys.exit(main())
