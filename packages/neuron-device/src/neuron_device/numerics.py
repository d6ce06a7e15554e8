"""The numerics policy of `neuron`: where the simulator computes what a NeuronCore computes rather than what the CPU
computes. Everything else is bit-for-bit the host CPU kernel (see `docs/numerics.md`).

* **float32 matmuls follow `torch.set_float32_matmul_precision`** (and the TF32 flags CUDA code sets, see
  `fp32_matmul_rounds_to_bf16`). "highest" (torch's default) computes in float32:
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
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch

from . import allocator, envvars
from .storage import host_alias

if TYPE_CHECKING:  # the record's module imports the catalogue, whose cost model reads this policy
    from .ops.call import OverloadRecord

__all__ = [
    "DOWNCAST_64BIT_ENV",
    "downcast_64bit",
    "fp32_matmul_rounds_to_bf16",
    "ieee_host_matmul",
    "is_downcast_64bit_enabled",
    "run_downcast",
    "set_downcast_64bit",
]

DOWNCAST_64BIT_ENV = envvars.DOWNCAST_64BIT.name

downcast_64bit: bool = envvars.read_at_import(envvars.DOWNCAST_64BIT)  # read on every fallback op: keep it a plain module global


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
    """True when float32 matmuls on `neuron` take bfloat16-rounded operands.

    `neuron` reads the setting CUDA's matmuls read, so every way CUDA code asks for fast float32 matmuls works:
    `torch.set_float32_matmul_precision("high"/"medium")`, the legacy `torch.backends.cuda.matmul.allow_tf32 = True`
    and the new `torch.backends.cuda.matmul.fp32_precision = "tf32"` (unset: `torch.backends.fp32_precision`).
    (`torch.get_float32_matmul_precision()` is not used: it raises once the legacy and the new API are mixed.)
    """
    precision = _fp32_precision("cuda", "matmul")
    if precision == "none":
        precision = _fp32_precision("generic", "all")
    return precision in _FAST


_fp32_precision = torch._C._get_fp32_precision_getter
_FAST = ("tf32", "bf16")


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
