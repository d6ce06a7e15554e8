"""Map the tensors of a collective's arguments to their zero-copy host aliases, so Gloo can move them.

Device memory is host memory in the simulator (`neuron_device.storage`), so a collective that writes into the alias
has written into the `neuron` tensor: no staging copy, no copy-back.
"""

from __future__ import annotations

from typing import Any

import torch

from neuron_device.services import flat_tensors, host_alias

__all__ = ["flat_tensors", "to_host"]


def to_host(value: Any) -> Any:
    """`value` with every `neuron` tensor (also inside lists and tuples, nested) replaced by its host alias."""
    if isinstance(value, torch.Tensor):
        return host_alias(value) if value.device.type == "neuron" else value
    if isinstance(value, (list, tuple)):
        return type(value)(to_host(item) for item in value)
    return value


