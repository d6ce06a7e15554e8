"""The device/host boundary of a compiled graph: `neuron` arguments become zero-copy host aliases on entry, host
results become `neuron` tensors on exit, and gradients cross the same boundary the other way.

A compiled graph is compiled and run as a host graph (see `compiler`), so only its inputs and outputs touch the
device. With autograd recording, the crossings are autograd functions: the backward of "to host" adopts the host
gradient as a `neuron` gradient, the backward of "to device" aliases the `neuron` gradient to the host. Nothing is
copied either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from neuron_device import services
from neuron_device.services import host_alias

from .host_runtime import OutputSource
from .host_runtime import to_device as _outputs_to_device

__all__ = ["enter", "leave"]

_NEURON = "neuron"


def _adopt_grad(grad: torch.Tensor | None, index: int) -> torch.Tensor | None:
    if grad is None or grad.device.type != "cpu":
        return grad
    return services.adopt_tracked(grad if grad.is_contiguous() else grad.contiguous(), index)


def _alias_grad(grad: torch.Tensor | None) -> torch.Tensor | None:
    if grad is None or grad.device.type != _NEURON:
        return grad
    return host_alias(grad)


class _ToHost(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # An input the graph's result does not depend on differentiably (only through `topk` indices, say) gets no
        # gradient, as in eager mode: not a materialised zero gradient.
        ctx.set_materialize_grads(False)
        ctx.indices = [t.device.index for t in tensors]
        # Detached: a view made inside a Function with several outputs may not be modified in place with grad
        # mode on, and the graph's input-mutation epilogue does exactly that to an input it mutates (see `_Mutated`)
        hosts = tuple(host_alias(t).detach() for t in tensors)
        ctx.mark_non_differentiable(*[h for h, t in zip(hosts, tensors) if not t.requires_grad])
        return hosts

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        return tuple(_adopt_grad(g, i) for g, i in zip(grads, ctx.indices))


class _ToDevice(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, inputs: tuple, hosts: tuple, sources: list | None,
                *outputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        results = _outputs_to_device(outputs, inputs, hosts, sources)
        ctx.mark_non_differentiable(*[r for r, o in zip(results, outputs) if not o.requires_grad])
        return results

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
        return (None, None, None, *(_alias_grad(g) for g in grads))


class _Mutated(torch.autograd.Function):
    """A `neuron` argument whose host alias the graph mutated in place with autograd recording (AOTAutograd's
    epilogue copies the new value into it, as Longformer's `key_vectors_only_global[mask] = key_vectors[...]`): the
    data changed through the shared memory, and this gives the argument the alias's new history, as the in-place op
    gives it in eager mode. The whole old value was overwritten (its part in the new value is in the alias's
    history), so the old history gets no gradient here."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, host: torch.Tensor) -> torch.Tensor:
        ctx.mark_dirty(tensor)
        return tensor

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor | None) -> tuple[None, torch.Tensor | None]:
        return None, _alias_grad(grad)


def _recording(tensors: Sequence[Any]) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def enter(args: Sequence[Any]) -> list[Any]:
    """Host aliases of the `neuron` tensors among `args` (differentiable when autograd records)."""
    positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.device.type == _NEURON]
    hosts = list(args)
    if not positions:
        return hosts
    tensors = [args[i] for i in positions]
    aliases = _ToHost.apply(*tensors) if _recording(tensors) else [host_alias(t) for t in tensors]
    for position, alias in zip(positions, aliases):
        hosts[position] = alias
    return hosts


def leave(outputs: Any, args: Sequence[Any], hosts: Sequence[Any],
          sources: Sequence[OutputSource] | None = None) -> Any:
    """`neuron` tensors for the host `outputs` of a compiled graph called with `args` (aliased as `hosts`); an
    argument the graph mutated with autograd recording takes its alias's history. `sources`: each output's node
    (`host_runtime.output_sources`)."""
    for arg, host in zip(args, hosts):
        if host is not arg and host.grad_fn is not None and not isinstance(host.grad_fn, _ToHost._backward_cls):
            _Mutated.apply(arg, host)
    single = not isinstance(outputs, (list, tuple))
    items = (outputs,) if single else tuple(outputs)
    positions = [i for i, o in enumerate(items) if isinstance(o, torch.Tensor) and o.device.type == "cpu"]
    if not positions:
        return outputs
    tensors = [items[i] for i in positions]
    made_by = [sources[i] for i in positions] if sources is not None and len(sources) == len(items) else None
    if _recording(tensors):
        converted = _ToDevice.apply(tuple(args), tuple(hosts), made_by, *tensors)
    else:
        converted = _outputs_to_device(tensors, args, hosts, made_by)
    result = list(items)
    for position, value in zip(positions, converted):
        result[position] = value
    if single:
        return result[0]
    return type(outputs)(result) if isinstance(outputs, tuple) else result
