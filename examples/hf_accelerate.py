"""accelerate on `neuron`: `Accelerator()` picks the device by itself, prepares a tiny Llama (from a config, random
weights, no download), its optimizer and dataloader, and trains a few steps; the losses are checked against the same
loop in plain PyTorch on the CPU."""

from __future__ import annotations

import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from accelerate import Accelerator
from transformers import LlamaConfig, LlamaForCausalLM, set_seed

CONFIG = LlamaConfig(
    vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2,
)
ROWS = torch.randint(3, CONFIG.vocab_size, (8, 16), generator=torch.Generator().manual_seed(0))


def batches() -> torch.utils.data.DataLoader:
    """Four batches of two sequences, in order (no shuffling: both runs see the same batches)."""
    return torch.utils.data.DataLoader([{"input_ids": row, "labels": row} for row in ROWS], batch_size=2)


def train_with_accelerate() -> tuple[str, list[float]]:
    set_seed(0)
    accelerator = Accelerator()
    model = LlamaForCausalLM(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, batches())
    losses = []
    for batch in loader:  # already on accelerator.device
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return str(accelerator.device), losses


def train_on_cpu() -> list[float]:
    set_seed(0)
    model = LlamaForCausalLM(CONFIG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for batch in batches():
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    device, losses = train_with_accelerate()
    assert device.startswith("neuron"), device
    torch.testing.assert_close(losses, train_on_cpu(), rtol=1e-4, atol=1e-4)
    print(f"Accelerator trained on {device}: losses {[round(v, 4) for v in losses]} == CPU")
