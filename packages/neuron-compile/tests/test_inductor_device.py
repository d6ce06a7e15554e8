"""Plain `torch.compile(model)` (Inductor) on `neuron` tensors: the device registered with Dynamo and Inductor,
host C++ kernels on device memory, and a wrapper whose steady state runs no per-op Python."""

from __future__ import annotations

import pytest
import torch
from models import MLP

from neuron_device import fallback as host_exec

pytestmark = pytest.mark.compiler


def test_inductor_compiles_neuron_graphs() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = MLP().to("neuron").eval()
    x = torch.randn(8, 16, device="neuron")
    compiled = torch.compile(model)  # Inductor, no backend argument
    with torch.no_grad():
        out = compiled(x)
        assert out.device == x.device
        torch.testing.assert_close(out.cpu(), model(x).cpu())
        before = sum(host_exec.executed_ops.values())
        compiled(x)
        assert sum(host_exec.executed_ops.values()) == before


def test_cpp_wrapper_is_refused_clearly() -> None:
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x + 1, options={"cpp_wrapper": True})
    with pytest.raises(Exception, match=r"C\+\+ wrapper .* is not implemented for the 'neuron' device"):
        compiled(torch.ones(3, device="neuron"))
