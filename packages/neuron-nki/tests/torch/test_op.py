"""nki_op (custom op: fake impl, autograd, opcheck, torch.compile) and wrap_nki (one graph node)."""

from __future__ import annotations

import pytest
import torch

import nki.isa as nisa
import nki.language as nl
import torch_neuronx
from torch_neuronx import nki, nki_op, wrap_nki


@nki.jit
def scale_kernel(x, out, factor: float):
    s = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=s, data=nl.load(x), op0=nl.multiply, operand0=factor)
    nl.store(out, s)


@nki.jit
def tanh_kernel(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    s = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.activation(dst=s, op=nl.tanh, data=nl.load(x))
    nl.store(out, s)
    return out


@nki_op("nki_test::scale", mutates_args={})
def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    out = torch.empty_like(x)
    scale_kernel(x, out, factor)
    return out


@nki_op("nki_test::tanh", mutates_args={})
def tanh(x: torch.Tensor) -> torch.Tensor:
    return tanh_kernel(x)


@nki_op("nki_test::scale_", mutates_args={"x"})
def scale_(x: torch.Tensor, factor: float) -> None:
    scale_kernel(x, x, factor)


def _scale_backward(ctx, grad: torch.Tensor):
    return scale(grad, ctx.factor), None


def _scale_setup(ctx, inputs, output) -> None:
    ctx.factor = inputs[1]


def _tanh_backward(ctx, grad: torch.Tensor):
    (y,) = ctx.saved_tensors
    return grad * (1 - y * y)


def _tanh_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(output)


scale.register_autograd(_scale_backward, setup_context=_scale_setup)
tanh.register_autograd(_tanh_backward, setup_context=_tanh_setup)


def test_canonical_example_on_neuron() -> None:
    x = torch.randn(128, device="neuron").reshape(1, 128)
    y = scale(x, 2.5)
    assert y.device.type == "neuron"
    torch.testing.assert_close(y.cpu(), x.cpu() * 2.5)


def test_mutating_op_writes_its_argument() -> None:
    x = torch.randn(4, 32, device="neuron")
    expected = x.cpu() * -3.0
    scale_(x, -3.0)
    torch.testing.assert_close(x.cpu(), expected)


@pytest.mark.parametrize("op, args", [(scale, (2.0,)), (tanh, ()), (scale_, (0.5,))], ids=["scale", "tanh", "scale_"])
@pytest.mark.parametrize("device", ["neuron", "cpu"])
def test_opcheck(op, args, device: str) -> None:
    x = torch.randn(4, 32, device=device, requires_grad=op is not scale_)
    utils = torch.library._OPCHECK_DEFAULT_UTILS
    if device == "neuron":  # torch 2.13's autograd_registration_check: "NYI devices other than CPU/CUDA/XPU"
        utils = tuple(u for u in utils if u != "test_autograd_registration")
    torch.library.opcheck(op, (x, *args), test_utils=utils)


def test_autograd_matches_cpu_autograd() -> None:
    x = torch.randn(8, 64, requires_grad=True)
    xn = x.detach().to("neuron").requires_grad_()
    g = torch.randn(8, 64)
    scale(tanh(xn), 1.5).backward(g.to("neuron"))
    (torch.tanh(x) * 1.5).backward(g)
    torch.testing.assert_close(xn.grad.cpu(), x.grad, atol=1e-5, rtol=1e-5)


def test_gradcheck_float64_free_finite_differences() -> None:
    """The registered backward agrees with finite differences of the NKI forward (fp32, loose tolerance)."""
    x = torch.randn(2, 16, device="neuron", requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: tanh(t), (x,), eps=1e-2, atol=1e-2, rtol=1e-2)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return scale(tanh(self.lin(x)), 3.0).sum(-1)


@pytest.mark.all_wheels  # needs neuron-compile
@pytest.mark.compiler
def test_compile_neuron_backend_matches_eager_forward_and_backward() -> None:
    pytest.importorskip("neuron_compile")
    torch.manual_seed(0)
    model = _Block().to("neuron")
    x = torch.randn(8, 32, device="neuron")
    compiled = torch.compile(model, backend="neuron")
    torch_neuronx.clear_op_tracking()
    out = compiled(x)
    torch.testing.assert_close(out.cpu(), model(x).cpu(), atol=1e-5, rtol=1e-5)
    assert "nki::tanh_kernel" in torch_neuronx.get_executed_ops()
    out.sum().backward()
    compiled_grad = model.lin.weight.grad.cpu().clone()
    model.zero_grad()
    model(x).sum().backward()
    torch.testing.assert_close(compiled_grad, model.lin.weight.grad.cpu(), atol=1e-4, rtol=1e-4)


def _graph_targets(fn, *args) -> list:
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return [getattr(n.target, "_overloadpacket", n.target) for g in graphs for n in g.graph.nodes
            if n.op == "call_function"]


def test_wrap_nki_is_one_node_under_compile() -> None:
    wrapped = wrap_nki(tanh_kernel)
    x = torch.randn(16, 64, device="neuron")
    targets = _graph_targets(lambda t: wrapped(t) * 2, x)
    assert targets.count(torch.ops.nki.call) == 1
    compiled = torch.compile(lambda t: wrapped(t) * 2, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x).cpu(), torch.tanh(x.cpu()) * 2, atol=1e-5, rtol=1e-5)


def test_nki_op_is_one_node_under_compile() -> None:
    x = torch.randn(16, 64, device="neuron")
    targets = _graph_targets(lambda t: scale(t, 2.0) + 1, x)
    assert targets.count(torch.ops.nki_test.scale) == 1


def test_wrap_nki_rejects_kernels_that_write_arguments_when_traced() -> None:
    wrapped = wrap_nki(scale_kernel)
    x = torch.randn(8, 16, device="neuron")
    out = torch.empty_like(x)
    with pytest.raises(Exception, match="writes its tensor argument"):
        torch.compile(lambda a, o: wrapped(a, o, 2.0), backend="aot_eager", fullgraph=True)(x, out)


def test_wrap_nki_needs_a_kernel() -> None:
    with pytest.raises(TypeError, match=r"@nki\.jit kernel"):
        wrap_nki(lambda x: x)


_TRN1_SCRIPT = '''
import torch
import nki.language as nl
from nki.torch.adapter import record_launches
from torch_neuronx import nki, nki_op


@nki.jit
def wide_copy(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(x))  # one SBUF tile of x's size
    return out


@nki_op("nki_test::wide_copy", mutates_args={})
def copy(x: torch.Tensor) -> torch.Tensor:
    return wide_copy(x)


small = torch.ones(128, 1024, device="neuron")  # 4 KiB per partition: fits every target
with record_launches() as launches:
    assert torch.equal(copy(small).cpu(), small.cpu())
print(launches[0].cost.target)
try:
    copy(torch.ones(128, 50 * 1024, device="neuron"))  # 200 KiB per partition: fits trn2's 224, not trn1's 192
except Exception as error:
    print(type(error).__name__, "SBUF" in str(error) or "sbuf" in str(error), "196608" in str(error))
'''


@pytest.mark.parametrize(("instance", "target", "fits"), [("trn1.32xlarge", "trn1", False),
                                                            ("trn2.48xlarge", "trn2", True)])
def test_a_kernel_on_neuron_is_checked_and_costed_for_the_simulated_instance(instance, target, fits):
    """The device's target is the kernel's (issue 16): under trn1.32xlarge a 200 KiB-per-partition SBUF tile is
    refused (trn1 has 192 KiB per partition) and the launch is costed as trn1, while nki alone would default to
    trn2."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "NEURON_PLATFORM_TARGET_OVERRIDE"}
    result = subprocess.run([sys.executable, "-c", _TRN1_SCRIPT], capture_output=True, text=True, timeout=300,
                            env={**env, "NEURON_SIM_INSTANCE_TYPE": instance})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0] == target
    assert lines[1:] == ([] if fits else ["NkiValidationError True True"])
