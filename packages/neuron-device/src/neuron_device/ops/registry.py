"""The one place where kernels join the dispatcher for the `neuron` (PrivateUse1) key.

Kernels are plain functions declared with `@kernel("aten::op.overload")`. Registration lifetime follows the
`torch.library.Library` objects, so they live here, in module globals, for the life of the process. Other wheels
contribute kernels through the plugin hook `neuron_register(registry)`, which hands them this module's `register`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["builtin", "composite", "kernel", "kernels", "plugin_estimator", "register", "register_fallback"]

_DISPATCH_KEY = "PrivateUse1"
_libraries: dict[str, torch.library.Library] = {}
_fallback_libraries: dict[str, torch.library.Library] = {}
kernels: dict[str, Callable] = {}  # "aten::add.Tensor" -> kernel, for every op with a direct neuron kernel
# Ops whose kernel is neuron-device's own (the CPU kernel on host aliases), not one a plugin or a user registered:
# neuron-compile substitutes only the latter in compiled graphs.
builtin: set[str] = set()
# Direct kernels made of other ops on the same `neuron` tensors, which charge the device (each its own launch): the
# kernel itself charges nothing, so plan mode runs it whole too (as SDPA's fused op, which runs the flash kernel).
composite: set[str] = set()


def plugin_estimator(name: str) -> Callable | None:
    """The `estimate_seconds` of the kernel a plugin registered for op `name` (it prices its own calls, e.g. an NKI
    kernel's simulated latency), or None: neuron-device's own kernels are priced by the cost model."""
    if name in builtin:
        return None
    return getattr(kernels.get(name), "estimate_seconds", None)


def _library(namespace: str) -> torch.library.Library:
    library = _libraries.get(namespace)
    if library is None:
        library = _libraries[namespace] = torch.library.Library(namespace, "IMPL")
    return library


_AUTOGRAD_KEY = "AutogradPrivateUse1"


def register(name: str, fn: Callable, *, with_keyset: bool = False, dispatch_key: str = _DISPATCH_KEY,
             is_composite: bool = False) -> None:
    """Register `fn` as the `neuron` kernel of op `name` ("namespace::op.overload"); `is_composite`: it is made of
    other ops on `neuron` tensors (`composite`).

    `dispatch_key="AutogradPrivateUse1"` registers above autograd instead: how a composite op is routed on `neuron`
    (e.g. `scaled_dot_product_attention` to the fused op that has a `neuron` kernel). Only direct kernels are listed
    in `kernels`.
    """
    namespace, _, op = name.partition("::")
    if not op:
        raise ValueError(f"op name {name!r} must be qualified as 'namespace::op[.overload]'")
    if dispatch_key not in (_DISPATCH_KEY, _AUTOGRAD_KEY):
        raise ValueError(f"dispatch_key must be {_DISPATCH_KEY!r} or {_AUTOGRAD_KEY!r}, got {dispatch_key!r}")
    _library(namespace).impl(op, fn, dispatch_key, with_keyset=with_keyset)
    if dispatch_key == _DISPATCH_KEY:
        kernels[name] = fn
        builtin.discard(name)
        if is_composite:
            composite.add(name)
        else:
            composite.discard(name)


def kernel(*names: str, with_keyset: bool = False, dispatch_key: str = _DISPATCH_KEY,
           is_composite: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: register the function as the `neuron` kernel of each op in `names` (see `register`)."""

    def decorate(fn: Callable) -> Callable:
        for name in names:
            register(name, fn, with_keyset=with_keyset, dispatch_key=dispatch_key, is_composite=is_composite)
        return fn

    return decorate


def register_fallback(fn: Callable, dispatch_key: str = _DISPATCH_KEY) -> None:
    """Install the boxed fallback for every op without a direct kernel for `dispatch_key` (one per key and process)."""
    if dispatch_key in _fallback_libraries:
        raise RuntimeError(f"the neuron fallback for {dispatch_key} is already registered")
    library = torch.library.Library("_", "IMPL")
    library.fallback(fn, dispatch_key)
    _fallback_libraries[dispatch_key] = library
