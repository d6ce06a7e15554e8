"""Trace each repeated transformers decoder layer once while Dynamo traces for `neuron`.

Dynamo traces a decoder stack layer by layer: 80 times the same bytecode for a 70B Llama.
`torch.compiler.nested_compile_region` lets Dynamo trace a function once and stamp its subgraph out at later calls,
but only when every flattened input is a tensor, SymInt, constant or module and the first trace's guards hold with
their sources moved to the new call's arguments. A transformers decoder layer gets the model's whole `Cache` (no
such input) and picks its entry by `self.layer_idx` (a guarded constant that differs at every layer). So while
Dynamo traces for `neuron` (`active`, set by `_patches.while_tracing_for`), every `GradientCheckpointingLayer` call
(the base class of transformers' decoder layers) whose cache entry (`cache.layers[i]`, `i` the one `layer_idx` of
the layer's modules) is one of transformers' compileable (in-place, static) cache layers goes through
`_layer_region`, its inputs flat (`_flatten`: the call's and the entry's tensors and constants, and one string
coding the structure, the entry's class and attribute names). Inside, a fresh entry of the same class is rebuilt
from them and handed to the layer as `_LayerCache`, whose `update` is that entry's own `update` (transformers' code,
unchanged; the `layer_idx` the layer passes is never read, so it guards nothing). Attribute sets on the fresh entry
are no side effect outside the region; the in-place writes of its tensors are the region's input mutations. When
the entry is not yet allocated (a compiled prefill: `update` runs `lazy_initialization`), the region also returns
the key and value states `update` got and the tensors the rebuilt entry allocated; the real entry takes those
tensors and the attributes its own `lazy_initialization` sets on a copy given meta states (`_initialized`, run
outside the graph), so no op is added.

AOTAutograd traces each region once per pass and the compiler inlines the stamped subgraphs after it
(`aot_regions`; before AOTAutograd, `backend._inlined_regions`, when a region does not qualify or
`NEURON_COMPILE_AOT_REGIONS=0`): the Neuron passes and the host code get the graph an unmarked trace gives (the same
ops in the same order), so kernels and every simulated figure are the same; what is saved is Dynamo's and
AOTAutograd's trace of the repeated layers. Any other call (no
cache, a dynamic cache, another backend, eager) runs the layer as before.
"""

from __future__ import annotations

import copy
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from . import envvars

__all__ = ["active", "install", "not_tracing", "tracing"]

_state = threading.local()
_CONSTANT_TYPES = (int, float, bool, str, type(None), torch.dtype, torch.device)


@contextmanager
def tracing() -> Iterator[None]:
    """Dynamo traces a frame for `neuron`: regions on unless `NEURON_COMPILE_LAYER_REGIONS=0`."""
    previous = getattr(_state, "on", False)
    _state.on = envvars.LAYER_REGIONS.read()
    if _state.on:
        install()
    try:
        yield
    finally:
        _state.on = previous


@contextmanager
def not_tracing() -> Iterator[None]:
    """Dynamo traces a frame for another backend."""
    previous = getattr(_state, "on", False)
    _state.on = False
    try:
        yield
    finally:
        _state.on = previous


@torch._dynamo.assume_constant_result
def active() -> bool:
    """Whether Dynamo is tracing for `neuron`: a constant of the trace without a guard (the compiled code never
    calls it; an eager call gets False)."""
    return getattr(_state, "on", False)


class _LayerCache:
    """What the layer gets as its cache: `Cache.update` for the one entry the region was given (the `layer_idx`
    the layer passes is the one that picked the entry). The states of the first update are kept for the real
    entry's `lazy_initialization`."""

    def __init__(self, entry: Any) -> None:
        self.entry = entry
        self.states: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if self.states is None:
            self.states = (key_states, value_states)
        return self.entry.update(key_states, value_states, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the per-layer cache of a neuron layer region has no '{name}' (only `update`); "
                             "set NEURON_COMPILE_LAYER_REGIONS=0 to trace this model's layers without regions")


def _tensors(entry: Any) -> dict[str, torch.Tensor]:
    attributes = vars(entry)
    return {name: attributes[name] for name in sorted(attributes) if isinstance(attributes[name], torch.Tensor)}


def _flatten(value: Any, leaves: list) -> str | None:
    """`value`'s structure as a code (T a tensor, C a constant, (...) a tuple, [...] a list), its leaves appended
    to `leaves`; None if it holds anything else. Dynamo's own flatten of a region's inputs (pytree, traced) costs
    about what the layer's trace saves; a call with only tensors and constants as arguments skips it. Written with
    plain loops: Dynamo traces this at every layer, and each comprehension is a frame it inlines."""
    if isinstance(value, torch.Tensor):
        leaves.append(value)
        return "T"
    if isinstance(value, _CONSTANT_TYPES):
        leaves.append(value)
        return "C"
    if not isinstance(value, (tuple, list)):
        return None
    codes = ""
    for item in value:
        code = _flatten(item, leaves)
        if code is None:
            return None
        codes += code
    return "(" + codes + ")" if isinstance(value, tuple) else "[" + codes + "]"


def _unflatten(code: str, at: int, leaves: tuple, used: int) -> tuple[Any, int, int]:
    """The value `_flatten` coded from `code[at:]` and `leaves[used:]`: (value, next code index, next leaf)."""
    if code[at] in "TC":
        return leaves[used], at + 1, used + 1
    items = []
    at += 1
    while code[at] not in ")]":
        item, at, used = _unflatten(code, at, leaves, used)
        items.append(item)
    return (tuple(items) if code[at] == ")" else items), at + 1, used


@torch.compiler.nested_compile_region
def _layer_region(layer: nn.Module, spec: str, *leaves: Any) -> tuple[Any, ...]:
    """The layer's call with its cache entry rebuilt, from `spec` ("args|name=code;...|cache key|entry class|entry
    tensor names|entry constant names") and the leaves: (output, key and value states of the first update, tensors
    the entry allocated), or (output,) if it never updated."""
    args_code, kwargs_code, key, cls_name, tensor_names, constant_names = spec.split("|")
    args, _, used = _unflatten(args_code, 0, leaves, 0)
    kwargs = {}
    for item in kwargs_code.split(";") if kwargs_code else ():
        name, code = item.split("=")
        kwargs[name], _, used = _unflatten(code, 0, leaves, used)
    module, qualname = cls_name.split(":")
    cls = getattr(sys.modules[module], qualname)
    entry = cls.__new__(cls)
    given = {}
    for name in tensor_names.split(",") if tensor_names else ():
        given[name] = leaves[used]
        setattr(entry, name, leaves[used])
        used += 1
    for name in constant_names.split(",") if constant_names else ():
        setattr(entry, name, leaves[used])
        used += 1
    view = _LayerCache(entry)
    out = _layer_call(layer, *args, **kwargs, **{key: view})  # a tensor, or tuples of tensors and None
    if view.states is None:
        return (out,)
    new = [value for name, value in _tensors(entry).items() if given.get(name) is not value]
    return (out, *view.states, *new)


@torch._dynamo.assume_constant_result
def _initialized(entry: Any, key_shape: tuple[int, ...], key_dtype: torch.dtype, device: torch.device,
                 value_shape: tuple[int, ...], value_dtype: torch.dtype) -> tuple[tuple, tuple]:
    """What `entry.lazy_initialization` sets for key and value states of these shapes on `device`, run on a copy
    with meta states while Dynamo traces (no op in the graph; its `device` attributes given back as `device`):
    (the other attributes it sets, ((name, (shape, dtype)) of each tensor it allocates)), in the order the region
    returns the tensors it allocated."""
    probe = copy.copy(entry)
    probe.lazy_initialization(torch.empty(key_shape, dtype=key_dtype, device="meta"),
                              torch.empty(value_shape, dtype=value_dtype, device="meta"))
    before, after = vars(entry), vars(probe)
    meta = torch.device("meta")
    constants = tuple((name, device if value == meta else value) for name, value in sorted(after.items())
                      if not isinstance(value, torch.Tensor)
                      and (name not in before or before[name] is not value))
    allocated = tuple((name, (tuple(value.shape), value.dtype)) for name, value in sorted(after.items())
                      if isinstance(value, torch.Tensor) and before.get(name) is not value)
    return constants, allocated


def _layer_index(layer: nn.Module) -> int | None:
    """The cache index the layer's modules use (their one `layer_idx`), if they agree on one. A walk of `_modules`
    rather than `layer.modules()`, whose generators Dynamo traced at about 1,600 bytecodes a layer."""
    found = None
    pending = [layer]
    while pending:
        module = pending.pop()
        index = getattr(module, "layer_idx", None)
        if isinstance(index, int):
            if found is not None and index != found:
                return None
            found = index
        for child in module._modules.values():
            if child is not None:
                pending.append(child)
    return found


def _region_call(layer: nn.Module, args: tuple, kwargs: dict) -> Any:
    """The layer's call through `_layer_region`, or None when its arguments or cache are not ones a region takes."""
    from transformers.cache_utils import Cache

    key = None
    for name, value in kwargs.items():
        if isinstance(value, Cache):
            if key is not None:
                return None
            key = name
    index = _layer_index(layer)
    if key is None or index is None:
        return None
    cache = kwargs[key]
    if index >= len(cache.layers):
        return None
    entry = cache.layers[index]
    cls = type(entry)
    if not getattr(cls, "is_compileable", False):  # a growing cache replaces its tensors at every update
        return None
    if getattr(sys.modules.get(cls.__module__), cls.__qualname__, None) is not cls:
        return None
    leaves: list = []
    args_code = _flatten(args, leaves)
    if args_code is None:
        return None
    kwargs_code = ""
    for name, value in kwargs.items():
        if name != key:
            code = _flatten(value, leaves)
            if code is None:
                return None
            kwargs_code += (";" if kwargs_code else "") + name + "=" + code
    # the entry's attributes, sorted by name: its tensors, then its constants
    attributes = vars(entry)
    tensor_names, constant_names, constants = "", "", []
    for name in sorted(attributes):
        value = attributes[name]
        if isinstance(value, torch.Tensor):
            leaves.append(value)
            tensor_names += ("," if tensor_names else "") + name
        elif isinstance(value, _CONSTANT_TYPES):
            constants.append(value)
            constant_names += ("," if constant_names else "") + name
        else:
            return None
    leaves.extend(constants)
    spec = "|".join((args_code, kwargs_code, key, cls.__module__ + ":" + cls.__qualname__, tensor_names,
                     constant_names))
    outputs = _layer_region(layer, spec, *leaves)
    if len(outputs) > 1:
        new = outputs[3:]
        if entry.is_initialized:
            if new:
                raise RuntimeError(f"{cls.__name__}.update replaced its tensors: not a static cache layer")
        else:
            keys, values = outputs[1], outputs[2]
            constants, allocated = _initialized(entry, tuple(keys.shape), keys.dtype, keys.device,
                                                tuple(values.shape), values.dtype)
            if len(allocated) != len(new):
                raise RuntimeError(f"{cls.__name__}.lazy_initialization allocated {[name for name, _ in allocated]} "
                                   f"on a probe, {len(new)} tensors in the layer region")
            for (name, meta), value in zip(allocated, new):
                if meta != (tuple(value.shape), value.dtype):
                    raise RuntimeError(f"{cls.__name__}.{name}: {meta} allocated on a probe, "
                                       f"{(tuple(value.shape), value.dtype)} in the layer region")
                setattr(entry, name, value)
            for name, value in constants:
                setattr(entry, name, value)
    return outputs[0]


def _call(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """`GradientCheckpointingLayer.__call__`: through a region while Dynamo traces for `neuron`."""
    if active():
        out = _region_call(self, args, kwargs)
        if out is not None:
            return out
    return _layer_call(self, *args, **kwargs)


# The layers' own `__call__` before `install` (transformers 5: `nn.Module.__call__`; earlier versions define one that
# runs gradient checkpointing): every call still goes through it
_layer_call = nn.Module.__call__


def install() -> None:
    """Give transformers' decoder layers `_call` once transformers' layers are imported (idempotent)."""
    global _layer_call
    layers = sys.modules.get("transformers.modeling_layers")
    if layers is None or layers.GradientCheckpointingLayer.__dict__.get("__call__") is _call:
        return
    _layer_call = layers.GradientCheckpointingLayer.__call__
    layers.GradientCheckpointingLayer.__call__ = _call
