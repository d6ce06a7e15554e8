"""Training script for `accelerate launch --num_processes 2` (run by test_accelerate_launch.py): each rank trains
its shard of one small regression problem and writes its final weights to `report-<rank>.json` in the working
directory (files, not stdout: the ranks' output interleaves)."""

import json
from pathlib import Path

import torch
from accelerate import Accelerator

STEPS = 5


def data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(16, 8, generator=generator)
    return inputs, inputs.sum(1, keepdim=True)


def model() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(8, 1)


def main() -> None:
    accelerator = Accelerator()
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    net, optimizer = accelerator.prepare(net, optimizer)
    rank, world = accelerator.process_index, accelerator.num_processes
    inputs, targets = data()
    x, y = inputs[rank::world].to(accelerator.device), targets[rank::world].to(accelerator.device)
    for _ in range(STEPS):
        optimizer.zero_grad()
        accelerator.backward(torch.nn.functional.mse_loss(net(x), y))
        optimizer.step()
    weight = accelerator.unwrap_model(net).weight.detach().cpu()
    report = {
        "rank": rank,
        "distributed_type": str(accelerator.distributed_type),
        "backend": torch.distributed.get_backend(),
        "device": str(accelerator.device),
        "weight": weight.tolist(),
    }
    Path(f"report-{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
