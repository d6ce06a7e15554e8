"""`neuron` kernels of the `c10d::*` ops, for the C++ callers that bypass the Python process group.

Methods that `PyProcessGroup` does not trampoline (`_allgather_base`, `_reduce_scatter_base`, `reduce`, `gather`,
`scatter`, `alltoall`, ... when called from C++: the DDP reducer, DTensor's C++ ops) dispatch the `c10d::*` op on
the tensors' device. The built-in PrivateUse1 kernel would hand `neuron` tensors to Gloo, which rejects them
("unsupported device type"). These kernels call the same op again on the host aliases, so it reaches the CPU kernel
and the group's CPU backend (Gloo), and charge the interconnect time. The ops and their kinds are `catalogue.C10D`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from . import gloo_refs
from .catalogue import C10D, boxed_group, charge_c10d
from .hostmap import to_host

__all__ = ["register_kernels"]


def _kernel(op_name: str, kind: str) -> Callable[..., Any]:
    op = getattr(torch.ops.c10d, op_name).default

    def on_host(*args: Any, **kwargs: Any) -> Any:
        result = gloo_refs.issue(
            boxed_group(args), op, *to_host(args), barrier=op_name == "barrier", **to_host(kwargs)
        )
        charge_c10d(kind, args)
        if isinstance(
            result, tuple
        ):  # (outputs, Work): hand back the caller's neuron outputs, not the aliases
            return (args[0], result[1])
        return result

    on_host.__name__ = f"c10d_{op_name}_neuron"
    return on_host


def register_kernels(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register the kernels through neuron-device's registry (the `neuron_register` plugin hook)."""
    with warnings.catch_warnings():
        # torch warns that a kernel for PrivateUse1 (its own, which cannot work here) is being overridden.
        warnings.filterwarnings("ignore", message="Warning only once for all operators")
        for op_name, kind in C10D.items():
            register(f"c10d::{op_name}", _kernel(op_name, kind))
