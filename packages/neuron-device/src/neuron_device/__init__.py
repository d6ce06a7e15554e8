"""neuron-device: the `neuron` PyTorch device (AWS Trainium) on a NeuronCore simulator running on the host CPU.

`import torch` registers the device through the `torch.backends` entry point (`_autoload`); with
`TORCH_DEVICE_BACKEND_AUTOLOAD=0`, `import neuron_device` or `import torch_neuronx` registers it.
"""

from __future__ import annotations

__version__ = "0.1.0"


def _autoload() -> None:
    """Entry point called by `import torch`. torch is half-imported here, so only the registration runs."""
    register()


def register() -> None:
    """Register the `neuron` device (idempotent)."""
    from ._registration import register as _register

    _register()


# Importing torch first lets its autoload run `register()` while torch is half-imported, as it does when torch is
# imported first; registering from here, before `import torch` finished, would re-enter our half-run modules.
import torch  # noqa: E402, F401

register()
