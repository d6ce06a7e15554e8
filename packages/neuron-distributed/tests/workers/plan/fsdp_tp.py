"""FSDP2 over a 2-D device mesh after tensor parallelism, as torchtitan applies them: a stack of tiny pre-norm MLP
blocks, Megatron-style TP (column then row) on mesh["tp"], then `fully_shard` of each block and the model on
mesh["dp"]; 3 AdamW steps. Planned, and run for real.

`--dp N` sets the mesh's data-parallel size (the rest is TP). As torchtitan's `parallelize_llama` orders them:
`--sp` adds sequence parallelism (`SequenceParallel` on the norm, the MLP's input gathered by `PrepareModuleInput`,
its output reduce-scattered back to sequence shards), `--ac` wraps each block in `checkpoint_wrapper`, `--compile`
compiles each block with `torch.compile(backend="neuron")`."""

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

parser = argparse.ArgumentParser()
parser.add_argument("--dp", type=int, default=1)
parser.add_argument("--sp", action="store_true", help="sequence parallelism over mesh['tp']")
parser.add_argument("--ac", action="store_true", help="activation checkpointing of each block")
parser.add_argument("--compile", action="store_true", help='each block compiled with backend "neuron"')
args = parser.parse_args()
dist.init_process_group("neuron")
torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
world = dist.get_world_size()
mesh = init_device_mesh("neuron", (args.dp, world // args.dp), mesh_dim_names=("dp", "tp"))
tp = mesh["tp"].size()
batch, seq, width = 4, 16, 64


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


torch.manual_seed(0)
model = torch.nn.Sequential(*(Block() for _ in range(2))).to("neuron")
if args.sp:
    plan = {"norm": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel(output_layouts=Shard(1))}
else:
    plan = {"mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel()}
for index, block in enumerate(model):
    parallelize_module(block, mesh["tp"], plan)
    if args.ac:
        block = checkpoint_wrapper(block)
    if args.compile:
        block = torch.compile(block, backend="neuron")
    model[index] = block
    fully_shard(block, mesh=mesh["dp"])
fully_shard(model, mesh=mesh["dp"])
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(3):
    # with sequence parallelism each TP rank holds its shard of the sequence
    loss = model(torch.randn(batch, seq // tp if args.sp else seq, width, device="neuron")).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
