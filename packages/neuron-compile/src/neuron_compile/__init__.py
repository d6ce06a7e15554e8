"""neuron-compile: the graph compiler behind `torch.compile(backend="neuron")`.

Status: the package installs and declares the `neuron` Dynamo backend, but the compiler itself is not built yet.
Compiling with `backend="neuron"` raises `NotImplementedError` saying so; run eagerly on `neuron` meanwhile.
"""

__version__ = "0.1.0"
