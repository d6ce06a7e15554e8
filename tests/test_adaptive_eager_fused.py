"""Adaptive eager's fused path with neuron-compile installed: a run of queued eager ops seen a second time is
handed to the `neuron_fuse` hook (its FX graph as host code, or Inductor's CPU backend under
`NEURON_COMPILE_HOST_CODE=inductor`, as the `compile-inductor` nox session runs it) and later runs call it. Results
are compared with the CPU: floating point to a tight tolerance (Inductor may reorder a reduction), integers exactly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from neuron_device.adaptive_eager import queue as adaptive_eager
from neuron_device.simulation import ledger

pytest.importorskip("neuron_compile")


@pytest.fixture
def adaptive():
    previous = adaptive_eager.set_enabled(True)
    yield
    adaptive_eager.set_enabled(previous)


class _Block(nn.Module):
    """RMS norm, a projection, rotary-style halves, softmax attention and a gated MLP: a decoder layer in small."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(dim, dim)
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        first, second = q.chunk(2, dim=-1)
        q = torch.cat((-second, first), dim=-1) * 0.5 + q
        scores = torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1)
        x = x + scores @ v
        gate, up = self.up(x).chunk(2, dim=-1)
        return x + self.down(nn.functional.silu(gate) * up)


def _close(got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got.cpu(), expected, rtol=2e-6, atol=1e-6)


def test_repeated_forward_is_compiled_and_matches_cpu(adaptive):
    torch.manual_seed(0)
    model = _Block().eval()
    x = torch.randn(2, 8, 16)
    with torch.no_grad():
        expected = model(x)
        device_model, nx = model.to("neuron"), x.to("neuron")
        before = adaptive_eager.stats()
        for _ in range(4):
            _close(device_model(nx), expected)
    after = adaptive_eager.stats()
    assert after["compiled"] > before["compiled"]
    assert after["fused_runs"] >= before["fused_runs"] + 2
    assert after["fuse_failures"] == before["fuse_failures"]


def test_fused_views_of_queued_results(adaptive):
    a, b = torch.randn(6, 6), torch.randn(6, 6)
    na, nb = a.to("neuron"), b.to("neuron")

    def views(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        p = x @ y
        q = p.t() * 2  # a transposed view of a queued result
        r = p[1:, :3] + q[1:, 1:4]  # offset views
        s = (p.view(36)[::5] + 1).view(-1, 1).expand(8, 3) * 1.5
        t = (x + 1).unsqueeze(0).expand(2, 6, 6).transpose(1, 2) * 3  # a queued result with a permuted layout
        return q, r, s, t[:, 2:, 1:] + t[1:, :4, :5].sum(0)

    before = adaptive_eager.stats()["fused_runs"]
    for _ in range(4):
        for got, expected in zip(views(na, nb), views(a, b), strict=True):
            _close(got, expected)
    assert adaptive_eager.stats()["fused_runs"] >= before + 2


def test_fused_integer_run_is_exact(adaptive):
    values = torch.arange(-20, 20, dtype=torch.int64).reshape(5, 8)
    device_values = values.to("neuron")

    def run(v: torch.Tensor) -> torch.Tensor:
        w = (v * 3 + 7).div(4, rounding_mode="floor")
        return torch.maximum(w, v.t().reshape(5, 8)) - w.sum(0)

    before = adaptive_eager.stats()["fused_runs"]
    for _ in range(4):
        assert torch.equal(run(device_values).cpu(), run(values))
    assert adaptive_eager.stats()["fused_runs"] >= before + 2


def test_fused_training_steps_match_cpu(adaptive):
    torch.manual_seed(0)
    model = _Block()
    x = torch.randn(2, 8, 16)
    loss = model(x).square().mean()
    loss.backward()
    expected = [p.grad.clone() for p in model.parameters()]
    device_model, nx = model.to("neuron"), x.to("neuron")
    before = adaptive_eager.stats()["fused_runs"]
    for _ in range(3):
        device_model.zero_grad(set_to_none=True)
        device_loss = device_model(nx).square().mean()
        device_loss.backward()
        _close(device_loss, loss.detach())
        for parameter, grad in zip(device_model.parameters(), expected, strict=True):
            _close(parameter.grad, grad)
    assert adaptive_eager.stats()["fused_runs"] > before


def test_equal_results_stay_distinct_tensors(adaptive):
    a, b = torch.randn(128, 256), torch.randn(128, 256)
    na, nb = a.to("neuron"), b.to("neuron")
    for _ in range(3):
        first, second = (na + nb) * 2, (na + nb) * 2  # Inductor computes this once: two outputs, one buffer
        first.add_(1)
        assert torch.equal(first.cpu(), (a + b) * 2 + 1)
        assert torch.equal(second.cpu(), (a + b) * 2)


def test_fused_kernel_is_one_launch(adaptive):
    a, b = torch.randn(32, 32).to("neuron"), torch.randn(32, 32).to("neuron")

    def run() -> float:
        return ((a @ b).relu() * 2 + 1).sum().item()

    expected = ((a.cpu() @ b.cpu()).relu() * 2 + 1).sum().item()
    run()
    run()
    ledger.clear_op_tracking()
    assert run() == pytest.approx(expected, rel=1e-6)
    launches = {launch.name: launch.calls for launch in ledger.launches()}
    assert launches.get(adaptive_eager.FUSED_KERNEL_NAME) == 1
    assert "aten::mm" not in launches and "aten::mm" in ledger.get_executed_ops()


def test_collectives_read_queued_results(adaptive):
    dist = pytest.importorskip("torch.distributed")
    pytest.importorskip("neuron_distributed")
    dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
    try:
        x = torch.arange(8, dtype=torch.float32)
        t = x.to("neuron") * 3 + 1
        assert adaptive_eager.pending_ops() > 0
        dist.all_reduce(t)  # reads the queued result: the queue runs first
        assert adaptive_eager.pending_ops() == 0
        assert torch.equal(t.cpu(), x * 3 + 1)
    finally:
        dist.destroy_process_group()
