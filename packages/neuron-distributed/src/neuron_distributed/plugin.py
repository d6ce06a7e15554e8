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


@hookimpl
def neuron_torch_neuronx_exports() -> dict[str, Any]:
    """The planner on `torch_neuronx`: `plan` (plan a callable as one rank of a full cluster), `is_planning`."""

    def planning(name: str) -> Any:
        from . import planning

        return getattr(planning, name)

    return {"plan": lambda: planning("plan"), "is_planning": lambda: planning("is_planning"),
            "PlanValueError": lambda: planning("PlanValueError")}
