"""BERT-Large phase-1 pre-training as a plain Hugging Face + DDP script (calibration.md T1's configuration):
micro-batch 16, sequence 128, the model compiled with backend "neuron" as one graph per pass, bf16 autocast, AdamW,
gradient accumulation to the global batch. Run it under
torchrun on Trainium, or plan it: neuron-plan -- python bert_pretrain_ddp.py --global-batch 16384."""

import argparse
import contextlib
import os

import torch
import torch.distributed as dist
from transformers import BertConfig, BertForPreTraining

parser = argparse.ArgumentParser()
parser.add_argument("--micro-batch", type=int, default=16)
parser.add_argument("--seq", type=int, default=128)
parser.add_argument("--global-batch", type=int, default=16384)
parser.add_argument("--steps", type=int, default=2)
parser.add_argument("--eager", action="store_true", help="do not compile the model")
parser.add_argument("--split-at-buckets", action="store_true",
                    help="let Dynamo split the compiled model at DDP's buckets (its default, DDPOptimizer)")
args = parser.parse_args()
if not args.split_at_buckets:
    # One graph for the forward and one for the backward, as the published run's XLA stack compiles each micro-batch.
    # DDPOptimizer's split only buys all-reduce overlap, and with gradient accumulation the all-reduce runs on one
    # micro-batch in 32; PyTorch's documented switch (DDP's C++ reducer then all-reduces after the backward).
    torch._dynamo.config.optimize_ddp = "no_optimization"

dist.init_process_group("neuron")
device = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
config = BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
model = BertForPreTraining(config).to(device)
# compiled as a user on Trainium compiles it: backend "neuron", inside DDP (`--eager` leaves it eager)
model = torch.nn.parallel.DistributedDataParallel(model if args.eager else torch.compile(model, backend="neuron"))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
accumulation = args.global_batch // (args.micro_batch * dist.get_world_size())
for _ in range(args.steps):
    for micro in range(accumulation):
        ids = torch.randint(0, config.vocab_size, (args.micro_batch, args.seq), device=device)
        labels = torch.randint(0, config.vocab_size, (args.micro_batch, args.seq), device=device)
        nsp = torch.randint(0, 2, (args.micro_batch,), device=device)
        sync = contextlib.nullcontext() if micro == accumulation - 1 else model.no_sync()
        with sync:  # gradients are all-reduced on the last micro-batch only
            with torch.autocast("neuron", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=labels, next_sentence_label=nsp).loss / accumulation
            loss.backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
