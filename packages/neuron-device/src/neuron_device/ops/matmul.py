"""Direct `neuron` kernels for the matmul family, where the numerics policy (`numerics.py`) departs from the CPU.

float32 under `torch.set_float32_matmul_precision("highest")` (the default) takes the plain direct call of the fast
path (`fastpath.run_record`, straight from the kernel: every Linear comes here), so it is bit-for-bit the CPU
result. Under "high"/"medium" the two matrix operands are rounded to bfloat16 first. bfloat16 and float16 compute in
float32 from the (exactly upcast) inputs and round once. Anything else (other dtypes, mixed dtypes or devices, which
are errors or promotions for torch to report) takes the fallback unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import allocator, numerics
from ..fallback import admit, run_on_host
from ..simulation import ledger as _ledger
from ..storage import host_alias
from . import host_numerics
from .call import overload_record
from .fastpath import run_direct, run_record
from .registry import kernel

__all__ = ["OPERANDS"]

_LOW = (torch.bfloat16, torch.float16)
_FLOAT32 = torch.float32
# op -> positions of the two matrix/vector operands (the inputs the TensorEngine reads)
OPERANDS: dict[str, tuple[int, int]] = {
    "mm": (0, 1),
    "bmm": (0, 1),
    "mv": (0, 1),
    "dot": (0, 1),
    "vdot": (0, 1),
    "addmm": (1, 2),
    "baddbmm": (1, 2),
    "addbmm": (1, 2),
    "addmv": (1, 2),
    "_addmm_activation": (1, 2),
}
_IN_PLACE = ("addmm_", "baddbmm_", "addbmm_", "addmv_")
_AUTOCAST_CPU = torch._C.DispatchKey.AutocastCPU
_CPU_AUTOCAST = torch._C.DispatchKeySet(_AUTOCAST_CPU)
_excluded = torch._C._dispatch_tls_is_dispatch_key_excluded


def _uniform(args: tuple, kwargs: dict, dtype: torch.dtype, index: int) -> bool:
    """All tensor arguments are `neuron:index` tensors of `dtype` (anything else is torch's to judge)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and (
            value.dtype is not dtype or value.device.type != "neuron" or value.device.index != index
        ):
            return False
    return True


def _round_to_bf16(tensor: torch.Tensor) -> torch.Tensor:
    host = host_alias(tensor).to(torch.bfloat16).to(torch.float32)
    return allocator.adopt_tracked(host, tensor.device.index)


def _in_fp32(functional: torch._ops.OpOverload, args: tuple, kwargs: dict, dtype: torch.dtype) -> torch.Tensor:
    """`functional` computed on the host in float32 from low-precision inputs, rounded once to `dtype`."""
    host_args = [host_alias(a).float() if isinstance(a, torch.Tensor) else a for a in args]
    with host_numerics.ieee_host_matmul():
        result = functional(*host_args, **kwargs).to(dtype)
    index = next(a.device.index for a in args if isinstance(a, torch.Tensor))
    admit(functional)  # a Tensor engine kernel
    _ledger.charge(overload_record(functional), index, args, kwargs, result)
    return result


def _matmul_kernel(op: torch._ops.OpOverload, functional: torch._ops.OpOverload, operands: tuple[int, int]) -> Callable:
    in_place = op._schema.name.endswith("_")
    writes_out = any(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments)
    record = overload_record(op)
    direct = record.direct  # fresh results or `self`: not the `.out` overloads
    first_operand = operands[0]

    def run(*args, **kwargs):
        if _excluded(_AUTOCAST_CPU):  # the usual case: no `torch.autocast("cpu")` region is open
            if direct and args[first_operand].dtype is _FLOAT32 and not numerics.fp32_matmul_rounds_to_bf16():
                return run_record(record, args, kwargs)  # `compute`'s float32 "highest" case, two frames fewer
            return compute(*args, **kwargs)
        # A direct kernel's host calls would meet `torch.autocast("cpu")`'s policies (mm -> bfloat16): keep them off.
        with torch._C._ExcludeDispatchKeyGuard(_CPU_AUTOCAST):
            return compute(*args, **kwargs)

    def compute(*args, **kwargs):
        first = args[operands[0]]
        dtype, index = first.dtype, first.device.index
        if dtype is torch.float32:
            if not numerics.fp32_matmul_rounds_to_bf16() or not _uniform(args, kwargs, dtype, index):
                return run_direct(op, *args, **kwargs)
            rounded = list(args)
            for position in operands:
                rounded[position] = _round_to_bf16(args[position])
            with host_numerics.ieee_host_matmul():
                return run_direct(op, *rounded, **kwargs)
        if dtype not in _LOW or not _uniform(args, kwargs, dtype, index):
            return run_on_host(op, *args, **kwargs)
        if writes_out:
            out = kwargs.pop("out")
            result = _in_fp32(functional, args, kwargs, dtype)
            if out.shape != result.shape:
                out.resize_(result.shape)
            host_alias(out).copy_(result)
            return out
        result = _in_fp32(functional, args, kwargs, dtype)
        if not in_place:
            return allocator.adopt_tracked(result, index)
        self = args[0]
        if self.shape != result.shape:
            return run_on_host(op, *args, **kwargs)  # torch's error for an in-place result of another shape
        host_alias(self).copy_(result)
        return self

    run.__name__ = f"{op._schema.name.split('::')[1]}_neuron_numerics"
    return run


def _register() -> None:
    aten = torch.ops.aten
    for name, operands in OPERANDS.items():
        packet = getattr(aten, name)
        kernel(f"aten::{name}")(_matmul_kernel(packet.default, packet.default, operands))
        kernel(f"aten::{name}.out")(_matmul_kernel(packet.out, packet.default, operands))
    for name in _IN_PLACE:
        operands = OPERANDS[name[:-1]]
        kernel(f"aten::{name}")(_matmul_kernel(getattr(aten, name).default, getattr(aten, name[:-1]).default, operands))


_register()
