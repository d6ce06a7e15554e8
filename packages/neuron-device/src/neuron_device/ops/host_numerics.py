"""How the host runs what the numerics policy (`numerics`) asks: 64-bit ops in 32 bits, float32 matmuls in IEEE.

* **64-bit types in 32 bits** (`run_downcast`, with `TORCH_NEURONX_DOWNCAST_64BIT=1` or
  `torch.neuron.set_downcast_64bit(True)`): the boxed fallback runs an op on 32-bit copies of its 64-bit `neuron`
  inputs and gives the results back in their own dtypes, as a NeuronCore computes 64-bit types internally.
* **IEEE float32 host matmuls** (`ieee_host_matmul`): the host kernels run with oneDNN's float32 matmul precision
  forced to IEEE while a neuron matmul computes: with `set_float32_matmul_precision("medium")` the CPU would
  otherwise round to bfloat16 itself (on hosts with AMX/AVX512 bf16), in its own accumulation order, and neuron
  results would depend on the host.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from .. import allocator
from ..storage import host_alias
from .call import OverloadRecord

__all__ = ["ieee_host_matmul", "run_downcast"]


_ieee_lock = threading.Lock()
_ieee_users = 0
_ieee_saved: str | None = None


class _IEEEHostMatmul:
    """`ieee_host_matmul`'s context manager: a class, not a generator, as every adaptive eager flush enters one."""

    __slots__ = ("_counted",)

    def __enter__(self) -> None:
        global _ieee_users, _ieee_saved
        self._counted = _ieee_users or torch._C._get_fp32_precision_getter("mkldnn", "matmul") != "ieee"
        if not self._counted:
            return
        with _ieee_lock:
            if _ieee_users == 0:
                _ieee_saved = torch._C._get_fp32_precision_getter("mkldnn", "matmul")
                torch._C._set_fp32_precision_setter("mkldnn", "matmul", "ieee")
            _ieee_users += 1

    def __exit__(self, *exc: object) -> None:
        global _ieee_users
        if not self._counted:
            return
        with _ieee_lock:
            _ieee_users -= 1
            if _ieee_users == 0:
                torch._C._set_fp32_precision_setter("mkldnn", "matmul", _ieee_saved)


def ieee_host_matmul() -> _IEEEHostMatmul:
    """Run the block with the host's oneDNN float32 matmuls in IEEE float32 (restored when the last user leaves).

    The setting is process-wide in torch; while a neuron matmul computes, CPU matmuls of other threads also run in
    IEEE float32, which only makes them more precise.
    """
    return _IEEEHostMatmul()


# --- 64-bit types in 32 bits --------------------------------------------------------------------------------------

_WIDE = {torch.float64: torch.float32, torch.int64: torch.int32}


def _is_wide_neuron(value: object) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype in _WIDE and value.device.type == "neuron"


def _narrow_on_host(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`'s values in 32 bits, as a new `neuron` tensor: float64 -> float32, int64 -> int64 wrapped to int32."""
    host = host_alias(tensor).to(torch.float32) if tensor.dtype is torch.float64 else _wrapped(host_alias(tensor))
    return allocator.adopt_tracked(host, tensor.device.index)


def _wrapped(host: torch.Tensor) -> torch.Tensor:
    return host.to(torch.int32).to(torch.int64)


def _round_in_place(tensor: torch.Tensor) -> None:
    """Round a 64-bit `neuron` tensor's values to what 32 bits hold, in place."""
    host = host_alias(tensor)
    host.copy_(host.to(_WIDE[tensor.dtype]))


class _Downcast:
    """One op run with 64-bit inputs narrowed: remembers which arguments the op writes, to update them after."""

    def __init__(self) -> None:
        self.copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(float32 copy) -> (copy, float64 original)
        self.written_int64: list[torch.Tensor] = []
        self.had_float64 = False

    def narrow(self, value, written: bool):
        if isinstance(value, (list, tuple)):
            return type(value)(self.narrow(v, written) for v in value)
        if not _is_wide_neuron(value):
            return value
        if value.dtype is torch.int64:
            if not written:
                return _narrow_on_host(value)
            _round_in_place(value)  # about to be overwritten: it may as well hold the 32-bit view of its values
            self.written_int64.append(value)
            return value
        self.had_float64 = True
        narrowed = _narrow_on_host(value)
        if written:
            self.copies[id(narrowed)] = (narrowed, value)
        return narrowed

    def write_back(self) -> None:
        """Give written arguments the op's results in their own dtype (also for ops that return nothing)."""
        for copy, original in self.copies.values():
            if original.shape != copy.shape:
                original.resize_(copy.shape)
            host_alias(original).copy_(host_alias(copy))
        for tensor in self.written_int64:
            _round_in_place(tensor)

    def widen(self, value, restore_float64: bool):
        if isinstance(value, (list, tuple)):
            return type(value)(self.widen(v, restore_float64) for v in value)
        if not isinstance(value, torch.Tensor) or value.device.type != "neuron":
            return value
        entry = self.copies.get(id(value))
        if entry is not None:  # the float32 copy of a written float64 argument
            return entry[1]
        if value.dtype is torch.float32 and restore_float64:
            return allocator.adopt_tracked(host_alias(value).to(torch.float64), value.device.index)
        if value.dtype in _WIDE:
            _round_in_place(value)
        return value


def _explicit_dtype(overload: OverloadRecord, args: tuple, kwargs: dict) -> bool:
    position = overload.dtype_position
    if position is None:
        return False
    return kwargs.get("dtype") is not None or (position < len(args) and args[position] is not None)


def _has_wide(values) -> bool:
    return any(
        _is_wide_neuron(v) or (isinstance(v, (list, tuple)) and any(map(_is_wide_neuron, v))) for v in values
    )


def run_downcast(run: Callable, overload: OverloadRecord, args: tuple, kwargs: dict):
    """Run the op of `overload` (`ops.call`) through `run` (the host fallback, called with `overload` first) with
    64-bit `neuron` inputs computed in 32 bits.

    float64 inputs are computed as float32 and float32 results come back as float64 when an input was float64 and
    no explicit `dtype` decided the output type; int64 values wrap to int32 before and after (exactly int32
    arithmetic for +, -, *, bitwise ops, comparisons, sums and products). Written arguments (in-place, out=) are
    updated in their own dtype. View ops move no data and run unchanged.
    """
    if overload.returns_view:
        return run(overload, *args, **kwargs)
    call = _Downcast()
    if _has_wide((*args, *kwargs.values())):
        args_32 = tuple(call.narrow(a, i in overload.written_positions) for i, a in enumerate(args))
        kwargs_32 = {k: call.narrow(v, k in overload.written_names) for k, v in kwargs.items()}
        result = run(overload, *args_32, **kwargs_32)
        call.write_back()
    else:
        result = run(overload, *args, **kwargs)  # 64-bit results of 32-bit inputs (factories, int32 sums) narrow too
    return call.widen(result, call.had_float64 and not _explicit_dtype(overload, args, kwargs))
