"""A plain DDP training script (tiny Llama, 3 AdamW steps) as a user writes it: planned, and run for real."""

import os

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

dist.init_process_group("neuron")
torch.manual_seed(0)
config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=64)
model = LlamaForCausalLM(config).to(f"neuron:{os.environ['LOCAL_RANK']}")
ddp = torch.nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(3):
    ids = torch.randint(0, 256, (2, 32), device=model.device)
    loss = ddp(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
