"""``nki_op`` (an NKI-backed ``torch.library`` custom op) and ``wrap_nki`` (a raw kernel call as one graph node).

``nki_op("ns::name", mutates_args=...)`` is ``torch.library.custom_op`` plus an automatic fake implementation: the
decorated function itself, run on fake tensors. Its allocations (``torch.empty_like``) are fake, and a kernel called
on fake tensors returns fake outputs whose shapes come from one simulation per signature (``adapter``), so no
hand-written meta function is needed. Training: ``op.register_autograd(backward, setup_context=...)``.

``wrap_nki(kernel)`` makes calling the kernel itself (no wrapper function) traceable: every call goes through the one
custom op ``nki::call(str key, Tensor[] tensors) -> Tensor[]``. The non-tensor arguments and the launch grid
are frozen into ``key`` at trace time (``torch._dynamo.assume_constant_result``), so under ``torch.compile`` the
call is a single node. The node is functional: tracing a kernel that writes its arguments raises (found by the
shape-inference run), such kernels belong in an ``nki_op`` that declares ``mutates_args``. (A mutable ``Tensor[]``
argument with ``Tensor[]`` outputs is rejected by functionalization in torch 2.13.)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .._launch import Kernel
from . import adapter

__all__ = ["WrappedKernel", "nki_op", "wrap_nki"]


def nki_op(name: str, fn: Callable | None = None, /, *, mutates_args: str | Iterable[str],
           device_types: str | Iterable[str] | None = None, schema: str | None = None) -> Any:
    """Define custom op ``name`` ("namespace::op") from a function that calls NKI kernels (type hints required,
    as for ``torch.library.custom_op``). Returns the ``CustomOpDef``: call it, ``register_autograd`` on it."""
    def define(f: Callable) -> Any:
        op = torch.library.custom_op(name, f, mutates_args=mutates_args, device_types=device_types, schema=schema)
        op.register_fake(f)
        return op

    return define(fn) if fn is not None else define


_SLOT = "__nki_tensor__"  # (_SLOT, i) stands for the i-th tensor argument in a frozen call structure
_kernels: dict[str, Kernel] = {}  # kernel id -> kernel (filled by wrap_nki, eagerly)
_calls: dict[str, tuple[Kernel, Any, Any, Any]] = {}  # key -> (kernel, grid, args structure, kwargs structure)
_out_structures: dict[str, Any] = {}
_ids = itertools.count()


def _freeze(values: Any, counter: list[int]) -> Any:
    if isinstance(values, torch.Tensor):
        counter[0] += 1
        return (_SLOT, counter[0] - 1)
    if isinstance(values, (list, tuple)):
        return tuple(_freeze(v, counter) for v in values)
    return values


def _thaw(structure: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(structure, tuple):
        if len(structure) == 2 and structure[0] == _SLOT:
            return tensors[structure[1]]
        return tuple(_thaw(v, tensors) for v in structure)
    return structure


@torch._dynamo.assume_constant_result
def _call_key(kernel_id: str, grid: Any, args: Any, kwargs: Any) -> str:
    """The ``nki::call`` key of one call structure (a string, so tracing treats the call as a constant)."""
    key = f"{kernel_id}|{(grid, args, kwargs)!r}"
    _calls.setdefault(key, (_kernels[kernel_id], grid, args, kwargs))
    return key


@torch._dynamo.assume_constant_result
def _out_structure(key: str) -> Any:
    return _out_structures[key]


def _outputs_to_list(out: Any, key: str) -> list[torch.Tensor]:
    _out_structures[key] = _freeze(out, [0])
    return adapter.tensors_in(out)


@torch.library.custom_op("nki::call", mutates_args=())
def _nki_call(key: str, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    kernel, grid, args, kwargs = _calls[key]
    out = adapter.launch(kernel, grid, _thaw(args, tensors), dict(_thaw(kwargs, tensors)))
    inputs = {t.untyped_storage().data_ptr() for t in tensors if t.numel()}
    flat = _outputs_to_list(out, key)
    # a custom op's outputs may not alias its inputs: a kernel that returns an argument gets a copy of it
    return [t.clone() if t.numel() and t.untyped_storage().data_ptr() in inputs else t for t in flat]


@_nki_call.register_fake
def _nki_call_fake(key: str, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    kernel, grid, args, kwargs = _calls[key]
    out = adapter.launch(kernel, grid, _thaw(args, tensors), dict(_thaw(kwargs, tensors)), allow_writes=False)
    return _outputs_to_list(out, key)


class WrappedKernel:
    """``wrap_nki(kernel)``: call like the kernel (``w[grid](...)`` too); each call is one ``nki::call`` node."""

    def __init__(self, kernel: Kernel, grid: Any = (), kernel_id: str | None = None) -> None:
        if not isinstance(kernel, Kernel):
            raise TypeError(f"wrap_nki expects an @nki.jit kernel, got {type(kernel).__name__}")
        self.kernel = kernel
        self.grid = grid
        self.kernel_id = kernel_id or f"{getattr(kernel.fn, '__qualname__', 'kernel')}#{next(_ids)}"
        _kernels[self.kernel_id] = kernel

    def __getitem__(self, grid: Any) -> WrappedKernel:
        return WrappedKernel(self.kernel, grid, self.kernel_id)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        counter = [0]
        frozen_args = _freeze(args, counter)
        frozen_kwargs = tuple(sorted((k, _freeze(v, counter)) for k, v in kwargs.items()))
        key = _call_key(self.kernel_id, self.grid, frozen_args, frozen_kwargs)
        flat = torch.ops.nki.call(key, adapter.tensors_in((args, kwargs)))
        return _thaw(_out_structure(key), flat)


def wrap_nki(kernel: Kernel) -> WrappedKernel:
    """Make a raw ``@nki.jit`` kernel call traceable as one node under ``torch.compile``."""
    return WrappedKernel(kernel)
