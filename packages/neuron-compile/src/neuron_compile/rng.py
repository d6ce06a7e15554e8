"""Random numbers of compiled graphs come from the `neuron` device's generator, not the CPU's.

Inductor lowers random ops (dropout, `rand`, `randn`, `bernoulli`, ...) to its own counter-based generator, seeded
once per graph call by `prims.inductor_seeds(count, device)`, which draws the seeds from the default generator of
the graph's device. A `neuron` graph is compiled as a host graph, so that would be the CPU generator:
`torch.neuron.manual_seed` would not reproduce a compiled dropout and `torch.random.default_generator.manual_seed`
would change it. This pass retargets the seed node to `neuron_compile::device_seeds`, which draws the same seeds
from the current `neuron` device's generator. As on CUDA, compiled random numbers are then reproducible from the
device seed, though not bitwise equal to eager ones (Inductor's generator is not the eager one).

Random ops Inductor does not lower (e.g. `randperm`, `multinomial`, or every random op with Inductor's
`fallback_random=True`) run their ATen CPU kernel from the compiled code. The pass retargets each to a
`neuron_compile::device_rng_*` op of the same schema that runs that kernel on the `neuron` generator, as eager
`neuron` runs it (neuron-device's fallback): these ops give eager's numbers bitwise and advance the device
generator as eager does. An explicit `generator=` argument is used as given.

The "aten" host code (no Inductor lowering) runs the graph's `inductor_random` / `inductor_randint` nodes as ATen
calls, whose eager forms ignore their seed and draw from the CPU generator. `seeded_host_random` retargets them to
`neuron_compile::seeded_random` / `seeded_randint`, which draw from a generator seeded with the node's seed (itself
drawn from the device generator), so both host codes are reproducible from `torch.neuron.manual_seed`.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch

from neuron_device.services import seeded_call

__all__ = ["define_device_ops", "device_seeds", "seed_from_device", "seeded_host_random", "seeded_randint",
           "seeded_random"]

_LIMITS = torch.iinfo(torch.int64)


@torch.library.custom_op("neuron_compile::device_seeds", mutates_args=())
def device_seeds(count: int) -> torch.Tensor:
    """`count` int64 seeds from the current `neuron` device's generator (as `inductor_seeds` draws them)."""
    generator = torch.neuron.random.default_generator(torch.neuron.current_device())
    return torch.randint(_LIMITS.min, _LIMITS.max, (count,), dtype=torch.int64, generator=generator)


@device_seeds.register_fake
def _(count: int) -> torch.Tensor:
    return torch.empty(count, dtype=torch.int64)


def _generator(seed: torch.Tensor) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


@torch.library.custom_op("neuron_compile::seeded_random", mutates_args=())
def seeded_random(size: list[int], seed: torch.Tensor, mode: str) -> torch.Tensor:
    """`inductor_random` as ATen: float32 `torch.rand`/`torch.randn` (`mode`) from a generator seeded by `seed`."""
    return getattr(torch, mode)(size, dtype=torch.float32, generator=_generator(seed))


@seeded_random.register_fake
def _(size: list[int], seed: torch.Tensor, mode: str) -> torch.Tensor:
    return torch.empty(size, dtype=torch.float32)


@torch.library.custom_op("neuron_compile::seeded_randint", mutates_args=())
def seeded_randint(low: int, high: int, size: list[int], seed: torch.Tensor) -> torch.Tensor:
    """`inductor_randint` as ATen: int64 `torch.randint` from a generator seeded by `seed`."""
    return torch.randint(low, high, size, generator=_generator(seed))


@seeded_randint.register_fake
def _(low: int, high: int, size: list[int], seed: torch.Tensor) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int64)


_library = torch.library.Library("neuron_compile", "FRAGMENT")
_lock = threading.Lock()
_on_device: dict[torch._ops.OpOverload, torch._ops.OpOverload] = {}


def _device_rng_op(op: torch._ops.OpOverload) -> torch._ops.OpOverload:
    """`neuron_compile::device_rng_<op>`: `op`'s schema, drawing from the current `neuron` device's generator."""
    with _lock:
        found = _on_device.get(op)
        if found is not None:
            return found
        schema = op._schema
        name = "device_rng_" + schema.name.split("::")[1] + (f"_{schema.overload_name}" if schema.overload_name else "")
        _library.define(name + "(" + str(schema).split("(", 1)[1], tags=(torch.Tag.nondeterministic_seeded,))
        generator = next((a.name for a in schema.arguments if str(a.type) == "Optional[Generator]"), None)

        def run(*args: Any, **kwargs: Any) -> Any:
            if generator is not None and kwargs.get(generator) is not None:
                return op(*args, **kwargs)
            return seeded_call(op, torch.neuron.current_device(), args, kwargs)

        def fake(*args: Any, **kwargs: Any) -> Any:
            return op(*args, **kwargs)

        _library.impl(name, run, "CompositeExplicitAutograd")  # factories (randperm) have no tensor to dispatch on
        torch.library.register_fake(f"neuron_compile::{name}", fake, lib=_library)
        found = _on_device[op] = getattr(torch.ops.neuron_compile, name).default
        return found


def _draws_from_aten(op: Any) -> bool:
    """A functional random ATen op (what a functionalised graph holds). Attention ops, random only through their
    `dropout_p`, stay as they are: Inductor has its own handling of them."""
    if not (isinstance(op, torch._ops.OpOverload) and op.namespace == "aten"
            and torch.Tag.nondeterministic_seeded in op.tags):
        return False
    arguments = op._schema.arguments
    return all(a.alias_info is None for a in arguments) and all(a.name != "dropout_p" for a in arguments)


@functools.cache
def define_device_ops() -> None:
    """Define the `device_rng_*` op of every random ATen op (once per process): code Inductor or AOTAutograd load
    from their caches (without running this pass in this process) calls them by name."""
    for name in torch._C._dispatch_get_all_op_names():
        namespace, _, rest = name.partition("::")
        if namespace != "aten":
            continue
        packet_name, _, overload = rest.partition(".")
        op = getattr(getattr(torch.ops.aten, packet_name, None), overload or "default", None)
        if _draws_from_aten(op):
            _device_rng_op(op)


def seed_from_device(gm: torch.fx.GraphModule) -> int:
    """Retarget the graph's `inductor_seeds` nodes to `device_seeds`, and its random ATen ops to their
    `device_rng_*` forms; return how many nodes changed."""
    seeds = torch.ops.prims.inductor_seeds.default  # defined when Inductor loads (it calls this pass)
    nodes = list(gm.graph.find_nodes(op="call_function", target=seeds))
    for node in nodes:
        node.target = torch.ops.neuron_compile.device_seeds.default
        node.args = (node.args[0],)
        node.kwargs = {}
    random_ops = [node for node in gm.graph.nodes if node.op == "call_function" and _draws_from_aten(node.target)]
    for node in random_ops:
        node.target = _device_rng_op(node.target)
    if nodes or random_ops:
        gm.recompile()
    return len(nodes) + len(random_ops)


def seeded_host_random(gm: torch.fx.GraphModule) -> int:
    """Retarget the graph's `inductor_random` / `inductor_randint` nodes to their seeded ATen forms (for the "aten"
    host code, see the module doc); return how many nodes changed."""
    changed = 0
    for node in list(gm.graph.find_nodes(op="call_function", target=torch.ops.prims.inductor_random.default)):
        node.target, node.kwargs = torch.ops.neuron_compile.seeded_random.default, {}  # align_dtype: CUDA only
        changed += 1
    for node in list(gm.graph.find_nodes(op="call_function", target=torch.ops.prims.inductor_randint.default)):
        node.target = torch.ops.neuron_compile.seeded_randint.default
        changed += 1
    if changed:
        gm.recompile()
    return changed
