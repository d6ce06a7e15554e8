"""FSDP2 under torchtitan's selective (op) activation checkpointing, with a module sharded on its own inside the
checkpointed block and prefetched by the block before it: torchtitan's MoE with expert parallelism (issue 39). A
torch bug, on the CPU too (neuron-device's `_patches._patch_selective_checkpointing_fsdp_runtime`). A one-process
world here; two ranks of torchtitan's deepseek_v3 in `test_moe_expert_parallel`."""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts


def _every_other_mm_saved():
    """torchtitan's op-SAC policy: save every other mm, recompute the rest."""
    counts = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        if func is not torch.ops.aten.mm.default:
            return CheckpointPolicy.PREFER_RECOMPUTE
        counts[ctx.is_recompute] += 1
        return CheckpointPolicy.MUST_SAVE if counts[ctx.is_recompute] % 2 else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class _Experts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 8) / 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


class _Block(nn.Module):
    """Attention stand-in, then the experts, whose output the router's scores scale (that op's backward unpacks a
    saved tensor before the experts' pre-backward hook runs, so the recompute starts with the experts resharded)."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.Linear(8, 8)
        self.experts = _Experts()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.attention(x))
        return x + self.experts(hidden) * torch.sigmoid(hidden.sum(-1, keepdim=True))


def _model(checkpointed: bool, mesh) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(*(_Block() for _ in range(3)), nn.Linear(8, 1)).to(mesh.device_type)
    blocks = []
    for i in range(3):
        block = model[i]
        fully_shard(block.experts, mesh=mesh)
        if checkpointed:
            model[i] = checkpoint_wrapper(block, context_fn=_every_other_mm_saved, preserve_rng_state=False)
        fully_shard(model[i], mesh=mesh)
        blocks.append((model[i], block.experts))
    fully_shard(model, mesh=mesh)
    for (block, _), (after, experts) in itertools.pairwise(blocks):  # torchtitan's explicit prefetching under EP
        block.set_modules_to_forward_prefetch([after, experts])
    for (block, _), (before, experts) in itertools.pairwise(blocks[::-1]):
        block.set_modules_to_backward_prefetch([before, experts])
    return model


@pytest.mark.parametrize(("device", "backend"), [("cpu", "gloo"), ("neuron", "neuron")])
def test_selective_checkpointing_of_a_block_with_an_fsdp_submodule(device: str, backend: str) -> None:
    """Two steps' gradients equal those without checkpointing (it raised 'profiler._record_function_enter_new.default
    invocation index 2 encountered during backward but not found in storage', on the CPU too)."""
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh(device, (1,))
        x = torch.randn(16, 8, device=device)
        grads = []
        for checkpointed in (False, True):
            model = _model(checkpointed, mesh)
            for _ in range(2):
                model(x).sum().backward()
            grads.append([p.grad.full_tensor().cpu() for p in model.parameters()])
    finally:
        dist.destroy_process_group()
    for got, want in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(got, want)
