"""DTensor's random ops on `neuron` (issue 39, item 3): its RNG tracker reads and shifts the device generator's
Philox-style (seed, offset) state, as on CUDA. A one-process world here; two ranks in `workers/training.py`
(`dtensor_random`)."""

from __future__ import annotations

import torch
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor import randn as dtensor_randn


def test_dtensor_random_ops_draw_the_cpus_numbers_and_advance_the_offset(mesh) -> None:
    """`uniform_` and `nn.init.trunc_normal_` on a DTensor parameter, and `torch.distributed.tensor.randn`: the
    numbers the CPU draws after the same seed (one shard: the tracker's offset is where the stream starts), then
    the state's offset advanced past the tensor, as DTensor's tracker sets it (it asserted: the state was a CPU
    generator's 5,056 bytes)."""
    torch.manual_seed(5)
    weight = torch.nn.Parameter(distribute_tensor(torch.empty(6, 4), mesh, [Replicate()]))
    torch.nn.init.trunc_normal_(weight, std=0.02)
    torch.manual_seed(5)
    assert torch.equal(weight.to_local().detach().cpu(), torch.nn.init.trunc_normal_(torch.empty(6, 4), std=0.02))

    torch.manual_seed(7)
    sharded = dtensor_randn(8, 4, device_mesh=mesh, placements=[Shard(0)])
    first = sharded.to_local().cpu()
    state = torch.neuron.get_rng_state()
    assert state.numel() == 16 and state[8:].view(torch.int64).item() == 32  # DTensor: old offset + numel
    sharded.uniform_()  # from offset 32: not the numbers of offset 0
    assert torch.neuron.get_rng_state()[8:].view(torch.int64).item() == 64
    second = sharded.to_local().cpu()
    torch.manual_seed(7)
    assert torch.equal(first, torch.randn(8, 4))
    torch.manual_seed(7)
    assert not torch.equal(second, torch.empty(8, 4).uniform_())
