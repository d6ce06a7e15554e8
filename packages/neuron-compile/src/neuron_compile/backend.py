"""The `neuron` Dynamo backend, found through the `torch_dynamo_backends` entry point."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def neuron_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[torch.Tensor], **kwargs) -> Callable:
    """Compile an FX graph for the simulated NeuronCore. Not built yet: says so instead of pretending."""
    raise NotImplementedError(
        'torch.compile(backend="neuron") is not implemented yet in neuron-compile 0.1.0. '
        "Run the model eagerly on the 'neuron' device (drop torch.compile) until the compiler lands."
    )
