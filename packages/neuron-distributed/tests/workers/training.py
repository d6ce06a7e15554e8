"""Training on backend `neuron` for 10 steps, compared with one CPU process training on the whole batch.

Usage: training.py <checkpoint dir> [check ...]. Every rank computes the single-process CPU reference itself (same
seed, same data), so each rank can compare its own result.
"""

from __future__ import annotations

import copy
import datetime
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from common import finish, run_checks
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel

CHECKPOINT_DIR = sys.argv[1]
dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=90))
RANK, WORLD = dist.get_rank(), dist.get_world_size()
DEVICE = torch.device("neuron", torch.neuron.current_device())  # neuron:<LOCAL_RANK>
STEPS, BATCH, DIM, HIDDEN, LR = 10, 8, 8, 16, 0.05
TOL = 1e-5


def make_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, DIM)
    )


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, DIM, generator=generator), torch.randn(BATCH, DIM, generator=generator)


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out, target)


class SequenceBlock(nn.Module):
    """LayerNorm then an MLP, on [batch, sequence, DIM] inputs (the sequence-parallel layout)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.norm, self.up, self.down = nn.LayerNorm(DIM), nn.Linear(DIM, HIDDEN), nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(self.norm(x))))


def sequence_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = batch(step)
    return x.view(2, BATCH // 2, DIM), y.view(2, BATCH // 2, DIM)


def reference(factory: Callable[[], nn.Module], data: Callable[[int], tuple]) -> dict[str, torch.Tensor]:
    """Single-process CPU training on the whole batch: the expected parameters after STEPS steps."""
    model = factory()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = data(step)
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


REFERENCE = reference(make_model, batch)


def full(value: torch.Tensor) -> torch.Tensor:
    return (value.full_tensor() if isinstance(value, DTensor) else value).detach().cpu().float()


def assert_matches(state: dict[str, torch.Tensor], atol: float = TOL, expected: dict | None = None) -> None:
    assert state, "no parameters to compare"
    for name, value in state.items():
        want = (REFERENCE if expected is None else expected)[name.removeprefix("module.")]
        torch.testing.assert_close(full(value), want, rtol=0, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


def train(model: nn.Module, shard: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """STEPS steps of SGD; `shard` picks this rank's part of the global batch."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = batch(step)
        optimizer.zero_grad()
        loss_fn(model(shard(x).to(DEVICE)), shard(y).to(DEVICE)).backward()
        optimizer.step()


def data_shard(rank: int, size: int) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda t: t.chunk(size)[rank]


def ddp(hook: Callable | None = None) -> Callable[[], None]:
    def check() -> None:
        model = DistributedDataParallel(make_model().to(DEVICE), device_ids=[DEVICE.index])
        if hook is not None:
            model.register_comm_hook(None, hook)
        train(model, data_shard(RANK, WORLD))
        assert_matches(model.state_dict(), atol=TOL if hook is None else 2e-3)

    return check


def fsdp2(**options) -> Callable[[], None]:
    def check() -> None:
        mesh = init_device_mesh("neuron", (WORLD,))
        model = make_model().to(DEVICE) if "offload_policy" not in options else make_model()
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh, **options)
        fully_shard(model, mesh=mesh, **options)
        train(model, data_shard(RANK, WORLD))
        mixed = "mp_policy" in options
        assert_matches(model.state_dict(), atol=3e-2 if mixed else TOL)

    return check


def tensor_parallel() -> None:
    mesh = init_device_mesh("neuron", (WORLD,))
    plan = {"0": ColwiseParallel(), "2": RowwiseParallel(), "4": ColwiseParallel(output_layouts=Replicate())}
    model = parallelize_module(make_model().to(DEVICE), mesh, plan)
    assert isinstance(model[0].weight, DTensor) and model[0].weight.placements == (Shard(0),)
    train(model, lambda t: t)  # every TP rank sees the whole batch
    assert_matches(model.state_dict())


def sequence_parallel() -> None:
    """LayerNorm sequence-parallel, MLP tensor-parallel; each rank holds half of the sequence."""
    mesh = init_device_mesh("neuron", (WORLD,))
    plan = {
        "norm": SequenceParallel(),
        "up": ColwiseParallel(input_layouts=Shard(1)),
        "down": RowwiseParallel(output_layouts=Shard(1)),
    }
    model = parallelize_module(SequenceBlock().to(DEVICE), mesh, plan)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = (t.chunk(WORLD, dim=1)[RANK].to(DEVICE) for t in sequence_batch(step))
        optimizer.zero_grad()
        # replicated parameters sum their gradients over ranks: each rank's loss is its share of the global mean
        (nn.functional.mse_loss(model(x), y, reduction="sum") / (BATCH * DIM)).backward()
        optimizer.step()
    assert isinstance(model.norm.weight, DTensor) and model.norm.weight.placements == (Replicate(),)
    assert_matches(model.state_dict(), expected=reference(SequenceBlock, sequence_batch))


def dtensor_random() -> None:
    """DTensor random ops on neuron (issue 39, item 3), as on CUDA: a replicated tensor draws the same numbers on
    every rank (the CPU's, after the same seed), a sharded one different numbers per shard, and every rank's
    generator state is the same afterwards (each set past the whole tensor)."""
    mesh = init_device_mesh("neuron", (WORLD,))
    torch.manual_seed(5)
    weight = nn.Parameter(distribute_tensor(torch.empty(6, 4, device=DEVICE), mesh, [Replicate()]))
    nn.init.trunc_normal_(weight, std=0.02)
    torch.manual_seed(5)
    assert torch.equal(weight.to_local().detach().cpu(), nn.init.trunc_normal_(torch.empty(6, 4), std=0.02))
    sharded = distribute_tensor(torch.empty(8, 4, device=DEVICE), mesh, [Shard(0)]).uniform_()
    whole = sharded.full_tensor().cpu()
    assert not torch.equal(whole[:4], whole[4:])
    states = [torch.empty(16, dtype=torch.uint8, device=DEVICE) for _ in range(WORLD)]
    dist.all_gather(states, torch.neuron.get_rng_state().to(DEVICE))
    assert all(torch.equal(state.cpu(), states[0].cpu()) for state in states), states


def dtensor_2d() -> None:
    """DTensor on a 2-D neuron mesh: distribute, redistribute over each dimension, gather back."""
    mesh = init_device_mesh("neuron", (WORLD // 2, 2), mesh_dim_names=("dp", "tp"))
    source = torch.arange(64.0).view(8, 8)
    tensor = distribute_tensor(source.to(DEVICE), mesh, [Shard(0), Shard(1)])
    assert tensor.to_local().shape == (8 // (WORLD // 2), 4) and tensor.to_local().device.type == "neuron"
    moved = tensor.redistribute(mesh, [Replicate(), Shard(0)])
    assert moved.to_local().shape == (4, 8)
    doubled = (moved * 2).redistribute(mesh, [Replicate(), Replicate()])
    torch.testing.assert_close(doubled.to_local().cpu(), source * 2, rtol=0, atol=0)
    total = tensor.sum()  # a Partial result reduced over both dimensions
    torch.testing.assert_close(total.full_tensor().cpu(), source.sum(), rtol=0, atol=0)


def fsdp_tp_2d() -> None:
    mesh = init_device_mesh("neuron", (WORLD // 2, 2), mesh_dim_names=("dp", "tp"))
    model = parallelize_module(
        make_model().to(DEVICE), mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()}
    )
    for index in ("0", "2", "4"):
        fully_shard(model.get_submodule(index), mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    train(model, data_shard(mesh["dp"].get_local_rank(), mesh["dp"].size()))
    assert_matches(model.state_dict())


def pipeline(schedule_class: type) -> Callable[[], None]:
    def check() -> None:
        layers = list(make_model().children())
        cut = [(0, 2), (2, 5)][RANK]
        stage_module = nn.Sequential(*layers[cut[0] : cut[1]]).to(DEVICE)
        stage = PipelineStage(stage_module, RANK, WORLD, DEVICE)
        # scale_grads (the default) averages the microbatches' gradients, as the reference's batch mean does
        schedule = schedule_class(stage, n_microbatches=4, loss_fn=loss_fn)
        optimizer = torch.optim.SGD(stage_module.parameters(), lr=LR)
        for step in range(STEPS):
            x, y = batch(step)
            optimizer.zero_grad()
            if RANK == 0:
                schedule.step(x.to(DEVICE))
            else:
                losses: list[torch.Tensor] = []
                schedule.step(target=y.to(DEVICE), losses=losses)
                assert len(losses) == 4
            optimizer.step()
        state = {
            f"{int(k.split('.')[0]) + cut[0]}.{k.split('.')[1]}": v
            for k, v in stage_module.state_dict().items()
        }
        assert_matches(state)

    return check


def accelerate_multi_neuron() -> None:
    """accelerate's own MULTI_NEURON path: `Accelerator()` on the running group, DDP with device_ids=[local_rank],
    its sharded data loader; then its reduce and gather."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedType

    accelerator = Accelerator()
    assert accelerator.distributed_type == DistributedType.MULTI_NEURON, accelerator.distributed_type
    assert accelerator.device == DEVICE, accelerator.device
    steps = [batch(step) for step in range(STEPS)]
    dataset = torch.utils.data.TensorDataset(
        torch.cat([x for x, _ in steps]), torch.cat([y for _, y in steps])
    )
    model = make_model()
    # each process takes every WORLD-th batch of BATCH // WORLD samples: together, the reference's batch of each step
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH // WORLD)
    model, optimizer, loader = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=LR), loader)
    for x, y in loader:
        optimizer.zero_grad()
        accelerator.backward(loss_fn(model(x), y))
        optimizer.step()
    assert_matches(accelerator.unwrap_model(model).state_dict())
    total = accelerator.reduce(torch.ones(1, device=DEVICE), reduction="sum")
    assert total.item() == WORLD, total
    gathered = accelerator.gather(torch.full((1,), float(RANK), device=DEVICE))
    assert gathered.cpu().tolist() == [float(r) for r in range(WORLD)], gathered


def checkpoint() -> None:
    """DCP save of an FSDP2 model, load into a differently initialised one: the same full parameters."""
    mesh = init_device_mesh("neuron", (WORLD,))
    trained = make_model().to(DEVICE)
    fully_shard(trained, mesh=mesh)
    train(trained, data_shard(RANK, WORLD))
    dcp.save(trained.state_dict(), checkpoint_id=CHECKPOINT_DIR)
    torch.manual_seed(1)
    fresh = nn.Sequential(*[copy.deepcopy(m) for m in make_model()]).to(DEVICE)
    with torch.no_grad():
        for p in fresh.parameters():
            p.normal_()
    fully_shard(fresh, mesh=mesh)
    state = fresh.state_dict()
    dcp.load(state, checkpoint_id=CHECKPOINT_DIR)
    fresh.load_state_dict(state)
    for (name, a), (_, b) in zip(trained.state_dict().items(), fresh.state_dict().items(), strict=True):
        assert isinstance(b, DTensor) and b.device.type == "neuron", (name, type(b), b.device)
        torch.testing.assert_close(full(b), full(a), rtol=0, atol=0)
    assert_matches(fresh.state_dict())


CHECKS = {
    "ddp": ddp(),
    "ddp_fp16_compress_hook": ddp(
        __import__(
            "torch.distributed.algorithms.ddp_comm_hooks.default_hooks"
        ).distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook
    ),
    "fsdp2": fsdp2(),
    "fsdp2_no_reshard": fsdp2(reshard_after_forward=False),
    "fsdp2_bf16": fsdp2(
        mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    ),
    "fsdp2_cpu_offload": fsdp2(offload_policy=CPUOffloadPolicy(pin_memory=False)),
    "tp": tensor_parallel,
    "dtensor_random": dtensor_random,
    "sp": sequence_parallel,
    "pp_gpipe": pipeline(ScheduleGPipe),
    "pp_1f1b": pipeline(Schedule1F1B),
    "dcp": checkpoint,
    "accelerate": accelerate_multi_neuron,
    "fsdp_tp_2d": fsdp_tp_2d,
    "dtensor_2d": dtensor_2d,
}

run_checks(CHECKS, sys.argv[2:])
dist.destroy_process_group()
print("CHECK destroy OK")
finish()
