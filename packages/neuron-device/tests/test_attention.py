"""`scaled_dot_product_attention` on `neuron` takes the fused flash kernel wherever the CPU does, and matches it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx

# SDPA and multi-head attention run neuron-nki's kernels when it is installed (all session)
pytestmark = pytest.mark.all_wheels

_FLASH = {"aten::_scaled_dot_product_flash_attention_for_cpu", "nki::flash_attention_fwd"}  # nki: when installed
_FLASH_BACKWARD = {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", "nki::flash_attention_bwd"}


def _run(device: str, inputs: list[torch.Tensor], **options) -> tuple[torch.Tensor, list[torch.Tensor]]:
    leaves = [t.detach().to(device).requires_grad_() for t in inputs]
    out = F.scaled_dot_product_attention(*leaves, **options)
    out.backward(torch.ones_like(out))
    return out.detach().cpu(), [t.grad.cpu() for t in leaves]


@pytest.mark.parametrize("options, shapes", [
    ({"is_causal": True}, [(2, 4, 33, 16)] * 3),
    ({"enable_gqa": True}, [(1, 4, 20, 8), (1, 2, 24, 8), (1, 2, 24, 8)]),
    ({"scale": 0.3}, [(1, 2, 7, 8), (1, 2, 9, 8), (1, 2, 9, 8)]),
], ids=["causal", "gqa", "scale"])
def test_sdpa_takes_the_flash_kernel_and_matches_cpu(options: dict, shapes: list) -> None:
    torch.manual_seed(0)
    inputs = [torch.randn(shape) for shape in shapes]
    torch_neuronx.clear_op_tracking()
    out, grads = _run("neuron", inputs, **options)
    executed = set(torch_neuronx.get_executed_ops())
    assert executed & _FLASH and executed & _FLASH_BACKWARD
    assert "aten::_safe_softmax" not in executed and not torch_neuronx.get_fallback_ops()
    expected, expected_grads = _run("cpu", inputs, **options)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_sdpa_with_a_mask_that_requires_grad_takes_the_math_path_as_on_cpu() -> None:
    torch.manual_seed(0)
    q = torch.randn(1, 2, 8, 16)
    mask = torch.randn(1, 1, 8, 8)
    torch_neuronx.clear_op_tracking()
    on_device = mask.to("neuron").requires_grad_()
    out = F.scaled_dot_product_attention(q.to("neuron"), q.to("neuron"), q.to("neuron"), attn_mask=on_device)
    out.sum().backward()
    assert not set(torch_neuronx.get_executed_ops()) & _FLASH
    cpu_mask = mask.clone().requires_grad_()
    F.scaled_dot_product_attention(q, q, q, attn_mask=cpu_mask).sum().backward()
    torch.testing.assert_close(on_device.grad.cpu(), cpu_mask.grad)


def test_boolean_mask_converts_as_on_cpu() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 8) for _ in range(3))
    mask = torch.rand(6, 6) > 0.3
    mask.fill_diagonal_(True)
    out = F.scaled_dot_product_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"), attn_mask=mask.to("neuron"))
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


def test_dropout_draws_from_the_device_generator_and_zero_dropout_draws_nothing() -> None:
    q = torch.randn(1, 2, 16, 8, device="neuron")

    def attend(p: float) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, q, q, dropout_p=p).cpu()

    torch.neuron.manual_seed(3)
    first = attend(0.5)
    state = torch.neuron.get_rng_state()
    torch.neuron.manual_seed(3)
    torch.default_generator.manual_seed(123)  # the CPU generator plays no part
    torch.testing.assert_close(attend(0.5), first)
    assert not torch.equal(first, attend(0.0))
    attend(0.0)
    assert torch.equal(torch.neuron.get_rng_state(), state)  # no dropout, no draw


@pytest.mark.parametrize("padded", [False, True])
def test_multihead_attention_fast_path_is_native_and_matches_cpu(padded):
    """Issue 19, item 13: `nn.MultiheadAttention` in inference takes `_native_multi_head_attention`, which fell back
    to the CPU; it now runs as projections + the SDPA route on `neuron`."""
    import torch_neuronx

    torch.manual_seed(0)
    module = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    padding = torch.tensor([[False] * 5, [False, False, False, True, True]]) if padded else None
    with torch.no_grad():
        expected, _ = module(x, x, x, key_padding_mask=padding, need_weights=False)
        module.to("neuron")
        torch_neuronx.clear_op_tracking()
        on_neuron = x.to("neuron")
        actual, weights = module(on_neuron, on_neuron, on_neuron, need_weights=False,
                                 key_padding_mask=None if padding is None else padding.to("neuron"))
    assert weights is None
    assert "aten::_native_multi_head_attention" not in torch_neuronx.get_fallback_ops()
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-5, atol=1e-5)
