"""A plain training script whose parallelism is chosen on the command line: ddp, fsdp2, fsdp2_noreshard, hsdp (FSDP2
on a 2-D mesh: replicated over 4, sharded over 8), zero (DDP with ZeroRedundancyOptimizer), tp, none;
`--value-read` branches on the loss's value, `--width` sizes the model (the OOM tests)."""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("mode")
parser.add_argument("--width", type=int, default=256)
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--value-read", action="store_true")
args = parser.parse_args()

dist.init_process_group("neuron")
device = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
model = nn.Sequential(nn.Linear(args.width, 4 * args.width), nn.GELU(), nn.Linear(4 * args.width, args.width))
world = dist.get_world_size()
if args.mode in ("ddp", "zero"):
    model = nn.parallel.DistributedDataParallel(model.to(device))
elif args.mode.startswith("fsdp2") or args.mode == "hsdp":
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("neuron", (4, world // 4), mesh_dim_names=("replicate", "shard")) \
        if args.mode == "hsdp" else init_device_mesh("neuron", (world,))
    model.to(device)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh, reshard_after_forward=args.mode != "fsdp2_noreshard")
    fully_shard(model, mesh=mesh)
elif args.mode == "tp":
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("neuron", (world,))
    model = parallelize_module(model.to(device), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
else:
    model = model.to(device)
if args.mode == "zero":
    from torch.distributed.optim import ZeroRedundancyOptimizer

    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
else:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(2):
    x = torch.randn(args.batch, args.width, device=device)
    loss = model(x).square().mean()
    loss.backward()
    if args.value_read and loss.item() > 1e6:  # a branch on the loss's value
        print("diverged")
    optimizer.step()
    optimizer.zero_grad()
