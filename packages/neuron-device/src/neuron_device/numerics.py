"""The numerics policy of `neuron`: where the simulator computes what a NeuronCore computes rather than what the CPU
computes. Everything else is bit-for-bit the host CPU kernel (see `docs/numerics.md`).

* **float32 matmuls follow `torch.set_float32_matmul_precision`.** "highest" (torch's default) computes in float32:
  exactly the CPU result. "high" and "medium" round the two matrix operands to bfloat16 (the TensorEngine's input
  type), accumulate in float32 and return float32; a bias, `self` of `addmm`/`baddbmm`/`addmv`, is added in float32
  unrounded. Emulated exactly: operands `.to(bfloat16).to(float32)`, then the float32 CPU kernel.
* **bfloat16/float16 matmuls accumulate in float32**: computed in float32 from the low-precision inputs (exact
  upcasts), rounded once to the input dtype. (The CPU's own low-precision kernels round partial results in places,
  e.g. `addbmm` per batch, so they are not used.)
* **64-bit types in 32 bits, on request.** NeuronCores operate on 32-bit types internally. By default the simulator
  computes float64/int64 exactly like the CPU; with `TORCH_NEURONX_DOWNCAST_64BIT=1` (or
  `torch.neuron.set_downcast_64bit(True)`) ops compute float64 as float32 and int64 as int32 (two's-complement
  wrap-around), and outputs keep their 64-bit dtypes.
* **fp8** (`float8_e4m3fn`, `float8_e5m2`) tensors move to and from `neuron` and cast like on CPU.

The host kernels run with oneDNN's float32 matmul precision forced to IEEE while a neuron matmul computes: with
`set_float32_matmul_precision("medium")` the CPU would otherwise round to bfloat16 itself (on hosts with AMX/AVX512
bf16), in its own accumulation order, and neuron results would depend on the host.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator

import torch

from . import allocator
from .hostmem import host_alias

__all__ = [
    "DOWNCAST_64BIT_ENV",
    "downcast_64bit",
    "fp32_matmul_rounds_to_bf16",
    "ieee_host_matmul",
    "is_downcast_64bit_enabled",
    "run_downcast",
    "set_downcast_64bit",
]

DOWNCAST_64BIT_ENV = "TORCH_NEURONX_DOWNCAST_64BIT"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def _env_flag(name: str) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}={os.environ[name]!r}: expected 1 or 0 (also accepted: true/false, yes/no, on/off)")


downcast_64bit: bool = _env_flag(DOWNCAST_64BIT_ENV)  # read on every fallback op: keep it a plain module global


def set_downcast_64bit(enabled: bool) -> None:
    """Compute float64 as float32 and int64 as int32 on `neuron` (outputs keep their dtypes), as the hardware does."""
    global downcast_64bit
    if not isinstance(enabled, bool):
        raise TypeError(f"set_downcast_64bit() expects a bool, got {type(enabled).__name__}")
    downcast_64bit = enabled


def is_downcast_64bit_enabled() -> bool:
    """Whether `neuron` computes 64-bit types in 32 bits (`set_downcast_64bit`, `TORCH_NEURONX_DOWNCAST_64BIT`)."""
    return downcast_64bit


def fp32_matmul_rounds_to_bf16() -> bool:
    """True when float32 matmuls on `neuron` take bfloat16-rounded operands ("high" or "medium" precision)."""
    return torch.get_float32_matmul_precision() != "highest"


# --- IEEE float32 host matmuls ------------------------------------------------------------------------------------

_ieee_lock = threading.Lock()
_ieee_users = 0
_ieee_saved: str | None = None


@contextlib.contextmanager
def ieee_host_matmul() -> Iterator[None]:
    """Run the block with the host's oneDNN float32 matmuls in IEEE float32 (restored when the last user leaves).

    The setting is process-wide in torch; while a neuron matmul computes, CPU matmuls of other threads also run in
    IEEE float32, which only makes them more precise.
    """
    global _ieee_users, _ieee_saved
    if torch._C._get_fp32_precision_getter("mkldnn", "matmul") == "ieee" and _ieee_users == 0:
        yield
        return
    with _ieee_lock:
        if _ieee_users == 0:
            _ieee_saved = torch._C._get_fp32_precision_getter("mkldnn", "matmul")
            torch._C._set_fp32_precision_setter("mkldnn", "matmul", "ieee")
        _ieee_users += 1
    try:
        yield
    finally:
        with _ieee_lock:
            _ieee_users -= 1
            if _ieee_users == 0:
                torch._C._set_fp32_precision_setter("mkldnn", "matmul", _ieee_saved)


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
    """One op run with 64-bit inputs narrowed: remembers which narrowed copies stand for which originals."""

    def __init__(self) -> None:
        self.originals: dict[int, torch.Tensor] = {}  # id(narrowed float copy) -> float64 original
        self.had_float64 = False

    def narrow(self, value, mutable: bool):
        if isinstance(value, (list, tuple)):
            return type(value)(self.narrow(v, mutable) for v in value)
        if not _is_wide_neuron(value):
            return value
        if value.dtype is torch.int64:
            if mutable:  # about to be overwritten: hold the 32-bit view of its values in place
                _round_in_place(value)
                return value
            return _narrow_on_host(value)
        self.had_float64 = True
        narrowed = _narrow_on_host(value)
        if mutable:
            self.originals[id(narrowed)] = value
        return narrowed

    def widen(self, value, restore_float64: bool):
        if isinstance(value, (list, tuple)):
            return type(value)(self.widen(v, restore_float64) for v in value)
        if not isinstance(value, torch.Tensor) or value.device.type != "neuron":
            return value
        original = self.originals.get(id(value))
        if original is not None:  # a float64 argument written by the op (in-place or out=)
            if original.shape != value.shape:
                original.resize_(value.shape)
            host_alias(original).copy_(host_alias(value))
            return original
        if value.dtype is torch.float32 and restore_float64:
            return allocator.adopt_tracked(host_alias(value).to(torch.float64), value.device.index)
        if value.dtype in _WIDE:
            _round_in_place(value)
        return value


_plans: dict[torch._ops.OpOverload, tuple[bool, frozenset[str], tuple[int, ...], str | None]] = {}


def _plan(op: torch._ops.OpOverload) -> tuple[bool, frozenset[str], tuple[int, ...], str | None]:
    """(returns a view of an input, names of written arguments, their positions, position-or-name of `dtype`)."""
    plan = _plans.get(op)
    if plan is None:
        schema = op._schema
        is_view = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
        written = [(i, a.name) for i, a in enumerate(schema.arguments) if a.alias_info and a.alias_info.is_write]
        dtype = next((a.name for a in schema.arguments if a.name == "dtype"), None)
        plan = _plans[op] = (is_view, frozenset(n for _, n in written), tuple(i for i, _ in written), dtype)
    return plan


def _explicit_dtype(op: torch._ops.OpOverload, name: str | None, args: tuple, kwargs: dict) -> bool:
    if name is None:
        return False
    if kwargs.get(name) is not None:
        return True
    position = next(i for i, a in enumerate(op._schema.arguments) if a.name == name)
    return position < len(args) and args[position] is not None


def run_downcast(run: Callable, op: torch._ops.OpOverload, args: tuple, kwargs: dict):
    """Run `op` through `run` (the host fallback) with 64-bit `neuron` inputs computed in 32 bits.

    float64 inputs are computed as float32 and float32 results come back as float64 when an input was float64 and
    no explicit `dtype` decided the output type; int64 values wrap to int32 before and after (exactly int32
    arithmetic for +, -, *, bitwise ops, comparisons, sums and products). Written arguments (in-place, out=) are
    updated in their own dtype. View ops move no data and run unchanged.
    """
    is_view, written_names, written_positions, dtype_name = _plan(op)
    if is_view or not any(
        _is_wide_neuron(v) or (isinstance(v, (list, tuple)) and any(map(_is_wide_neuron, v)))
        for v in (*args, *kwargs.values())
    ):
        result = run(op, *args, **kwargs)
        return result if is_view else _Downcast().widen(result, restore_float64=False)
    call = _Downcast()
    narrow_args = tuple(call.narrow(a, i in written_positions) for i, a in enumerate(args))
    narrow_kwargs = {k: call.narrow(v, k in written_names) for k, v in kwargs.items()}
    result = run(op, *narrow_args, **narrow_kwargs)
    restore = call.had_float64 and not _explicit_dtype(op, dtype_name, args, kwargs)
    return call.widen(result, restore)
