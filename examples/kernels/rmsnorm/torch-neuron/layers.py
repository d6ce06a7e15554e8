"""Layers of the kernel repository, stateless as `kernels.kernelize` requires: it swaps in their `forward`."""

from __future__ import annotations

import torch
from torch import nn


class LlamaRMSNorm(nn.Module):
    """RMSNorm through `aten::_fused_rms_norm`: on `neuron`, neuron-nki registers its NKI kernels
    `nki::rmsnorm_fwd` / `nki::rmsnorm_bwd` as that op's implementation (the op's derivative formula gives training).

    Replaces the forward of transformers' `LlamaRMSNorm` (and the other `RMSNorm` hub layers), whose `weight` and
    `variance_epsilon` it reads. Not marked `can_torch_compile`: under `torch.compile(backend="neuron")` the compiler
    lowers the fused op itself, so `kernelize` keeps the original forward in that mode.
    """

    has_backward = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        size = hidden_states.size(-1)
        return torch.ops.aten._fused_rms_norm(hidden_states, [size], self.weight, self.variance_epsilon)[0]
