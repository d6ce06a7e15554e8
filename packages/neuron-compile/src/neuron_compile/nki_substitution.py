"""Substitute Neuron kernels (NKI attention, norms) for the ops they implement inside compiled graphs.

A kernel reaches us the way every kernel joins the device: a `neuron_device.plugins` plugin (neuron-nki, or a
user's package) calls `registry.register("aten::op.overload", fn)` in its `neuron_register` hook, which makes `fn`
the op's eager `neuron` kernel. For the ops in `SUBSTITUTABLE` (attention and norms) that have such a kernel,
compilation keeps the op whole (it is left out of the decomposition table) and this pass retargets its node to a
`neuron_compile::nki_<op>` custom op with the same schema. Inductor cannot lower that op, so it calls it as one
extern kernel, whose host implementation runs the registered kernel on `neuron` views of the host buffers. Without
any registered kernel (neuron-nki not installed) nothing is substituted and the graph is compiled as usual.

Inductor lays out a custom op's inputs as it likes unless the op is tagged `needs_exact_strides` and its node records
the values it was traced with (`eager_input_vals`: tracing writes them, a node retargeted after tracing lacks them).
The replacement ops carry that tag and `substitute` records those values, so a kernel gets its inputs with the strides
the graph was traced with, as in eager. Left free, Inductor laid out attention inputs copied from a channels-first
convolution output with a strided head dim, which torch's CPU flash-attention kernel (the NKI attention kernel's
fallback, e.g. for masked calls) reads as if it were dense: garbage.

Inductor checks every extern kernel's outputs against the sizes and strides of the op's meta function (the layout it
planned the graph with), while a kernel may lay its outputs out differently (e.g. contiguous where the meta function
follows a transposed input's memory order). The host implementation therefore copies an output whose strides differ
into the layout the meta function promises; the promised layouts are computed once per argument signature.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from neuron_device import services
from neuron_device.services import adopt, host_alias

__all__ = ["SUBSTITUTABLE", "define_replacements", "substitutable_ops", "substitute", "substituted_calls"]

# Ops a Neuron kernel may replace in compiled graphs: attention and normalisation, as TorchNeuron's NKI library.
SUBSTITUTABLE = (
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_fused_attention_overrideable",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::native_layer_norm",
    "aten::_fused_rms_norm",
    "aten::_softmax",
)

_library = torch.library.Library("neuron_compile", "FRAGMENT")
_lock = threading.Lock()
_replacements: dict[torch._ops.OpOverload, torch._ops.OpOverload] = {}
substituted_calls: dict[str, int] = {}  # registered kernel name -> calls from compiled code (observability, tests)


def _overload(name: str) -> torch._ops.OpOverload | None:
    namespace, _, rest = name.partition("::")
    packet_name, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, namespace), packet_name, None)
    return None if packet is None else getattr(packet, overload or "default", None)


def substitutable_ops() -> dict[torch._ops.OpOverload, Callable]:
    """The substitutable ops that have a Neuron kernel registered by a plugin, with that kernel.

    neuron-device's own kernels for these ops (the CPU kernel on host aliases) do not count: substituting one would
    only take the op out of Inductor's hands. A kernel with a `substitute_in_graphs()` attribute is asked at compile
    time (neuron-nki's kernels say yes only when they run in the instruction simulator)."""
    found = {}
    for name, fn in list(services.registered_kernels.items()):
        wanted = getattr(fn, "substitute_in_graphs", None)
        if (name.split(".")[0] in SUBSTITUTABLE and name not in services.builtin_kernels
                and (wanted is None or wanted())):
            op = _overload(name)
            if op is not None:
                found[op] = fn
    return found


def _to_device(value: Any, index: int) -> Any:
    if isinstance(value, torch.Tensor) and value.device.type == "cpu":
        return adopt(value, index)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(v, index) for v in value)
    if isinstance(value, dict):
        return {key: _to_device(v, index) for key, v in value.items()}
    return value


def _to_host(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.device.type == "neuron":
        return host_alias(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(v) for v in value)
    return value


def _signature(value: Any) -> Any:
    """A hashable description of an op's arguments: what its meta function's output layouts depend on."""
    if isinstance(value, torch.Tensor):
        return tuple(value.shape), value.stride(), value.dtype
    if isinstance(value, (list, tuple)):
        return type(value).__name__, tuple(_signature(v) for v in value)
    if isinstance(value, dict):
        return tuple((key, _signature(v)) for key, v in value.items())
    return value


def _on_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    return value


_Layout = tuple[tuple[int, ...], tuple[int, ...]]


def _promised_layouts(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list[_Layout | None]:
    """The (sizes, strides) of each output of `op`'s meta function for these arguments (None: not a tensor)."""
    out = op(*pytree.tree_map(_on_meta, args), **pytree.tree_map(_on_meta, kwargs))
    return [(tuple(t.shape), t.stride()) if isinstance(t, torch.Tensor) else None for t in pytree.tree_leaves(out)]


def _same_layout(tensor: torch.Tensor, layout: _Layout) -> bool:
    """As Inductor's `assert_size_stride`: sizes equal, strides equal wherever the size is not 1."""
    sizes, strides = layout
    return tuple(tensor.shape) == sizes and all(
        size == 1 or have == want for size, have, want in zip(sizes, tensor.stride(), strides)
    )


def _restride(outputs: Any, layouts: list[_Layout | None]) -> Any:
    """`outputs` with every tensor in its promised layout (copied only where it differs)."""
    leaves, spec = pytree.tree_flatten(outputs)
    if len(leaves) != len(layouts):
        raise RuntimeError(f"a substituted Neuron kernel returned {len(leaves)} values where its op returns "
                           f"{len(layouts)}")
    fixed = []
    for value, layout in zip(leaves, layouts):
        if isinstance(value, torch.Tensor) and layout is not None and not _same_layout(value, layout):
            value = torch.empty_strided(layout[0], layout[1], dtype=value.dtype).copy_(value)
        fixed.append(value)
    return pytree.tree_unflatten(fixed, spec)


def _replacement(op: torch._ops.OpOverload, kernel: Callable) -> torch._ops.OpOverload:
    """The `neuron_compile::nki_*` op standing for `op` in compiled graphs (defined once per op)."""
    with _lock:
        found = _replacements.get(op)
        if found is not None:
            return found
        schema = op._schema
        base = schema.name.split("::")[1]
        new_name = f"nki_{base}" + (f"_{schema.overload_name}" if schema.overload_name else "")
        _library.define(new_name + "(" + str(schema).split("(", 1)[1], tags=(torch.Tag.needs_exact_strides,))
        kernel_name = f"{schema.name}" + (f".{schema.overload_name}" if schema.overload_name else "")

        layouts: dict[tuple, list[_Layout | None]] = {}

        def run_on_device(*args: Any, **kwargs: Any) -> Any:
            index = torch.neuron.current_device()
            substituted_calls[kernel_name] = substituted_calls.get(kernel_name, 0) + 1
            signature = _signature((args, kwargs))
            promised = layouts.get(signature)
            if promised is None:
                promised = layouts[signature] = _promised_layouts(op, args, kwargs)
            outputs = _to_host(kernel(*_to_device(args, index), **_to_device(dict(kwargs), index)))
            return _restride(outputs, promised)

        def meta(*args: Any, **kwargs: Any) -> Any:
            return op(*args, **kwargs)

        _library.impl(new_name, run_on_device, "CPU")
        torch.library.register_fake(f"neuron_compile::{new_name}", meta, lib=_library)
        found = _replacements[op] = getattr(torch.ops.neuron_compile, new_name).default
        return found


def define_replacements() -> None:
    """Define the `neuron_compile::nki_*` op of every substitutable op with a registered kernel: code Inductor or
    AOTAutograd load from their caches (without running the substitution in this process) calls them by name."""
    for op, kernel in substitutable_ops().items():
        _replacement(op, kernel)


def _traced_inputs(node: torch.fx.Node) -> tuple[tuple, dict]:
    """`node`'s (args, kwargs) as the fake values they were traced with (None where not a node), as tracing records
    them in `eager_input_vals` for ops that need exact strides: Inductor then gives the op inputs of those strides."""

    def traced(value: Any) -> Any:
        return value.meta.get("val") if isinstance(value, torch.fx.Node) else None

    return torch.fx.node.map_aggregate((node.args, node.kwargs), traced)


def substitute(gm: torch.fx.GraphModule) -> int:
    """Retarget every node of a substitutable op with a registered kernel; return how many were substituted."""
    kernels = substitutable_ops()
    if not kernels:
        return 0
    count = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in kernels:
            node.target = _replacement(node.target, kernels[node.target])
            node.meta["eager_input_vals"] = _traced_inputs(node)
            count += 1
    if count:
        gm.recompile()
    return count
