"""The torch-neuronx DDP example's pattern, as a user runs it under torchrun: the device comes from
`torch_neuronx.current_device()` (the example used to catch the AttributeError and exit 0 having trained nothing).

Each rank writes `<out_dir>/rank<RANK>.json`: its device index, its losses and a checksum of its final weights.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_neuronx


def main(out_dir: Path) -> None:
    dist.init_process_group(backend="neuron", init_method="env://")
    rank = dist.get_rank()
    device = torch.device("neuron", torch_neuronx.current_device())
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1 + rank)  # each rank its own shard of the data
    inputs = torch.randn(64, 8, generator=generator)
    targets = inputs.sum(dim=1, keepdim=True)
    losses = []
    for _ in range(20):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs.to(device)), targets.to(device))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    result = {"rank": rank, "device": device.index, "local_rank": int(os.environ["LOCAL_RANK"]), "losses": losses,
              "checksum": checksum, "world_size": dist.get_world_size()}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown racing Gloo's threads (pytorch#190489), as the other workers
