"""A plain DDP pre-training script (tiny BERT, 3 AdamW steps) with the model compiled by backend "neuron" and its
forward under bf16 autocast, as a user on Trainium writes it: planned, and run for real."""

import os

import torch
import torch.distributed as dist
from transformers import BertConfig, BertForPreTraining

dist.init_process_group("neuron")
torch.manual_seed(0)
config = BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
                    max_position_embeddings=64)
model = BertForPreTraining(config).to(f"neuron:{os.environ['LOCAL_RANK']}")
ddp = torch.nn.parallel.DistributedDataParallel(torch.compile(model, backend="neuron"))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(3):
    ids = torch.randint(0, config.vocab_size, (64, 64), device=model.device)
    nsp = torch.randint(0, 2, (64,), device=model.device)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        loss = ddp(input_ids=ids, labels=ids, next_sentence_label=nsp).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
