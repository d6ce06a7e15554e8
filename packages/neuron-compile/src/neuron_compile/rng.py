"""Random numbers of compiled graphs come from the `neuron` device's generator, not the CPU's.

Inductor lowers random ops (dropout, `rand`, `randn`, `bernoulli`, ...) to its own counter-based generator, seeded
once per graph call by `prims.inductor_seeds(count, device)`, which draws the seeds from the default generator of
the graph's device. A `neuron` graph is compiled as a host graph, so that would be the CPU generator:
`torch.neuron.manual_seed` would not reproduce a compiled dropout and `torch.random.default_generator.manual_seed`
would change it. This pass retargets the seed node to `neuron_compile::device_seeds`, which draws the same seeds
from the current `neuron` device's generator. As on CUDA, compiled random numbers are then reproducible from the
device seed, though not bitwise equal to eager ones (Inductor's generator is not the eager one).

Random ops Inductor does not lower (e.g. `randperm`, `multinomial`, or every random op with Inductor's
`fallback_random=True`) run the ATen CPU kernel and still draw from the CPU generator.
"""

from __future__ import annotations

import torch

__all__ = ["device_seeds", "seed_from_device"]

_LIMITS = torch.iinfo(torch.int64)


@torch.library.custom_op("neuron_compile::device_seeds", mutates_args=())
def device_seeds(count: int) -> torch.Tensor:
    """`count` int64 seeds from the current `neuron` device's generator (as `inductor_seeds` draws them)."""
    generator = torch.neuron.random.default_generator(torch.neuron.current_device())
    return torch.randint(_LIMITS.min, _LIMITS.max, (count,), dtype=torch.int64, generator=generator)


@device_seeds.register_fake
def _(count: int) -> torch.Tensor:
    return torch.empty(count, dtype=torch.int64)


def seed_from_device(gm: torch.fx.GraphModule) -> int:
    """Retarget the graph's `inductor_seeds` nodes to `device_seeds`; return how many."""
    seeds = torch.ops.prims.inductor_seeds.default  # defined when Inductor loads (it calls this pass)
    nodes = list(gm.graph.find_nodes(op="call_function", target=seeds))
    for node in nodes:
        node.target = torch.ops.neuron_compile.device_seeds.default
        node.args = (node.args[0],)
        node.kwargs = {}
    if nodes:
        gm.recompile()
    return len(nodes)
