"""neuron-distributed: `torch.distributed` on the simulated Trainium device (the c10d backend `neuron`).

Installing the wheel is enough: neuron-device loads it as a plugin during `import torch`, which registers the
backend, so `dist.init_process_group("neuron")`, `"cpu:gloo,neuron:neuron"` and a bare `init_process_group()` (the
current accelerator is `neuron`) all work. Importing this package registers it too (`TORCH_DEVICE_BACKEND_AUTOLOAD=0`).

Modules: `backend` (the process group: collectives through Gloo on host aliases), `costs` (simulated time of each
collective over NeuronLink, from the hardware spec), `matching` (the cross-rank check of collective calls),
`hostmap` (tensors to host aliases and back), `gloo_refs` (Gloo works kept until Gloo let go, so none dies on its worker), `p2p` (point-to-point transfers both ends check), `kernels` (device kernels of the collectives' helpers), `catalogue`
(every collective op, its cost-model kind and arguments), `envvars`, `plugin` (the `neuron_device.plugins` hooks);
plan mode (`neuron-plan`): `planning` and its `plan_*` parts. neuron-device is used through `neuron_device.services` only.
"""

from __future__ import annotations

import torch  # first: its device autoload registers neuron-device, which loads this package's plugin

import neuron_device

from . import plugin
from .backend import BACKEND_NAME, NeuronProcessGroup

__all__ = ["BACKEND_NAME", "NeuronProcessGroup", "__version__"]
__version__ = "0.1.0"

neuron_device.register()  # loads the plugins, this one included (idempotent)
del plugin, torch
