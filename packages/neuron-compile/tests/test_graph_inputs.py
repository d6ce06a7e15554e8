"""Patterns from the Hugging Face architecture sweep (`benchmarks/hf_models.py --compile`), in plain torch: graph
inputs and ops that a compiled `neuron` graph must take as the same graph on CPU does."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.compiler


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def scale_by(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    return (x * table).sum()


def test_expanded_input_keeps_its_strides() -> None:
    """An expanded (stride-0) input, as BigBird's `token_type_ids` buffer reaches the graph after a graph break: the
    graph is compiled for the input's real layout, not for a contiguous copy of it."""
    x = torch.randn(2, 12, requires_grad=True)
    table = torch.arange(12.0).expand(2, 12)
    expected = scale_by(x, table)
    expected.backward()
    x_neuron = x.detach().to("neuron").requires_grad_()
    table_neuron = torch.arange(12.0, device="neuron").expand(2, 12)
    assert table_neuron.stride() == (0, 1)
    result = torch.compile(scale_by, backend="neuron")(x_neuron, table_neuron)
    result.backward()
    torch.testing.assert_close(result.cpu(), expected)
    torch.testing.assert_close(x_neuron.grad.cpu(), x.grad)
