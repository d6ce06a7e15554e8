"""Ops whose generic (composite) kernel computes differently from their CPU kernel: run the CPU kernel instead.

A backend without its own kernel for an op gets the op's CompositeExplicitAutograd or CompositeImplicitAutograd
kernel, which for most ops calls the same `.out` kernel the CPU uses, so `neuron` and CPU agree bit for bit. The
ops below are the exceptions: CPU has a fused kernel (e.g. `native_layer_norm`, `addr`) while the composite is a
different decomposition with different rounding. Routing them to the host CPU kernel keeps `neuron` results equal
to CPU's, which is what the simulator promises.

The list is what the dispatcher of torch 2.13 reports (`tests/test_opinfo.py` checks it stays complete).

A second, smaller list: ops whose functional form has no composite of its own but is generated from its `.out` kernel
(CompositeExplicitAutogradNonFunctional), where torch's CPU `.out` kernel warns that it "resized" a reduced result.
The CPU never sees that warning, since it runs the functional kernel; on `neuron` every `mse_loss` printed it. The
OpInfo sweep finds these: it fails an op that warns on `neuron` where it does not on the CPU.
"""

from __future__ import annotations

import functools

import torch

from .fastpath import run_direct
from .registry import kernel

__all__ = ["CPU_KERNEL_OVER_COMPOSITE", "CPU_KERNEL_OVER_OUT_VARIANT", "CPU_PATH_OF_COMPOSITE"]

CPU_KERNEL_OVER_COMPOSITE: tuple[str, ...] = (
    # a CPU kernel and a CompositeExplicitAutograd kernel
    "_stack",
    "_stack.out",
    "addr",
    "addr.out",
    "all.dims",
    "all.dims_out",
    "any.dims",
    "any.dims_out",
    "linalg__powsum",
    "native_group_norm",
    "native_layer_norm",
    # a CPU kernel and a CompositeImplicitAutograd kernel
    "mish_backward",
    "native_channel_shuffle",
    "silu_backward",
)

CPU_KERNEL_OVER_OUT_VARIANT: tuple[str, ...] = ("mse_loss", "smooth_l1_loss")

# A third: CompositeExplicitAutograd kernels that take another path on the CPU than on a PrivateUse1 device.
# `ldexp` of float16 [-2, 2**-10] by [-25, 20] is [-5.96e-08, 1024] on the CPU; on `neuron` the composite formed
# 2**other in float16 (0 and inf: [-0, inf]), and `ldexp_` resized `self` to the broadcast shape where the CPU
# refuses. Running the op on the host alias takes the CPU's path.
# And the composites that call a CPU DispatchStub with the tensor's device type, which has no `neuron` entry (an
# internal assert, "DispatchStub: missing kernel for neuron"): `kaiser_window`'s TensorIterator calls
# `kaiser_window_stub(iter.device_type(), ...)`. A sweep of every OpInfo op and of the other device-generic factory
# composites (the windows, fftfreq, linspace, logspace, tril/triu_indices, polar, complex, histogramdd) found no other
# in torch 2.13 (`conj_physical_`, found earlier, has its own kernel in `minimal.py`).
CPU_PATH_OF_COMPOSITE: tuple[str, ...] = (
    "ldexp.Tensor", "ldexp.out", "ldexp_",
    "kaiser_window", "kaiser_window.periodic", "kaiser_window.beta", "kaiser_window.out", "kaiser_window.periodic_out",
    "kaiser_window.beta_out",
)


def _overload(name: str) -> torch._ops.OpOverload:
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


for _name in CPU_KERNEL_OVER_COMPOSITE + CPU_KERNEL_OVER_OUT_VARIANT + CPU_PATH_OF_COMPOSITE:
    kernel(f"aten::{_name}")(functools.partial(run_direct, _overload(_name)))


@kernel("aten::histc")
def histc(self: torch.Tensor, bins: int = 100, min: float = 0, max: float = 0) -> torch.Tensor:
    """`histc` of an integer tensor, which CUDA (and transformers' MoE path on `neuron`) relies on but the CPU
    kernel refuses: counted in fp32 (exact below 2**24 per bin) and returned in the input dtype."""
    if self.is_floating_point():
        return run_direct(torch.ops.aten.histc.default, self, bins, min, max)
    return run_direct(torch.ops.aten.histc.default, self.float(), bins, min, max).to(self.dtype)
