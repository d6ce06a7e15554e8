"""Autograd on `neuron`: leaf semantics, gradients through views and in-place ops, higher-order gradients, hooks.

Most tests run the same function on CPU leaves and on `neuron` leaves and compare values and gradients: the device
executes CPU kernels, so both must agree to float rounding, and every gradient must live on `neuron`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch
from torch import nn

DEVICE = "neuron"


def _leaves(shapes: Sequence[tuple[int, ...]], device: str, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=gen, dtype=dtype).to(device).requires_grad_() for s in shapes]


def _assert_matches_cpu(fn: Callable[..., torch.Tensor], *shapes: tuple[int, ...]) -> None:
    """Run `fn` on CPU and on `neuron` leaves, backpropagate the same random cotangent, compare everything."""
    outputs, grads = {}, {}
    for device in ("cpu", DEVICE):
        leaves = _leaves(shapes, device)
        out = fn(*leaves)
        cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device)
        out.backward(cotangent)
        for leaf in leaves:
            assert leaf.grad is not None and leaf.grad.device.type == device
        outputs[device] = out.detach().cpu()
        grads[device] = [leaf.grad.cpu() for leaf in leaves]
    torch.testing.assert_close(outputs[DEVICE], outputs["cpu"])
    torch.testing.assert_close(grads[DEVICE], grads["cpu"])


# --- leaves and .grad ---------------------------------------------------------------------------------------------


def test_leaf_semantics() -> None:
    created = torch.randn(3, device=DEVICE, requires_grad=True)
    assert created.is_leaf and created.grad is None and created.grad_fn is None

    cpu_leaf = torch.randn(3, requires_grad=True)
    moved = cpu_leaf.to(DEVICE)  # a differentiable copy: not a leaf, gradients flow back to the CPU leaf
    assert not moved.is_leaf and moved.grad_fn is not None
    (moved * 2).sum().backward()
    assert cpu_leaf.grad.device.type == "cpu"
    torch.testing.assert_close(cpu_leaf.grad, torch.full((3,), 2.0))

    detached = moved.detach().requires_grad_()
    assert detached.is_leaf and detached.device.type == DEVICE

    result = created * 2
    assert not result.is_leaf and result.requires_grad
    with torch.no_grad():
        assert not (created * 2).requires_grad
    with torch.inference_mode():
        assert (created * 2).is_inference()


def test_in_place_on_leaf_requiring_grad_is_rejected() -> None:
    leaf = torch.randn(3, device=DEVICE, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        leaf.add_(1)
    with torch.no_grad():  # the way optimizers update parameters
        leaf.add_(1)
    assert leaf.is_leaf and leaf.requires_grad


def test_grad_accumulates_on_device() -> None:
    x = torch.tensor([1.0, 2.0, 3.0], device=DEVICE, requires_grad=True)
    (x * x).sum().backward()
    (3 * x).sum().backward()
    assert x.grad.device.type == DEVICE and x.grad.dtype == x.dtype
    torch.testing.assert_close(x.grad.cpu(), torch.tensor([5.0, 7.0, 9.0]))


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad(set_to_none: bool) -> None:
    model = nn.Linear(4, 2).to(DEVICE)
    model(torch.randn(3, 4, device=DEVICE)).sum().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and g.abs().sum().item() > 0 for g in grads)
    model.zero_grad(set_to_none=set_to_none)
    for param, old in zip(model.parameters(), grads):
        if set_to_none:
            assert param.grad is None
        else:
            assert param.grad is old and param.grad.device.type == DEVICE  # zeroed in place
            assert param.grad.abs().sum().item() == 0


def test_retain_grad_on_intermediate() -> None:
    x = torch.tensor([1.0, -2.0, 3.0], device=DEVICE, requires_grad=True)
    hidden = x * 3
    hidden.retain_grad()
    (hidden.relu() ** 2).sum().backward()
    assert hidden.grad.device.type == DEVICE
    torch.testing.assert_close(hidden.grad.cpu(), torch.tensor([6.0, 0.0, 18.0]))
    torch.testing.assert_close(x.grad.cpu(), torch.tensor([18.0, 0.0, 54.0]))


# --- views and in-place ops ---------------------------------------------------------------------------------------

_VIEW_FUNCTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "view": lambda x: x.view(6, 4) * 2,
    "transpose": lambda x: x.t().contiguous().exp(),
    "slice": lambda x: x[1:, ::2].sin(),
    "narrow_select": lambda x: x.narrow(1, 1, 2)[2] * 5,
    "expand": lambda x: x[:1].expand(3, 3, 8) * x[:, None],
    "permute_reshape": lambda x: x.reshape(2, 2, 3, 2).permute(3, 0, 2, 1).reshape(-1).cumsum(0),
    "diagonal": lambda x: x[:, :4].diagonal().tanh(),
    "unbind_split": lambda x: torch.stack([a * b for a, b in zip(x.unbind(0), x.split(1, 1))]),
    "as_strided": lambda x: x.as_strided((3, 3), (1, 2), 1) ** 2,
    "unfold": lambda x: x.unfold(1, 3, 2).sum(-1),
    "chunk_cat": lambda x: torch.cat(x.chunk(4, dim=1)[::-1], dim=1) * x,
}


@pytest.mark.parametrize("name", list(_VIEW_FUNCTIONS))
def test_gradients_through_views(name: str) -> None:
    _assert_matches_cpu(_VIEW_FUNCTIONS[name], (3, 8))


def _inplace_chain(x: torch.Tensor) -> torch.Tensor:
    y = x * 1
    y.add_(1).mul_(2).addcmul_(x, x)
    return y.relu_() * 3


def _inplace_on_view(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[0].mul_(3)  # in place through a view of a non-leaf: autograd rebases the view (CopySlices)
    y.t()[1].add_(y[1, 0])
    return y


def _slice_assignment(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[1:, ::2] = z  # gradient to z from the slice, to x from the rest
    y[1:, 0] += z[:, 1]
    return y * x


def _masked_assignment(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[x > 0] = 0
    return y.masked_fill_(x < -1, 5) * x


def _index_put(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[torch.tensor([2, 0], device=x.device)] = z[:2, :]
    return y.index_add(0, torch.tensor([1, 1], device=x.device), z[:2, :])


@pytest.mark.parametrize(
    "fn, shapes",
    [
        (_inplace_chain, [(3, 4)]),
        (_inplace_on_view, [(3, 4)]),
        (_slice_assignment, [(3, 4), (2, 2)]),
        (_masked_assignment, [(3, 4)]),
        (_index_put, [(3, 4), (2, 4)]),
    ],
    ids=["chain", "on_view", "slice_assignment", "masked", "index_put"],
)
def test_gradients_through_in_place_ops(fn: Callable[..., torch.Tensor], shapes: list[tuple[int, ...]]) -> None:
    _assert_matches_cpu(fn, *shapes)


def test_modifying_saved_tensor_is_detected() -> None:
    x = torch.randn(3, device=DEVICE, requires_grad=True)
    y = x.exp()  # exp saves its output
    z = y.sum()
    y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()


# --- torch.autograd.grad, higher order, gradcheck -----------------------------------------------------------------


def test_autograd_grad_and_double_backward() -> None:
    results = {}
    for device in ("cpu", DEVICE):
        (x,) = _leaves([(5,)], device)
        y = (x.tanh() * x**3).sum()
        (first,) = torch.autograd.grad(y, x, create_graph=True)
        assert first.requires_grad and first.device.type == device
        (second,) = torch.autograd.grad(first.sum(), x)
        assert x.grad is None  # autograd.grad does not accumulate into .grad
        results[device] = (first.detach().cpu(), second.cpu())
    torch.testing.assert_close(results[DEVICE], results["cpu"])


def test_gradcheck_and_gradgradcheck() -> None:
    x, w = _leaves([(4, 3), (3, 2)], DEVICE, dtype=torch.float64)

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.softplus(x @ w).log_softmax(-1)

    assert torch.autograd.gradcheck(fn, (x, w))
    assert torch.autograd.gradgradcheck(fn, (x, w))


def test_functional_jacobian_and_hvp() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x.sin() * x.cumsum(0)).sum()

    results = {}
    for device in ("cpu", DEVICE):
        x = torch.linspace(-1, 1, 4, dtype=torch.float64).to(device)
        v = torch.ones(4, dtype=torch.float64, device=device)
        jac = torch.autograd.functional.jacobian(lambda t: t.exp() * t.flip(0), x)
        _, hvp = torch.autograd.functional.hvp(fn, x, v)
        assert jac.device.type == device and hvp.device.type == device
        results[device] = (jac.cpu(), hvp.cpu())
    torch.testing.assert_close(results[DEVICE], results["cpu"])


# --- custom functions, hooks, checkpointing -----------------------------------------------------------------------


class _ScaledSquare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x * x * scale

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        assert x.device.type == DEVICE and grad.device.type == DEVICE
        return 2 * x * ctx.scale * grad, None


def test_custom_autograd_function() -> None:
    x = torch.tensor([1.0, -2.0], device=DEVICE, requires_grad=True)
    _ScaledSquare.apply(x, 3.0).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), torch.tensor([6.0, -12.0]))


def test_tensor_hooks() -> None:
    x = torch.tensor([1.0, 2.0], device=DEVICE, requires_grad=True)
    seen = []
    hidden = x * 2
    hidden.register_hook(lambda g: seen.append(g.device.type) or g * 10)  # replaces the gradient
    accumulated = []
    x.register_post_accumulate_grad_hook(lambda p: accumulated.append(p.grad.clone()))
    hidden.sum().backward()
    assert seen == [DEVICE]
    torch.testing.assert_close(x.grad.cpu(), torch.tensor([20.0, 20.0]))
    assert len(accumulated) == 1 and accumulated[0].device.type == DEVICE


def test_module_hooks() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)).to(DEVICE)
    grads_out: list[torch.Tensor] = []
    activations: list[torch.Tensor] = []
    model[1].register_forward_hook(lambda module, args, out: activations.append(out))
    model[1].register_full_backward_hook(lambda module, grad_in, grad_out: grads_out.append(grad_out[0]))
    model(torch.randn(2, 3, device=DEVICE)).sum().backward()
    assert len(activations) == 1 and activations[0].device.type == DEVICE
    assert len(grads_out) == 1 and grads_out[0].device.type == DEVICE
    # The gradient reaching the Tanh output is the last layer's weight, broadcast over the batch.
    torch.testing.assert_close(grads_out[0].cpu(), model[2].weight.detach().cpu().expand(2, 4))


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_activation_checkpointing(use_reentrant: bool) -> None:
    """Checkpointing recomputes the forward in backward and saves/restores the device RNG state for it."""
    from torch.utils.checkpoint import checkpoint

    def block(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(x.sin(), 0.5, training=True) * x

    x = torch.randn(16, device=DEVICE, requires_grad=True)
    torch.manual_seed(0)
    checkpoint(block, x, use_reentrant=use_reentrant).sum().backward()
    checkpointed = x.grad.clone()
    x.grad = None
    torch.manual_seed(0)
    block(x).sum().backward()
    torch.testing.assert_close(checkpointed, x.grad)


def test_backward_on_second_device() -> None:
    if torch.neuron.device_count() < 2:
        pytest.skip("needs two neuron devices")
    x = torch.randn(4, device="neuron:1", requires_grad=True)
    (x * x).sum().backward()
    assert x.grad.device == torch.device("neuron:1")
    torch.testing.assert_close(x.grad.cpu(), 2 * x.detach().cpu())


# --- saved-tensor hooks, functorch, forward AD, anomaly mode, threads ---------------------------------------------


def test_saved_tensors_offloaded_to_cpu() -> None:
    """`save_on_cpu` packs saved activations to host tensors and moves them back to `neuron` for backward."""
    x = torch.randn(5, device=DEVICE, requires_grad=True)
    with torch.autograd.graph.save_on_cpu():
        (x.exp() * x.sin()).sum().backward()
    offloaded = x.grad
    x.grad = None
    (x.exp() * x.sin()).sum().backward()
    assert offloaded.device.type == DEVICE
    torch.testing.assert_close(offloaded, x.grad, atol=0, rtol=0)


def test_torch_func_transforms() -> None:
    def loss(v: torch.Tensor) -> torch.Tensor:
        return (v.sin() ** 2 * v.cumsum(0)).sum()

    batch = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    tangent = torch.randn(5, generator=torch.Generator().manual_seed(1))
    results = {}
    for device in ("cpu", DEVICE):
        per_sample = torch.func.vmap(torch.func.grad(loss))(batch.to(device))
        _, jvp = torch.func.jvp(loss, (batch[0].to(device),), (tangent.to(device),))
        assert per_sample.device.type == device and jvp.device.type == device
        results[device] = (per_sample.cpu(), jvp.cpu())
    torch.testing.assert_close(results[DEVICE], results["cpu"])


def test_forward_mode_ad() -> None:
    import torch.autograd.forward_ad as fwad

    primal = torch.tensor([1.0, -2.0, 0.5], device=DEVICE)
    with fwad.dual_level():
        dual = fwad.make_dual(primal, torch.ones_like(primal))
        tangent = fwad.unpack_dual((dual * dual.exp()).sum()).tangent
    assert tangent.device.type == DEVICE
    expected = ((1 + primal) * primal.exp()).sum()  # d/dt sum((x + t) e^(x + t)) at t = 0
    torch.testing.assert_close(tangent.cpu(), expected.cpu())


@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")
def test_anomaly_mode_names_the_failing_backward() -> None:
    x = torch.tensor([-1.0, 4.0], device=DEVICE, requires_grad=True)
    with pytest.warns(UserWarning, match="Error detected in SqrtBackward0"), torch.autograd.detect_anomaly():
        with pytest.raises(RuntimeError, match="'SqrtBackward0' returned nan"):
            x.sqrt().sum().backward()


def test_backward_restricted_to_inputs() -> None:
    a = torch.randn(3, device=DEVICE, requires_grad=True)
    b = torch.randn(3, device=DEVICE, requires_grad=True)
    (a * b).sum().backward(inputs=[a])
    assert b.grad is None
    torch.testing.assert_close(a.grad, b.detach())


def test_backward_in_another_thread() -> None:
    """Data loaders and trainers call backward off the main thread; the engine must not depend on thread state."""
    import threading

    results: list[torch.Tensor] = []

    def train_step() -> None:
        x = torch.tensor([1.0, 2.0], device=DEVICE, requires_grad=True)
        (x**3).sum().backward()
        results.append(x.grad)

    worker = threading.Thread(target=train_step)
    worker.start()
    worker.join()
    assert len(results) == 1 and results[0].device.type == DEVICE
    torch.testing.assert_close(results[0].cpu(), torch.tensor([3.0, 12.0]))
