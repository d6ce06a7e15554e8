"""The one place where kernels join the dispatcher for the `neuron` (PrivateUse1) key.

Kernels are plain functions declared with `@kernel("aten::op.overload")`. Registration lifetime follows the
`torch.library.Library` objects, so they live here, in module globals, for the life of the process. Other wheels
contribute kernels through the plugin hook `neuron_register(registry)`, which hands them this module's `register`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["kernel", "kernels", "register", "register_fallback"]

_DISPATCH_KEY = "PrivateUse1"
_libraries: dict[str, torch.library.Library] = {}
_fallback_library: torch.library.Library | None = None
kernels: dict[str, Callable] = {}  # "aten::add.Tensor" -> kernel, for every op with a direct neuron kernel


def _library(namespace: str) -> torch.library.Library:
    library = _libraries.get(namespace)
    if library is None:
        library = _libraries[namespace] = torch.library.Library(namespace, "IMPL")
    return library


def register(name: str, fn: Callable, *, with_keyset: bool = False) -> None:
    """Register `fn` as the `neuron` kernel of op `name` ("namespace::op.overload")."""
    namespace, _, op = name.partition("::")
    if not op:
        raise ValueError(f"op name {name!r} must be qualified as 'namespace::op[.overload]'")
    _library(namespace).impl(op, fn, _DISPATCH_KEY, with_keyset=with_keyset)
    kernels[name] = fn


def kernel(*names: str, with_keyset: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: register the function as the `neuron` kernel of each op in `names`."""

    def decorate(fn: Callable) -> Callable:
        for name in names:
            register(name, fn, with_keyset=with_keyset)
        return fn

    return decorate


def register_fallback(fn: Callable) -> None:
    """Install the boxed fallback for every op without a direct kernel (only one per process is possible)."""
    global _fallback_library
    if _fallback_library is not None:
        raise RuntimeError("the neuron fallback is already registered")
    library = torch.library.Library("_", "IMPL")
    library.fallback(fn, _DISPATCH_KEY)
    _fallback_library = library
