"""What `torch_neuronx.neuron_dynamo_backend` holds (TorchNeuron's helper API of the `neuron` torch.compile
backend: the backend callable and the per-graph compile metrics). neuron-device imports no sibling wheel, so this
module reaches it through the plugin hook `neuron_torch_neuronx_exports`."""

from __future__ import annotations

from .backend import NeuronCompileError, neuron_backend
from .metrics import NeuronCompilationMetrics, get_dynamo_metrics, reset_dynamo_metrics

__all__ = ["NeuronCompilationMetrics", "NeuronCompileError", "get_dynamo_metrics", "neuron_backend",
           "reset_dynamo_metrics"]
