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

This module is the policy (what is computed how); the host runs it in `ops/host_numerics` (64-bit ops in 32 bits,
float32 host matmuls in IEEE float32).
"""

from __future__ import annotations

import torch

from . import envvars

__all__ = [
    "DOWNCAST_64BIT_ENV",
    "downcast_64bit",
    "fp32_matmul_rounds_to_bf16",
    "is_downcast_64bit_enabled",
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
