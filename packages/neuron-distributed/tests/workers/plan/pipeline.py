"""A pipeline-parallel training script: a (dp, pp) device mesh, an MLP cut into `pp x stages-per-rank` stages run
by `torch.distributed.pipelining` (gpipe, 1f1b, interleaved), gradients all-reduced over dp, SGD.

`--split-copy` builds the stages as torchtitan's `pipeline_module_split` does: the whole model on the meta device
(its blocks in a `ModuleDict` by their numbers), one `copy.deepcopy` of it per stage with the other stages' blocks
deleted (a stage keeps its block under its number in the whole model), then `to_empty` on the device and an
initialisation. `--deeper-stage N` gives stage N's block a layer more. `--pp-outer` lays the mesh out (pp, dp):
consecutive stages are dp ranks apart, so on a cluster some are on other instances. `--fsdp` shards each stage with FSDP2 over dp as torchtitan does under PP (`fully_shard`,
`reshard_after_forward=False`: the parameters stay unsharded from the first micro-batch's forward to the schedule's
last backward), its gradients reduced by FSDP instead of the all-reduce."""

import argparse
import copy
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}
parser = argparse.ArgumentParser()
parser.add_argument("schedule", choices=sorted(SCHEDULES))
parser.add_argument("--pp", type=int, default=4)
parser.add_argument("--stages-per-rank", type=int, default=1)
parser.add_argument("--micro-batches", type=int, default=8)
parser.add_argument("--width", type=int, default=256)
parser.add_argument("--no-input-shape", action="store_true", help="build later stages without input_args")
parser.add_argument("--split-copy", action="store_true", help="stages from a deepcopy of the whole model on meta")
parser.add_argument("--fsdp", action="store_true", help="each stage sharded by FSDP2 over dp, as torchtitan's PP")
parser.add_argument("--deeper-stage", type=int, help="this stage's block has a hidden layer more")
parser.add_argument("--pp-outer", action="store_true", help="the mesh (pp, dp): a stage's ranks are dp apart")
args = parser.parse_args()

dist.init_process_group("neuron")
device = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
dims = {"dp": dist.get_world_size() // args.pp, "pp": args.pp}
order = ("pp", "dp") if args.pp_outer else ("dp", "pp")
mesh = init_device_mesh("neuron", tuple(dims[name] for name in order), mesh_dim_names=order)
pp_rank, count = mesh["pp"].get_local_rank(), args.pp * args.stages_per_rank


def block(index: int) -> nn.Sequential:
    layers = [nn.Linear(args.width, args.width), nn.GELU(), nn.Linear(args.width, args.width)]
    if index == args.deeper_stage:
        layers += [nn.GELU(), nn.Linear(args.width, args.width)]
    if index == count - 1:
        layers.append(nn.Linear(args.width, 1))  # the last stage is heavier: one more layer
    return nn.Sequential(*layers)


class Model(nn.Module):
    """Blocks by their numbers in the whole model, as torchtitan's `Transformer.layers`."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({str(index): block(index) for index in range(count)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers.values():
            x = layer(x)
        return x


if args.split_copy:
    with torch.device("meta"):
        whole = Model(count)
stages, parameters = [], []
for index in range(pp_rank, count, args.pp):
    if args.split_copy:  # torchtitan's way: a copy of the whole model, the other stages' layers deleted
        module = copy.deepcopy(whole)
        for other in range(count):
            if other != index:
                del module.layers[str(other)]
        module = module.to_empty(device=device)
        for layer in module.modules():
            if isinstance(layer, nn.Linear):
                layer.reset_parameters()
    else:
        module = block(index).to(device)
    if args.fsdp:
        fully_shard(module, mesh=mesh["dp"], reshard_after_forward=False)
    parameters += list(module.parameters())
    shape = None if index == 0 or args.no_input_shape else (
        torch.empty(4, args.width, device="meta", requires_grad=True),)  # a received activation requires grad
    stages.append(PipelineStage(module, index, count, device, input_args=shape, group=mesh["pp"].get_group()))
loss_fn = lambda output, target: (output - target).square().mean()  # noqa: E731
Schedule = SCHEDULES[args.schedule]
schedule = Schedule(stages if args.schedule == "interleaved" else stages[0], n_microbatches=args.micro_batches,
                    loss_fn=loss_fn)
optimizer = torch.optim.SGD(parameters, lr=1e-3)
for _ in range(2):
    x = torch.randn(4 * args.micro_batches, args.width, device=device)
    target = torch.randn(4 * args.micro_batches, 1, device=device)
    inputs = (x,) if any(stage.is_first for stage in stages) else ()
    schedule.step(*inputs, **({"target": target} if any(stage.is_last for stage in stages) else {}))
    for p in parameters if not args.fsdp else ():
        dist.all_reduce(p.grad, group=mesh["dp"].get_group())
    optimizer.step()
    optimizer.zero_grad()
