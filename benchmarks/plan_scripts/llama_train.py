"""Llama training step as a plain Hugging Face script: data parallel (DDP) or tensor parallel over every rank
(`parallelize_module`, Megatron-style column/row sharding of attention and MLP), bf16 weights, AdamW.

    neuron-plan --instance trn1.32xlarge -- python llama_train.py --model 70b --parallel ddp
    neuron-plan --instance trn1.32xlarge -- python llama_train.py --model 70b --parallel tp --seq 8192
"""

import argparse
import os

import torch
import torch.distributed as dist
from llama_shapes import LLAMA_3_1
from transformers import LlamaConfig, LlamaForCausalLM

SIZES = LLAMA_3_1
parser = argparse.ArgumentParser()
parser.add_argument("--model", default="8b", choices=sorted(SIZES))
parser.add_argument("--layers", type=int, help="override the layer count")
parser.add_argument("--parallel", default="ddp", choices=("ddp", "tp"))
parser.add_argument("--micro-batch", type=int, default=1)
parser.add_argument("--seq", type=int, default=8192)
parser.add_argument("--steps", type=int, default=1)
args = parser.parse_args()

dist.init_process_group("neuron")
device = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
shape = dict(SIZES[args.model])
if args.layers:
    shape["num_hidden_layers"] = args.layers
config = LlamaConfig(max_position_embeddings=131072, **shape)
model = LlamaForCausalLM(config).to(device, torch.bfloat16)
if args.parallel == "ddp":
    model = torch.nn.parallel.DistributedDataParallel(model)
else:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("neuron", (dist.get_world_size(),))
    plan = {}
    for i in range(config.num_hidden_layers):
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            plan[f"model.layers.{i}.{name}"] = ColwiseParallel()
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            plan[f"model.layers.{i}.{name}"] = RowwiseParallel()
    parallelize_module(model, mesh, plan)
    for layer in model.model.layers:  # heads per rank after column sharding
        layer.self_attn.config = config
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
for _ in range(args.steps):
    ids = torch.randint(0, config.vocab_size, (args.micro_batch, args.seq), device=device)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
