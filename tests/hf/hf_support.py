"""Helpers shared by the Hugging Face drop-in tests (a module of its own name: all test folders can run in one pytest
process, where a bare `import conftest` could find another folder's)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def token_batches(count: int, batch: int = 2, length: int = 16, vocab: int = 128, seed: int = 0) -> list[dict]:
    """Random token-id examples (ids 3..vocab-1: no pad/bos/eos), labels = inputs, as a Trainer dataset."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (count * batch, length), generator=generator)
    return [{"input_ids": row, "labels": row.clone()} for row in ids]
