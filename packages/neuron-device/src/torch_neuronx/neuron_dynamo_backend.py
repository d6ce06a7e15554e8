"""`torch_neuronx.neuron_dynamo_backend`, TorchNeuron's helper API of the `neuron` torch.compile backend: the
backend callable and the per-graph compile metrics. neuron-compile provides it through the plugin hook
`neuron_torch_neuronx_exports` (neuron-device imports no sibling wheel); without it, importing this module raises
ImportError naming the wheel."""

from __future__ import annotations

from neuron_device import plugins as _plugins

try:
    _api = _plugins.torch_neuronx_export("neuron_dynamo_backend")
except AttributeError:
    raise ImportError("torch_neuronx.neuron_dynamo_backend needs the neuron-compile package "
                      "(pip install neuron-compile)") from None

__all__ = list(_api.__all__)
globals().update((name, getattr(_api, name)) for name in __all__)
