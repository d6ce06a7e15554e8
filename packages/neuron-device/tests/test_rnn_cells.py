"""LSTM and GRU on `neuron` (the fused cell kernels in `ops/rnn_cells.py`), against the same modules on CPU."""

from __future__ import annotations

import pytest
import torch

DEVICE = "neuron"


def _pair(cls, **kwargs):
    torch.manual_seed(0)
    cpu = cls(**kwargs)
    neuron = cls(**kwargs)
    neuron.load_state_dict(cpu.state_dict())
    return cpu, neuron.to(DEVICE)


def _check_grads(cpu: torch.nn.Module, neuron: torch.nn.Module) -> None:
    for (name, p), q in zip(cpu.named_parameters(), neuron.parameters(), strict=True):
        assert q.grad.device.type == DEVICE, name
        torch.testing.assert_close(q.grad.cpu(), p.grad, msg=name)


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU], ids=["LSTM", "GRU"])
def test_rnn_modules_match_cpu(cls, bias, bidirectional):
    cpu, neuron = _pair(cls, input_size=4, hidden_size=8, num_layers=2, bias=bias, bidirectional=bidirectional)
    x = torch.randn(5, 3, 4, generator=torch.Generator().manual_seed(1), requires_grad=True)
    xn = x.detach().to(DEVICE).requires_grad_()
    out, state = cpu(x)
    out_n, state_n = neuron(xn)
    torch.testing.assert_close(out_n.cpu(), out)
    for s, s_n in zip(torch.utils._pytree.tree_leaves(state), torch.utils._pytree.tree_leaves(state_n), strict=True):
        torch.testing.assert_close(s_n.cpu(), s)
    out.pow(2).sum().backward()
    out_n.pow(2).sum().backward()
    torch.testing.assert_close(xn.grad.cpu(), x.grad)
    _check_grads(cpu, neuron)


@pytest.mark.parametrize("cls", [torch.nn.LSTMCell, torch.nn.GRUCell], ids=["LSTMCell", "GRUCell"])
def test_cells_match_cpu_with_initial_state(cls):
    cpu, neuron = _pair(cls, input_size=4, hidden_size=6)
    g = torch.Generator().manual_seed(2)
    x, h = torch.randn(3, 4, generator=g), torch.randn(3, 6, generator=g)
    state = (h, torch.randn(3, 6, generator=g)) if cls is torch.nn.LSTMCell else h
    result = cpu(x, state)
    result_n = neuron(x.to(DEVICE), torch.utils._pytree.tree_map(lambda t: t.to(DEVICE), state))
    for r, r_n in zip(torch.utils._pytree.tree_leaves(result), torch.utils._pytree.tree_leaves(result_n), strict=True):
        torch.testing.assert_close(r_n.cpu(), r)
    sum(r.sum() for r in torch.utils._pytree.tree_leaves(result)).backward()
    sum(r.sum() for r in torch.utils._pytree.tree_leaves(result_n)).backward()
    _check_grads(cpu, neuron)


def test_lstm_gradient_through_cell_state_only():
    cpu, neuron = _pair(torch.nn.LSTMCell, input_size=4, hidden_size=6)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(3))
    cpu(x)[1].sum().backward()
    neuron(x.to(DEVICE))[1].sum().backward()
    _check_grads(cpu, neuron)


def test_double_backward():
    cpu, neuron = _pair(torch.nn.LSTMCell, input_size=4, hidden_size=6)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(4), requires_grad=True)
    xn = x.detach().to(DEVICE).requires_grad_()
    (grad,) = torch.autograd.grad(cpu(x)[0].pow(2).sum(), x, create_graph=True)
    (grad_n,) = torch.autograd.grad(neuron(xn)[0].pow(2).sum(), xn, create_graph=True)
    torch.testing.assert_close(grad_n.cpu(), grad)
    grad.sum().backward()
    grad_n.sum().backward()
    _check_grads(cpu, neuron)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_cell_is_close_to_fp32(dtype):
    cpu, neuron = _pair(torch.nn.GRU, input_size=4, hidden_size=8)
    x = torch.randn(5, 3, 4, generator=torch.Generator().manual_seed(5))
    out_n, _ = neuron.to(dtype)(x.to(DEVICE, dtype))
    assert out_n.dtype is dtype
    torch.testing.assert_close(out_n.cpu().float(), cpu(x)[0], atol=2e-2, rtol=2e-2)


def test_mismatched_dtypes_raise():
    gates = torch.randn(2, 12, device=DEVICE)
    with pytest.raises(RuntimeError, match=r"expected all tensors to have dtype torch\.float32"):
        torch.ops.aten._thnn_fused_gru_cell(gates, gates, torch.randn(2, 4, device=DEVICE, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="do not match a hidden state"):
        torch.ops.aten._thnn_fused_lstm_cell(gates, gates, torch.randn(2, 4, device=DEVICE))
