"""Quickstart: train a small model on the `neuron` device, exactly as you would on "cuda", and check it on the CPU.

    python examples/quickstart.py

No Trainium needed: `neuron` runs on a NeuronCore simulator on this machine. The script exits non-zero if the
`neuron` run does not match the same run on the CPU.
"""

from __future__ import annotations

import copy
import sys

import torch
from torch import nn
from torch.nn import functional as F

import torch_neuronx
from neuron_device.simulation.ledger import executed_ops

STEPS = 15


def make_data() -> tuple[torch.Tensor, torch.Tensor]:
    """Three noisy clusters in 2-D: a task a small MLP learns in a few steps."""
    gen = torch.Generator().manual_seed(0)
    labels = torch.arange(3).repeat_interleave(100)
    centers = torch.tensor([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]])
    points = centers[labels] + 0.8 * torch.randn(300, 2, generator=gen)
    return points, labels


def train(model: nn.Module, device: str, points: torch.Tensor, labels: torch.Tensor) -> list[float]:
    """The usual training loop; only `device` changes between the CPU and the `neuron` run."""
    model.to(device)
    points, labels = points.to(device), labels.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(points), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main() -> int:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 3))
    cpu_model = copy.deepcopy(model)
    points, labels = make_data()

    executed_ops.clear()
    torch_neuronx.clear_op_tracking()
    torch.neuron.reset_peak_memory_stats()
    neuron_losses = train(model, "neuron", points, labels)
    cpu_losses = train(cpu_model, "cpu", points, labels)

    print(f"device:     {next(model.parameters()).device}")
    print(f"properties: {torch.neuron.get_device_properties()}")
    print(f"memory:     {torch.neuron.memory_allocated() / 1024:.1f} KiB allocated, "
          f"{torch.neuron.max_memory_allocated() / 1024:.1f} KiB peak")
    print(f"\n{'step':>4}  {'loss on neuron':>14}  {'loss on cpu':>11}")
    for step in (0, STEPS // 2, STEPS - 1):
        print(f"{step:>4}  {neuron_losses[step]:>14.6f}  {cpu_losses[step]:>11.6f}")
    print(f"\nops executed on neuron: {sum(executed_ops.values())} calls, {len(executed_ops)} distinct; top 5:")
    for name, calls in executed_ops.most_common(5):
        print(f"  {calls:>5}  {name}")
    print(f"ops that fell back to CPU (no Neuron kernel): {', '.join(torch_neuronx.get_fallback_ops()) or 'none'}")

    try:
        torch.testing.assert_close(neuron_losses, cpu_losses, atol=1e-5, rtol=1e-5)
        for on_neuron, on_cpu in zip(model.parameters(), cpu_model.parameters()):
            torch.testing.assert_close(on_neuron.detach().cpu(), on_cpu.detach(), atol=1e-5, rtol=1e-5)
    except AssertionError as mismatch:
        print(f"\nFAILED: the neuron run differs from the CPU run:\n{mismatch}", file=sys.stderr)
        return 1
    if not neuron_losses[-1] < neuron_losses[0]:
        print("\nFAILED: the loss did not go down", file=sys.stderr)
        return 1
    print("\nOK: the neuron run matches the CPU run (losses and parameters within 1e-5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
