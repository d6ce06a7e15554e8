"""The backend hooks C++ asks of a PrivateUse1 device (torch's `PrivateUse1Hooks`), registered at start-up."""

from __future__ import annotations

import torch

__all__ = ["NeuronHooks"]


class NeuronHooks(torch._C._acc.PrivateUse1Hooks):
    """What C++ asks of the backend: the simulator is always built and available."""

    def is_available(self) -> bool:
        return True

    def is_built(self) -> bool:
        return True

    def has_primary_context(self, device_index: int) -> bool:
        return torch.neuron.is_initialized()
