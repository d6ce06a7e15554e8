"""neuron-nki's hooks on the device's plugin seam (entry point group ``neuron_device.plugins``).

They run inside ``import torch``: only ``native`` (torch-only at import) is loaded here; the NKI core, the kernel
library and the adapter load on the first launch.
"""

from __future__ import annotations

from typing import Any

from neuron_device.services import hookimpl


def _torch_adapter(module: str, name: str | None = None) -> Any:
    """`module` (or its attribute `name`), with the torch adapter of ``@nki.jit`` kernels registered first."""
    import importlib

    import nki.torch  # noqa: F401  (registers the torch adapter of @nki.jit kernels)

    found = importlib.import_module(module)
    return found if name is None else getattr(found, name)


@hookimpl
def neuron_torch_neuronx_exports() -> dict[str, Any]:
    """TorchNeuron's NKI entry points on `torch_neuronx`: `nki`, `nki_op`, `wrap_nki` (loaded on first access)."""
    return {
        "nki": lambda: _torch_adapter("nki"),
        "nki_op": lambda: _torch_adapter("nki.torch", "nki_op"),
        "wrap_nki": lambda: _torch_adapter("nki.torch", "wrap_nki"),
    }


@hookimpl
def neuron_register(registry: Any) -> None:
    """Make the NKI kernel library the native ``neuron`` kernels of SDPA, RMSNorm, LayerNorm and softmax."""
    from . import native

    native.register(registry)
