"""`torch_neuronx.neuron_dynamo_backend`, TorchNeuron's helper API of the `neuron` torch.compile backend: the
backend callable and the per-graph compile metrics. Provided by neuron-compile; importing this module without it
raises ImportError naming the wheel."""

from __future__ import annotations

try:
    from neuron_compile.backend import NeuronCompileError, neuron_backend
    from neuron_compile.metrics import NeuronCompilationMetrics, get_dynamo_metrics, reset_dynamo_metrics
except ModuleNotFoundError as error:
    if error.name != "neuron_compile":
        raise
    raise ImportError("torch_neuronx.neuron_dynamo_backend needs the neuron-compile package "
                      "(pip install neuron-compile)") from error

__all__ = ["NeuronCompilationMetrics", "NeuronCompileError", "get_dynamo_metrics", "neuron_backend",
           "reset_dynamo_metrics"]
