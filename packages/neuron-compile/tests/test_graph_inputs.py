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


def pick_by_argmax(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    index = (x @ w).argmax(-1, keepdim=True)
    return x.gather(-1, index).sum()


def test_input_used_only_through_indices_gets_no_gradient() -> None:
    """A parameter that only selects (a sparse-attention indexer's `topk`) has no gradient in eager mode: the
    compiled graph must not give it a zero one (the sweep compares which parameters have gradients)."""
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)
    pick_by_argmax(x, w).backward()
    assert w.grad is None
    x_neuron = x.detach().to("neuron").requires_grad_()
    w_neuron = w.detach().to("neuron").requires_grad_()
    torch.compile(pick_by_argmax, backend="neuron")(x_neuron, w_neuron).backward()
    assert w_neuron.grad is None
    torch.testing.assert_close(x_neuron.grad.cpu(), x.grad)


def write_rows(rows: torch.Tensor, into: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    into[index] = rows * 2
    return rows.sum()


def _write_rows_then_use(device: str, backend: str | None, target: str) -> list[torch.Tensor]:
    """Gradients of `write_rows` into `target`, then an eager use of the written tensor (its new history must reach
    `rows`): "fresh" is a buffer without autograd history (Longformer's `key_vectors_only_global`), "non-leaf" an
    intermediate (its `attn_output`), "view" a strided view of one (its `attn_probs`)."""
    torch._dynamo.reset()
    rows = torch.arange(6.0).reshape(2, 3).to(device).requires_grad_()
    base = torch.ones(4, 5, device=device, requires_grad=True)
    into = {"fresh": lambda: torch.zeros(4, 3, device=device),
            "non-leaf": lambda: base[:, :3] * 3,
            "view": lambda: (base * 3).t()[:3].t()}[target]()
    index = torch.tensor([3, 1], device=device)
    run = torch.compile(write_rows, backend=backend) if backend else write_rows
    weights = torch.arange(12.0, device=device).reshape(4, 3)
    (run(rows, into, index) + (into * weights).sum()).backward()
    return [rows.grad.cpu(), base.grad.cpu() if base.grad is not None else torch.zeros(4, 5)]


@pytest.mark.parametrize("target", ["fresh", "non-leaf", "view"])
def test_input_written_in_place_keeps_its_gradient(target: str) -> None:
    """A graph that writes into its input with autograd recording: AOTAutograd copies the new value into the input
    (its host alias here) after the graph; the `neuron` input must take that write's history as in eager mode. Before,
    a fresh buffer failed ("a view ... is being modified inplace") and a non-leaf lost the write's gradient."""
    expected = _write_rows_then_use("cpu", None, target)
    got = _write_rows_then_use("neuron", "neuron", target)
    for grad, want in zip(got, expected):
        torch.testing.assert_close(grad, want)
