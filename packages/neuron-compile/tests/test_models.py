"""Models compiled with `backend="neuron"`, `fullgraph=True`: forward outputs and 10 training steps match eager
`neuron` execution, and the simulated timeline charges less for the compiled (fused) step than for eager."""

from __future__ import annotations

import copy

import pytest
import torch
from models import CNN, MLP, decoder

from neuron_device import timeline

pytestmark = pytest.mark.compiler

STEPS = 10


def _model_and_batch(name: str) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    if name == "mlp":
        return MLP(), torch.randn(8, 16), torch.randint(0, 4, (8,))
    if name == "cnn":
        return CNN(), torch.randn(4, 3, 12, 12), torch.randint(0, 10, (4,))
    ids = torch.randint(0, 64, (2, 8))
    return decoder(name, layers=1), ids, torch.roll(ids, -1, dims=1)


def _loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


def _simulated_step_seconds(model, batch, target) -> float:
    clock = timeline.timeline(0)
    start = clock.synchronize()
    _loss(model(batch), target).backward()
    return clock.synchronize() - start


@pytest.mark.all_wheels  # neuron-nki's norm, softmax and attention kernels run in these models when installed
@pytest.mark.parametrize("name", ["mlp", "cnn", "llama", "gpt2", "mistral", "qwen2"])
def test_forward_and_training_match_eager(name: str) -> None:
    model, batch, target = _model_and_batch(name)
    eager = model.to("neuron")
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, backend="neuron", fullgraph=True, dynamic=False)
    batch, target = batch.to("neuron"), target.to("neuron")
    # SGD, not Adam: Adam normalises gradients that are zero in exact arithmetic (a key bias under softmax) into
    # full-size steps of rounding noise, which no two summation orders agree on.
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (eager, compiled_model)]
    tolerance = {"atol": 1e-4, "rtol": 1e-4}

    with torch.no_grad():
        torch.testing.assert_close(compiled(batch).cpu(), eager(batch).cpu(), **tolerance)
    for _ in range(STEPS):
        losses = []
        for module, optimizer in zip((eager, compiled), optimizers):
            optimizer.zero_grad()
            output = module(batch)
            assert output.device.type == "neuron"
            loss = _loss(output, target)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        assert losses[1] == pytest.approx(losses[0], rel=1e-3, abs=1e-4)
    for (key, want), got in zip(eager.state_dict().items(), compiled_model.state_dict().values()):
        torch.testing.assert_close(got.cpu(), want.cpu(), atol=1e-3, rtol=1e-3, msg=key)


@pytest.mark.all_wheels  # neuron-nki's kernels run in the transformer when installed
def test_compiled_transformer_step_costs_less_simulated_time_than_eager() -> None:
    model, batch, target = _model_and_batch("llama")
    eager = model.to("neuron")
    compiled = torch.compile(copy.deepcopy(eager), backend="neuron", fullgraph=True, dynamic=False)
    batch, target = batch.to("neuron"), target.to("neuron")
    _simulated_step_seconds(compiled, batch, target)  # compile outside the measurement
    eager_seconds = _simulated_step_seconds(eager, batch, target)
    compiled_seconds = _simulated_step_seconds(compiled, batch, target)
    assert 0 < compiled_seconds < eager_seconds
