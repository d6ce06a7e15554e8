"""PEFT LoRA fine-tuning of a tiny random Llama on `neuron`, merged and checked against the same steps on CPU."""

from __future__ import annotations

import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, set_seed

CONFIG = LlamaConfig(
    vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2,
)


def finetune(device: str) -> torch.Tensor:
    """Three LoRA steps, then merge_and_unload; returns the merged model's logits on a probe."""
    set_seed(0)
    model = get_peft_model(LlamaForCausalLM(CONFIG), LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).to(device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(0, CONFIG.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0)).to(device)
    for _ in range(3):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    print(f"{device}: final loss {loss.item():.6f}")
    return model.merge_and_unload()(input_ids=ids).logits.detach().cpu()


if __name__ == "__main__":
    torch.testing.assert_close(finetune("neuron"), finetune("cpu"), rtol=1e-3, atol=1e-4)
    print("merged LoRA model: neuron logits == CPU")
