"""Random ops on `neuron`: each draws from its device's generator (`neuron/random`), never the CPU's default one.

A random op reaches the host in one of these forms, chosen per overload from its record (`ops.call`):

* it takes a `Generator?` argument: the device's generator is filled in where the caller passed None;
* its packet has an overload that takes one (`rand.default` -> `rand.generator`): that overload runs instead;
* its CPU kernel takes no generator (`native_dropout`, dropout in training): a step-by-step form taking one
  (`WITH_GENERATOR`), bitwise the CPU kernel's numbers;
* its CPU kernel draws nothing (`DRAW_NOTHING_ON_CPU`), or it is called with `dropout_p == 0`: it runs as is.

An op with none of these raises rather than borrow the CPU's generator (no CPU kernel of torch 2.13 is such an op: a
test checks it). The boxed fallback runs random ops through `on_device_generator`; compiled graphs through
`seeded_call` (neuron-compile's `rng`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..neuron import random as _random
from .call import OverloadRecord, overload_record, records

__all__ = ["DRAW_NOTHING_ON_CPU", "WITH_GENERATOR", "on_device_generator", "seeded_call"]


def _native_dropout(generator: torch.Generator, input: torch.Tensor, p: float, train: bool | None):
    """The CPU's `native_dropout` (aten/src/ATen/native/Dropout.cpp, step by step, so the numbers are bitwise the
    CPU's), drawing its mask from `generator`."""
    if input.numel() == 0:
        return input, torch.empty_like(input)
    if train is False:
        return input.clone(), torch.ones_like(input, dtype=torch.bool)
    keep = 1.0 - p
    mask = torch.empty_like(input, dtype=torch.bool).bernoulli_(keep, generator=generator)
    return torch.ops.aten.mul_.Scalar(input.mul(mask), 0.0 if keep == 0 else 1.0 / keep), mask


# Random ops whose CPU kernel takes no generator, done with an explicit one (the common one: dropout in training).
WITH_GENERATOR: dict[str, Callable] = {"aten::native_dropout": _native_dropout}
# Seeded ops whose CPU kernel draws no random numbers at all: the CPU flash-attention kernel refuses
# `dropout_p > 0` ("Currently do not support dropout > 0"), and the SDPA backend choice only returns a number.
DRAW_NOTHING_ON_CPU = frozenset({"aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_fused_sdp_choice"})


def seeded_call(op: torch._ops.OpOverload, index: int, args: tuple, kwargs: dict):
    """Run the random op `op` on the generator of device `index`, on host tensors, leaving the CPU's default
    generator alone.

    The op draws from the device's generator explicitly: through its generator argument (filled in when None), the
    overload of its packet that takes one, or a step-by-step form taking one (`WITH_GENERATOR`). Threads draw from
    the device's stream one at a time (the generator's own lock), so each gets numbers of its own, and a CPU thread's
    `torch.rand` never sees the device's state.
    """
    generator = _random.default_generator(index)
    name = _op_name(op)
    with_generator = WITH_GENERATOR.get(name)
    if with_generator is not None:
        return with_generator(generator, *args, **kwargs)
    # the record's `generator_form`; None for a function with no schema
    form = None if name is None else (records.get(op._op) or overload_record(op)).generator_form
    if form is not None:
        overload, argument, position = form
        if overload is op and position < len(args):
            if args[position] is None:
                args = (*args[:position], generator, *args[position + 1 :])
        elif kwargs.get(argument) is None:
            kwargs = {**kwargs, argument: generator}
        return overload(*args, **kwargs)
    if name in DRAW_NOTHING_ON_CPU:
        return op(*args, **kwargs)
    raise NotImplementedError(
        f"{name} draws random numbers but has no form taking a generator, so neuron cannot run it on the device's "
        "generator without borrowing the CPU's default generator (which other threads may be using)"
    )


def _op_name(op: Callable) -> str | None:
    schema = getattr(op, "_schema", None)  # an OpOverload; None for a decomposition's function
    if schema is None:
        return None
    return schema.name + (f".{schema.overload_name}" if schema.overload_name else "")


def _no_dropout(overload: OverloadRecord, args: tuple, kwargs: dict) -> bool:
    """A seeded op called with `dropout_p == 0` (attention in eval mode) draws no random numbers."""
    position = overload.dropout_position
    if position is None:
        return False
    return (args[position] if position < len(args) else kwargs.get("dropout_p", 0.0)) == 0.0


def on_device_generator(overload: OverloadRecord, index: int, args: tuple,
                        kwargs: dict) -> tuple[Callable, tuple, dict]:
    """What the host runs for one call of `overload`'s op on device `index`, with its (host) arguments: the op
    itself (or its decomposition), its `Generator?` argument filled with the device's generator when the caller
    passed None, or for a random op without one its form on the device's generator (`seeded_call`)."""
    if overload.generator is not None:
        position, name = overload.generator
        if position < len(args):
            if args[position] is None:
                args = (*args[:position], _random.default_generator(index), *args[position + 1 :])
        elif kwargs.get(name) is None:
            kwargs[name] = _random.default_generator(index)
        return overload.host_call, args, kwargs
    if overload.seeded and not _no_dropout(overload, args, kwargs):
        op = overload.op

        def run(*a, **k):
            return seeded_call(op, index, a, k)

        return run, args, kwargs
    return overload.host_call, args, kwargs
