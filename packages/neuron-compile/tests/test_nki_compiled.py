"""neuron-nki's kernels inside compiled graphs (skipped without neuron-nki): flash attention on the transposed
q/k/v views transformers make, and RMSNorm written out as ops (transformers' `LlamaRMSNorm`, `F.rms_norm`) found by
the RMSNorm pass and run as the NKI kernel, forward and backward, fp32 and bf16."""

from __future__ import annotations

import pytest
import torch

from neuron_compile import nki_substitution

pytest.importorskip("nki")
pytestmark = [pytest.mark.compiler, pytest.mark.all_wheels]  # needs neuron-nki: runs in the all session

B, S, H, D = 2, 16, 4, 8


@pytest.fixture(autouse=True)
def fresh_dynamo(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("NEURON_NKI_NATIVE_KERNELS", "simulate")  # the kernels replace ops in graphs only then
    if torch.ops.aten._fused_rms_norm.default not in nki_substitution.substitutable_ops():
        pytest.skip("neuron-nki's native kernels are disabled (NEURON_NKI_NATIVE_KERNELS=0)")
    torch._dynamo.reset()
    nki_substitution.substituted_calls.clear()
    yield
    torch._dynamo.reset()


class Attention(torch.nn.Module):
    """q/k/v as `x.view(b, s, h, d).transpose(1, 2)` of one projection: strided, non-dense views."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(H * D, 3 * H * D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.view(B, S, H, D).transpose(1, 2) for t in self.qkv(x).split(H * D, -1))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).reshape(B, S, H * D)


def test_attention_on_transposed_views_compiles_with_the_nki_kernel() -> None:
    torch.manual_seed(0)
    model = Attention()
    x = torch.randn(B, S, H * D)
    want = model(x)
    with torch.no_grad():
        got = torch.compile(model.to("neuron"), backend="neuron", fullgraph=True)(x.to("neuron"))
    assert nki_substitution.substituted_calls == {"aten::_scaled_dot_product_flash_attention_for_cpu": 1}
    torch.testing.assert_close(got.cpu(), want.detach(), rtol=1e-4, atol=1e-5)


def _attention_of_channels_first(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q/k/v copied contiguous out of a channels-first [B, 3*H*D, S] tensor (as after a short causal conv)."""
    q, k, v = (t.view(B, H, D, S).transpose(-1, -2).contiguous() for t in x.split(H * D, 1))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_substituted_attention_gets_its_inputs_with_the_traced_strides() -> None:
    """Left free, Inductor lays the copies out like their channels-first source (head dim strided by S), and the
    masked call runs torch's CPU flash kernel, which reads any head dim as dense: garbage (zaya, inkling2_text)."""
    torch.manual_seed(0)
    x = torch.randn(B, 3 * H * D, S)
    mask = torch.ones(S, S, dtype=torch.bool).tril()
    want = _attention_of_channels_first(x, mask)
    with torch.no_grad():
        got = torch.compile(_attention_of_channels_first, backend="neuron", fullgraph=True)(x.to("neuron"),
                                                                                           mask.to("neuron"))
    assert nki_substitution.substituted_calls == {"aten::_scaled_dot_product_flash_attention_for_cpu": 1}
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)


class LlamaRMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm, in plain torch."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


def _block(norm: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(64, 64), norm, torch.nn.Linear(64, 64))
    torch.nn.init.normal_(block[1].weight, 1.0, 0.2)
    return block.to(dtype)


_TOLERANCE = {torch.float32: {"rtol": 1e-4, "atol": 1e-5}, torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm", ["llama", "rms_norm"])
def test_rms_norm_patterns_run_the_nki_kernel_forward_and_backward(norm: str, dtype: torch.dtype) -> None:
    layer = LlamaRMSNorm(64) if norm == "llama" else torch.nn.RMSNorm(64, eps=1e-6)
    eager = _block(layer, dtype)
    compiled_model = _block(LlamaRMSNorm(64) if norm == "llama" else torch.nn.RMSNorm(64, eps=1e-6), dtype)
    compiled_model.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_model.to("neuron"), backend="neuron", fullgraph=True)
    x = torch.randn(4, 8, 64, dtype=dtype)
    want = eager(x)
    got = compiled(x.to("neuron"))
    assert nki_substitution.substituted_calls.get("aten::_fused_rms_norm") == 1
    torch.testing.assert_close(got.detach().cpu(), want.detach(), **_TOLERANCE[dtype])
    want.float().square().sum().backward()
    got.float().square().sum().backward()
    for (name, reference), trained in zip(eager.named_parameters(), compiled_model.parameters()):
        # bf16 gradients of sums over many rows differ by rounding at the scale of the largest entry
        scale = reference.grad.abs().max().item() if dtype == torch.bfloat16 else 1.0
        torch.testing.assert_close(trained.grad.cpu(), reference.grad, rtol=_TOLERANCE[dtype]["rtol"],
                                   atol=_TOLERANCE[dtype]["atol"] * scale, msg=name)
