"""A tiny Llama from a config (random weights, no download) trained by transformers' Trainer on `neuron`, then
greedy generation: the device comes from TrainingArguments itself, and the tokens are checked against the CPU."""

from __future__ import annotations

import os
import tempfile

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, set_seed

CONFIG = LlamaConfig(
    vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
)


def main() -> None:
    set_seed(0)
    model = LlamaForCausalLM(CONFIG)
    rows = torch.randint(3, CONFIG.vocab_size, (8, 16), generator=torch.Generator().manual_seed(0))
    dataset = [{"input_ids": row, "labels": row} for row in rows]
    with tempfile.TemporaryDirectory() as output_dir:
        args = TrainingArguments(
            output_dir=output_dir, max_steps=4, per_device_train_batch_size=2, learning_rate=1e-2, report_to=[],
            save_strategy="no", logging_steps=1, dataloader_pin_memory=False,
        )
        Trainer(model=model, args=args, train_dataset=dataset).train()
    print(f"trained on {args.device}")
    prompt = torch.tensor([[1, 17, 42, 99]])
    tokens = model.generate(prompt.to(args.device), max_new_tokens=8, do_sample=False).cpu()
    expected = model.to("cpu").generate(prompt, max_new_tokens=8, do_sample=False)
    assert torch.equal(tokens, expected), (tokens, expected)
    print(f"greedy tokens on neuron == CPU: {tokens[0].tolist()}")


if __name__ == "__main__":
    main()
