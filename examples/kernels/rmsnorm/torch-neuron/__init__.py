"""The `neuron` build of a Hub-style kernel repository: RMSNorm as neuron-nki's NKI kernel (`nki.library.norms`).

The `kernels` library loads this directory as the `torch-neuron` variant (its `Neuron` backend), checks the `nki`
dependency declared in metadata.json, and takes the layer from `layers`.
"""

from . import layers

__all__ = ["layers"]
