"""neuron-device plugin (entry point group `neuron_device.plugins`): the backend exists with no import of ours.

The hooks run while `import torch` is still in progress, so they import only what they register.
"""

from __future__ import annotations

from typing import Any

from neuron_device.services import hookimpl


@hookimpl
def neuron_register(registry: Any) -> None:
    """`neuron` kernels for the `c10d::*` ops (C++ callers reach Gloo through them)."""
    from .kernels import register_kernels

    register_kernels(registry.register)


@hookimpl
def neuron_device_ready(device_module: Any) -> None:
    """Register the c10d backend `neuron`."""
    from .backend import register_backend

    register_backend()
