"""What Inductor's generated code for a `neuron` graph calls at run time: the host side of "device memory is host
memory".

A compiled `neuron` graph runs entirely on zero-copy host aliases of its inputs, so every C++ kernel, extern kernel
(mm, conv) and intermediate buffer is a plain CPU one: no per-op Python, no per-op dispatch through the device.
Only the graph's boundary touches the device: inputs are aliased once on entry, and each output becomes a `neuron`
tensor on exit (adopted and charged to the device allocator, or, if it lies in an input's memory, the same view
of that input). An output is adopted as made by its graph node, at the node's source line (`output_sources`): what
an out-of-memory in a plan names, not this module.

A training forward on plain tensors (`charge_results`) also returns, after the caller's outputs, the activations
AOTAutograd saves for the backward as host tensors: they are device memory too (the real runtime's graph writes
them to HBM, where they stay until the backward consumes them), so each fresh buffer the graph returns is charged
when the graph returns it, for as long as its host storage lives; an output adopted on the device shares that
charge (`services.adopt_charged`), so a buffer both returned and saved counts once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.symbolic_shapes import statically_known_true, sym_eq
from torch.fx.passes import reinplace

from neuron_device import services
from neuron_device.services import host_alias

__all__ = ["OutputSource", "charge_results", "device_index", "output_sources", "to_device", "to_host"]

OutputSource = tuple[str, str | None] | None  # (op, stack trace) of the node that makes an output


def _op_name(node: torch.fx.Node) -> str:
    """The op the user called for `node` (an AOT graph's decomposed op by the one traced, `original_aten`)."""
    if node.op == "call_function":
        target = node.meta.get("original_aten", node.target)
        return str(target) if isinstance(target, torch._ops.OpOverload) else torch.fx.node._get_qualified_name(target)
    return f"Tensor.{node.target}" if node.op == "call_method" else str(node.target)


def _same_layout(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    """Whether `a` and `b` have one layout, without a guard: comparing symbolic sizes with `==` records one in the
    graph's ShapeEnv, on symbols with no source (Dynamo then fails to build its guards)."""
    x, y = a.meta.get("val"), b.meta.get("val")
    return (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype
            and statically_known_true(sym_eq(x.shape, y.shape)) and statically_known_true(sym_eq(x.stride(), y.stride())))


def _allocated_by(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose buffer `node`'s result is: back through ops that may run in place on their first argument
    (torch's reinplacing rule, `torch.fx.passes.reinplace`: the op has an in-place variant, the argument is this op's
    alone and of its layout) to the op that allocated it. An AOT graph is functional: a cache made in the graph and
    updated there (`cache.index_copy_(...)`) is an `index_put` of a `zeros`, and the cache's allocation the `zeros`."""
    while node.args and isinstance(base := node.args[0], torch.fx.Node) and base.op == "call_function" \
            and len(base.users) == 1 and reinplace._maybe_get_inplace_op(node.target) is not None \
            and _same_layout(base, node):
        node = base
    return node


def output_sources(gm: torch.fx.GraphModule) -> list[OutputSource]:
    """For each output of `gm`, the op of the node that allocates it (`_allocated_by`) and the node's stack trace
    (the user's code, innermost frame last; Inductor reads the same for its CUDA graphs' messages,
    `output_stack_traces`); None for an output that is no node's result (an input, a constant)."""
    sources: list[OutputSource] = []
    for arg in gm.graph.output_node().args[0]:
        if isinstance(arg, torch.fx.Node) and arg.op != "placeholder":
            node = _allocated_by(arg)
            sources.append((_op_name(node), node.stack_trace))
        else:
            sources.append(None)
    return sources

_NEURON = "neuron"


def to_host(inputs: Sequence[Any]) -> list[Any]:
    """Host aliases of the `neuron` tensors among `inputs` (everything else unchanged)."""
    return [host_alias(v) if isinstance(v, torch.Tensor) and v.device.type == _NEURON else v for v in inputs]


def device_index(inputs: Sequence[Any]) -> int:
    """The device of a graph's first `neuron` input (else the current device)."""
    for value in inputs:
        if isinstance(value, torch.Tensor) and value.device.type == _NEURON:
            return value.device.index
    return torch.neuron.current_device()


def _storage_key(tensor: torch.Tensor) -> int:
    """Which memory `tensor` views: its storage's address, or for a fake (plan mode: no memory) its storage."""
    storage = tensor.untyped_storage()
    return storage._cdata if isinstance(tensor, FakeTensor) else storage.data_ptr()


def _view_of(output: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """The `neuron` view of `base`'s storage at the memory, sizes and strides of the host tensor `output`."""
    storage = base.untyped_storage()
    if isinstance(output, FakeTensor):  # a fake's host alias has its offset in a storage of the same size
        offset = output.storage_offset()
    else:
        offset = (output.data_ptr() - storage.data_ptr()) // output.element_size()
    view = torch.empty(0, dtype=output.dtype, device=base.device)
    return view.set_(storage, offset, output.size(), output.stride())


def _whole_storage(output: torch.Tensor, index: int) -> torch.Tensor:
    """A `neuron` uint8 tensor adopting all of `output`'s host storage, to build several views of it."""
    return services.adopt_charged(torch.empty(0, dtype=torch.uint8).set_(output.untyped_storage()), index)


def charge_results(outputs: Sequence[Any], inputs: Sequence[Any]) -> None:
    """Charge to the device each fresh host buffer among a graph's `outputs` (not in the memory of one of its host
    `inputs`, which is the device's already), once per storage, for as long as that storage lives."""
    inputs_memory = {_storage_key(v) for v in inputs if isinstance(v, torch.Tensor)}
    index = services.host_code_device()  # set by the compiled graph running it
    if index is None:
        index = device_index(inputs)
    for output in outputs:
        if (isinstance(output, torch.Tensor) and output.device.type == "cpu"
                and _storage_key(output) not in inputs_memory):
            services.track_storage(output.untyped_storage(), index)


def _made_by(source: OutputSource) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext() if source is None else services.allocating_from(*source)


def to_device(outputs: Sequence[Any], inputs: Sequence[Any], hosts: Sequence[Any],
              sources: Sequence[OutputSource] | None = None) -> tuple[Any, ...]:
    """Turn the host outputs of a compiled graph into `neuron` tensors.

    `inputs` are the graph's original arguments and `hosts` what `to_host` made of them. An output that is an input
    alias (or a view of one) maps back to that input's memory; a fresh buffer is adopted and charged to the device
    (or shares `charge_results`' charge of it), once per storage, so outputs sharing a buffer stay views of one
    device storage. `sources`: each output's (`output_sources`), under which its buffer is adopted.
    """
    bases: dict[int, torch.Tensor] = {}
    for original, host in zip(inputs, hosts):
        if host is not original and host.untyped_storage().nbytes():
            bases[_storage_key(host)] = original
    fresh: dict[int, int] = {}  # storage -> how many outputs use it
    for output in outputs:
        if isinstance(output, torch.Tensor) and output.device.type == "cpu":
            pointer = _storage_key(output)
            if pointer not in bases:
                fresh[pointer] = fresh.get(pointer, 0) + 1
    index = device_index(inputs)
    result = []
    for position, output in enumerate(outputs):
        if not isinstance(output, torch.Tensor) or output.device.type != "cpu":
            result.append(output)
            continue
        pointer = _storage_key(output)
        base = bases.get(pointer)
        if base is None:
            with _made_by(sources[position] if sources is not None else None):
                if fresh[pointer] == 1:
                    result.append(services.adopt_charged(output, index))
                    continue
                base = bases[pointer] = _whole_storage(output, index)
        result.append(_view_of(output, base))
    return tuple(result)
