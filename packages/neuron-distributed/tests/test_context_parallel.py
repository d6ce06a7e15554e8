"""Context parallelism on `neuron` (issue 39): torch's `context_parallel` shards SDPA's fused op, the one `neuron`
(as TorchNeuron) runs SDPA as (`_scaled_dot_product_fused_attention_overrideable`), with its ring attention. A
one-process world here (the ring's single step, every op through DTensor's CP handlers); two ranks in torchtitan's
`test_llama3_context_parallel`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed.tensor.experimental import context_parallel


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad: torch.Tensor) -> list[torch.Tensor]:
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=True)
    out.backward(grad)
    return [out.detach().cpu(), *(t.grad.cpu() for t in leaves)]


def test_context_parallel_sdpa_matches_cpu(mesh) -> None:
    """Causal SDPA and its backward inside `context_parallel` (load balancing on, torch's default): the CPU's
    output and gradients (it failed: 'Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not
    have a sharding strategy registered')."""
    torch.manual_seed(0)
    q, k, v, grad = (torch.randn(2, 4, 16, 8) for _ in range(4))
    expected = _attention(q, k, v, grad)
    on_device = [t.to("neuron") for t in (q, k, v, grad)]
    with context_parallel(mesh, buffers=on_device, buffer_seq_dims=[2] * 4):
        got = _attention(*on_device)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
