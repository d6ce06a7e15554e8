"""Kernel partitioning and fusion on AOT-level graphs, and the simulated time of the resulting plan."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_compile.passes import KernelPlan, plan_kernels


def _plan(fn, *args) -> KernelPlan:
    return plan_kernels(make_fx(fn, tracing_mode="fake")(*args))


def test_pointwise_and_reduction_chain_fuses_into_the_matmul() -> None:
    x, w, b = torch.randn(32, 64), torch.randn(64, 16), torch.randn(16)
    plan = _plan(lambda x, w, b: torch.relu(torch.mm(x, w) + b).sum(1), x, w, b)
    assert len(plan.kernels) == 1
    (kernel,) = plan.kernels
    assert kernel.work["tensor"] == 2 * 32 * 64 * 16
    # Only what crosses the kernel boundary moves: x, w, b in, the 32 sums out (the 32x16 product stays on chip).
    assert kernel.hbm_bytes == 4 * (32 * 64 + 64 * 16 + 16 + 32)


def test_views_are_free_and_data_movement_does_not_absorb_pointwise() -> None:
    x = torch.randn(8, 4)
    plan = _plan(lambda x: torch.cat([x, x]).t().exp(), x)
    assert [k.anchor_engine for k in plan.kernels] == ["dma", "scalar"]


def test_fusion_lowers_simulated_time() -> None:
    x = torch.randn(256, 256)

    def chain(x):
        return ((x * 2 + 1).tanh() * 3).sum()

    fused = _plan(chain, x)
    unfused = KernelPlan([k for op in (lambda x: x * 2, lambda x: x + 1, torch.tanh, lambda x: x * 3, torch.sum)
                          for k in _plan(op, x).kernels])
    assert len(fused.kernels) == 1 and len(unfused.kernels) == 5
    assert fused.seconds < unfused.seconds


def test_plan_round_trips_through_json() -> None:
    plan = _plan(lambda x: (x @ x).relu(), torch.randn(4, 4))
    again = KernelPlan.from_json(plan.to_json())
    assert again.to_json() == plan.to_json() and again.seconds == plan.seconds
