"""Compatibility module under AWS TorchNeuron's import name, so code and libraries that probe for `torch_neuronx`
(transformers, accelerate, diffusers) find the `neuron` device. Importing it registers the device."""

from __future__ import annotations

import neuron_device
from neuron_device import __version__

__all__ = ["__version__"]

neuron_device.register()
