"""neuron-nki's hooks on the device's plugin seam (entry point group ``neuron_device.plugins``).

They run inside ``import torch``: only ``native`` (torch-only at import) is loaded here; the NKI core, the kernel
library and the adapter load on the first launch.
"""

from __future__ import annotations

from typing import Any

from neuron_device.plugins import hookimpl


@hookimpl
def neuron_register(registry: Any) -> None:
    """Make the NKI kernel library the native ``neuron`` kernels of SDPA, RMSNorm, LayerNorm and softmax."""
    from . import native

    native.register(registry)
