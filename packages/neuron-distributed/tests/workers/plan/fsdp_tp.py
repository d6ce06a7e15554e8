"""FSDP2 over a 2-D device mesh after tensor parallelism, as torchtitan applies them: a tiny MLP block stack,
Megatron-style TP (column then row) on mesh["tp"], then `fully_shard` of each block and the model on mesh["dp"];
3 AdamW steps. Planned, and run for real. `--dp N` sets the mesh's data-parallel size (the rest is TP)."""

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

parser = argparse.ArgumentParser()
parser.add_argument("--dp", type=int, default=1)
args = parser.parse_args()
dist.init_process_group("neuron")
torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
world = dist.get_world_size()
mesh = init_device_mesh("neuron", (args.dp, world // args.dp), mesh_dim_names=("dp", "tp"))
torch.manual_seed(0)
model = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
                              for _ in range(2))).to("neuron")
for block in model:
    parallelize_module(block, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(block, mesh=mesh["dp"])
fully_shard(model, mesh=mesh["dp"])
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(3):
    loss = model(torch.randn(16, 64, device="neuron")).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
