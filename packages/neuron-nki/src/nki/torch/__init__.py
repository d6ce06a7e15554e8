"""PyTorch integration of NKI (imports torch; the ``nki`` core does not).

Importing this package registers the torch adapter with ``nki.register_framework``, so an ``@nki.jit`` kernel
called with ``neuron`` or CPU tensors runs on the simulator over zero-copy views and returns torch tensors
(``adapter``; the core imports this package by itself the first time it meets a torch tensor). ``nki_op`` /
``wrap_nki`` (``op``, loaded on first use because it needs ``torch._dynamo``) make NKI kernels custom ops and single
graph nodes. The kernel library (``nki.library``) becomes the native ``neuron`` implementation of aten ops through
``native`` and the ``neuron_device.plugins`` hooks in ``plugin``. ``torch_neuronx.nki_op`` / ``wrap_nki`` / ``nki``
re-export these.
"""

from __future__ import annotations

from typing import Any

import torch

from .._launch import register_framework
from .adapter import KernelLaunch, from_numpy, kernel_log, launch, record_launches, to_numpy

__all__ = ["KernelLaunch", "WrappedKernel", "from_numpy", "kernel_log", "launch", "nki_op", "record_launches",
           "to_numpy", "wrap_nki"]

_OP_EXPORTS = frozenset({"WrappedKernel", "nki_op", "wrap_nki"})


def __getattr__(name: str) -> Any:
    if name in _OP_EXPORTS:
        from . import op

        return getattr(op, name)
    raise AttributeError(f"module 'nki.torch' has no attribute {name!r}")


register_framework("torch", lambda v: isinstance(v, torch.Tensor),
                   lambda kernel, grid, args, kwargs: launch(kernel, grid, args, kwargs))
