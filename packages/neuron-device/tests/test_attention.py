"""`scaled_dot_product_attention` on `neuron` takes the fused attention op (TorchNeuron's
`_scaled_dot_product_fused_attention_overrideable`), run as the flash kernel, wherever the CPU takes its flash kernel,
and matches it."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import torch_neuronx

# SDPA and multi-head attention run neuron-nki's kernels when it is installed (all session)
pytestmark = pytest.mark.all_wheels

_FLASH = {"aten::_scaled_dot_product_flash_attention_for_cpu", "nki::flash_attention_fwd"}  # nki: when installed
_FLASH_BACKWARD = {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", "nki::flash_attention_bwd"}
_FUSED = {"aten::_scaled_dot_product_fused_attention_overrideable",
          "aten::_scaled_dot_product_fused_attention_overrideable_backward"}


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
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        out, grads = _run("neuron", inputs, **options)
    assert _FUSED <= {event.name for event in profiler.events()}  # the op context parallelism shards
    executed = set(torch_neuronx.get_executed_ops())  # the kernels launched: the flash kernel's
    assert executed & _FLASH and executed & _FLASH_BACKWARD
    assert "aten::_safe_softmax" not in executed and not torch_neuronx.get_fallback_ops()
    expected, expected_grads = _run("cpu", inputs, **options)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_sdpa_under_inference_mode_takes_the_flash_kernel_and_matches_cpu() -> None:
    """`inference_mode` skips autograd's dispatch keys, where the route to the fused op sits; the route is on the
    backend key too (as TorchNeuron's C++ choice is made under any mode), so serving code does not fall to the math
    path's S x S scores."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 24, 8) for _ in range(3))
    torch_neuronx.clear_op_tracking()
    with torch.inference_mode():
        out = F.scaled_dot_product_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"), is_causal=True)
    executed = set(torch_neuronx.get_executed_ops())
    assert executed & _FLASH and "aten::bmm" not in executed and not torch_neuronx.get_fallback_ops()
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, k, v, is_causal=True),
                               atol=1e-5, rtol=1e-5)


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


def _sliding_window(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx < 200)


def _flex_reference(q, k, v, bias, mask):
    """flex attention with score `s + bias[h] * (q - kv) / S` under `mask`, as SDPA's math on the CPU."""
    length = q.shape[-2]
    distance = (torch.arange(length)[:, None] - torch.arange(length)[None]) / length
    scores = torch.where(mask, bias.view(-1, 1, 1) * distance, -math.inf)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=scores)


def _flex(device: str, inputs: list[torch.Tensor], masked: bool):
    q, k, v, bias = (t.detach().to(device).requires_grad_() for t in inputs)
    length = q.shape[-2]

    def relative_bias(score, b, h, q_idx, kv_idx):
        return score + bias[h] * (q_idx - kv_idx) / length

    block_mask = create_block_mask(_sliding_window, 1, 1, length, length, device=device) if masked else None
    out = flex_attention(q, k, v, score_mod=relative_bias, block_mask=block_mask)
    out.backward(torch.cos(torch.arange(out.numel(), dtype=out.dtype)).view_as(out).to(device))
    return out.detach().cpu(), [t.grad.cpu() for t in (q, k, v, bias)]


@pytest.mark.parametrize("masked", [True, False], ids=["block_mask", "no_mask"])
def test_flex_attention_is_one_flash_kernel_and_matches_cpu(masked: bool) -> None:
    """Issue 39, item 5: torchtitan's attention. `flex_attention` on `neuron` (it was refused: "only supported on
    CUDA, CPU, HPU, or MPS") gives the CPU's forward and backward, the gradient of a tensor its score function
    captures included, and is charged as one flash kernel each way (not the dense math's separate ops)."""
    torch.manual_seed(0)
    length = 400
    inputs = [torch.randn(1, 2, length, 16) for _ in range(3)] + [torch.randn(2)]
    torch_neuronx.clear_op_tracking()
    out, grads = _flex("neuron", inputs, masked)
    executed = set(torch_neuronx.get_executed_ops())
    assert {"flex_attention", "flex_attention_backward"} <= executed
    assert not executed & {"aten::bmm", "aten::_softmax", "aten::exp", "aten::logsumexp"}
    assert not torch_neuronx.get_fallback_ops()

    cpu_mask = create_block_mask(_sliding_window, 1, 1, length, length, device="cpu") if masked else None
    cpu_out = flex_attention(*inputs[:3], score_mod=lambda s, b, h, q, kv: s + inputs[3][h] * (q - kv) / length,
                             block_mask=cpu_mask)  # the CPU's own forward (it has no backward)
    torch.testing.assert_close(out, cpu_out, atol=1e-5, rtol=1e-5)
    leaves = [t.clone().requires_grad_() for t in inputs]
    mask = _sliding_window(0, 0, torch.arange(length)[:, None], torch.arange(length)[None]) if masked \
        else torch.ones(length, length, dtype=torch.bool)
    expected = _flex_reference(*leaves, mask)
    expected.backward(torch.cos(torch.arange(expected.numel(), dtype=expected.dtype)).view_as(expected))
    torch.testing.assert_close(out, expected.detach(), atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, [t.grad for t in leaves], strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_flex_attention_is_charged_for_the_blocks_its_mask_visits() -> None:
    """A flash kernel skips the blocks the block mask hides: a causal mask over 4 x 4 blocks of 128 visits 10."""
    from neuron_device.simulation import ledger

    q = torch.randn(1, 2, 512, 16, device="neuron")
    seconds = {}
    for name, mask in (("dense", None), ("causal", create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, 512, 512,
                                                                      device="neuron"))):
        torch_neuronx.clear_op_tracking()
        flex_attention(q, q, q, block_mask=mask)
        (launch,) = [launch for launch in ledger.launches() if launch.name == "flex_attention"]
        seconds[name] = launch.work.engines
    (_, dense), (_, causal) = seconds["dense"][0], seconds["causal"][0]
    assert dense == 4.0 * q.numel() * 512 and causal == dense * 10 / 16
