"""Substitute Neuron kernels (NKI attention, norms) for the ops they implement inside compiled graphs.

A kernel reaches us the way every kernel joins the device: a `neuron_device.plugins` plugin (neuron-nki, or a
user's package) calls `registry.register("aten::op.overload", fn)` in its `neuron_register` hook, which makes `fn`
the op's eager `neuron` kernel. For the ops in `SUBSTITUTABLE` (attention and norms) that have such a kernel,
compilation keeps the op whole (it is left out of the decomposition table) and this pass retargets its node to a
`neuron_compile::nki_<op>` custom op with the same schema. Inductor cannot lower that op, so it calls it as one
extern kernel, whose host implementation runs the registered kernel on `neuron` views of the host buffers. Without
any registered kernel (neuron-nki not installed) nothing is substituted and the graph is compiled as usual.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from neuron_device.hostmem import adopt, host_alias
from neuron_device.ops import registry as _registry

__all__ = ["SUBSTITUTABLE", "substitutable_ops", "substitute", "substituted_calls"]

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
    """The substitutable ops that have a registered `neuron` kernel, with that kernel."""
    found = {}
    for name, fn in list(_registry.kernels.items()):
        if name.split(".")[0] in SUBSTITUTABLE:
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


def _replacement(op: torch._ops.OpOverload, kernel: Callable) -> torch._ops.OpOverload:
    """The `neuron_compile::nki_*` op standing for `op` in compiled graphs (defined once per op)."""
    with _lock:
        found = _replacements.get(op)
        if found is not None:
            return found
        schema = op._schema
        base = schema.name.split("::")[1]
        new_name = f"nki_{base}" + (f"_{schema.overload_name}" if schema.overload_name else "")
        _library.define(new_name + "(" + str(schema).split("(", 1)[1])
        kernel_name = f"{schema.name}" + (f".{schema.overload_name}" if schema.overload_name else "")

        def run_on_device(*args: Any, **kwargs: Any) -> Any:
            index = torch.neuron.current_device()
            substituted_calls[kernel_name] = substituted_calls.get(kernel_name, 0) + 1
            return _to_host(kernel(*_to_device(args, index), **_to_device(dict(kwargs), index)))

        def meta(*args: Any, **kwargs: Any) -> Any:
            return op(*args, **kwargs)

        _library.impl(new_name, run_on_device, "CPU")
        torch.library.register_fake(f"neuron_compile::{new_name}", meta, lib=_library)
        found = _replacements[op] = getattr(torch.ops.neuron_compile, new_name).default
        return found


def substitute(gm: torch.fx.GraphModule) -> int:
    """Retarget every node of a substitutable op with a registered kernel; return how many were substituted."""
    kernels = substitutable_ops()
    if not kernels:
        return 0
    count = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in kernels:
            node.target = _replacement(node.target, kernels[node.target])
            count += 1
    if count:
        gm.recompile()
    return count
