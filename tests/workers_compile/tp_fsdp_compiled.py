"""One rank of `test_compile_tensor_parallel`'s two-rank check: TP over mesh["tp"], per-block compile with backend
"neuron" (argument "neuron") or eager on the CPU with Gloo (argument "cpu"), FSDP2 over mesh["dp"]; prints the
losses of three SGD steps as one JSON line. As torchtitan's embedding, an eager `RowwiseParallel` layer comes first:
its output, an async all-reduce's, reaches the first compiled block as an `AsyncCollectiveTensor`."""

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_compile_tensor_parallel import HIDDEN, PLAN, Block, train

device = sys.argv[1]
dist.init_process_group("neuron" if device == "neuron" else "gloo", timeout=datetime.timedelta(seconds=120))
if device == "neuron":
    torch.neuron.set_device(dist.get_rank())
mesh = init_device_mesh(device, (1, dist.get_world_size()), mesh_dim_names=("dp", "tp"))
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(HIDDEN, HIDDEN, bias=False), Block(), Block()).to(device)
parallelize_module(model[0], mesh["tp"], RowwiseParallel(input_layouts=Replicate()))
for block in model[1:]:
    parallelize_module(block, mesh["tp"], PLAN)
    if device == "neuron":
        block.compile(backend="neuron")
    fully_shard(block, mesh=mesh["dp"])
fully_shard(model, mesh=mesh["dp"])
losses, _ = train(model, device)
print(json.dumps(losses), flush=True)
dist.destroy_process_group()
