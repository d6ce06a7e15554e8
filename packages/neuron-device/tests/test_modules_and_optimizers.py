"""PyTorch's ModuleInfo and OptimizerInfo databases on `neuron`, compared against the CPU.

`torch.testing._internal.common_modules.module_db` lists every `torch.nn` module with the constructor and forward
inputs upstream tests them with; `common_optimizers.optim_db` lists every optimizer with its configurations and
implementations (for-loop, foreach, fused). Each module is built on the CPU, copied to `neuron` (`.to("neuron")`,
uninitialized lazy parameters included), and run forward and backward on both devices; each optimizer takes the
same three steps on both. float32 throughout.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.testing._internal.common_modules import module_db
from torch.testing._internal.common_optimizers import optim_db
from torch.utils import _pytree as pytree

pytestmark = pytest.mark.slow

_MODULES = [info for info in module_db if torch.float32 in info.dtypes]
_UNSUPPORTED_OPTIMIZERS = {
    "SparseAdam": "needs sparse gradients, and sparse layouts are not supported on neuron",
}


def _to_neuron(value):
    if isinstance(value, torch.Tensor):
        return value.detach().to("neuron").requires_grad_(value.requires_grad)
    return value


def _float_tensors(output) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _assert_close(neuron: torch.Tensor, cpu: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(neuron.detach().cpu(), cpu.detach(), rtol=1e-3, atol=1e-4, equal_nan=True, msg=what)


@pytest.mark.parametrize("info", _MODULES, ids=lambda info: info.name)
def test_module_matches_cpu(info) -> None:
    """Outputs, parameter gradients and input gradients of every upstream input, in training and eval mode."""
    for training in (True, False) if info.train_and_eval_differ else (True,):
        inputs = info.module_inputs_func(info, device="cpu", dtype=torch.float32, requires_grad=True,
                                         training=training)
        for number, module_input in enumerate(inputs):
            if module_input.forward_input is None:
                continue
            where = f"{info.name} input {number} ({'train' if training else 'eval'})"
            constructor = module_input.constructor_input
            torch.manual_seed(0)
            # as upstream's tests do: some inputs build float64 buffers (`_random_samples`) for any dtype
            cpu_module = info.module_cls(*constructor.args, **constructor.kwargs).to(torch.float32).train(training)
            neuron_module = copy.deepcopy(cpu_module).to("neuron")
            args, kwargs = module_input.forward_input.args, module_input.forward_input.kwargs
            neuron_args, neuron_kwargs = pytree.tree_map(_to_neuron, (args, kwargs))
            torch.manual_seed(1)  # random modules (dropout) draw the same numbers on both devices
            cpu_outputs = _float_tensors(cpu_module(*args, **kwargs))
            torch.manual_seed(1)
            neuron_outputs = _float_tensors(neuron_module(*neuron_args, **neuron_kwargs))
            assert len(neuron_outputs) == len(cpu_outputs), where
            for got, expected in zip(neuron_outputs, cpu_outputs, strict=True):
                _assert_close(got, expected, f"{where}: forward")
            differentiable = [i for i, t in enumerate(cpu_outputs) if t.requires_grad]
            if not differentiable:
                continue
            sum(cpu_outputs[i].sum() for i in differentiable).backward()
            sum(neuron_outputs[i].sum() for i in differentiable).backward()
            for (name, expected), got in zip(cpu_module.named_parameters(), neuron_module.parameters(), strict=True):
                assert (got.grad is None) == (expected.grad is None), f"{where}: gradient of {name}"
                if expected.grad is not None:
                    _assert_close(got.grad, expected.grad, f"{where}: gradient of {name}")
            cpu_leaves = pytree.tree_leaves((args, kwargs))
            for got, expected in zip(pytree.tree_leaves((neuron_args, neuron_kwargs)), cpu_leaves, strict=True):
                if isinstance(expected, torch.Tensor) and expected.grad is not None:
                    _assert_close(got.grad, expected.grad, f"{where}: input gradient")


def test_lazy_modules_move_before_their_first_forward() -> None:
    """`.to(...)` of an uninitialized lazy parameter is allowed by identity (`UninitializedTensorMixin`): patching
    `Tensor.to` once made `LazyLinear(3).to("cpu")` raise for every torch user with this package installed."""
    for move in (lambda m: m.to("cpu"), lambda m: m.to("neuron"), lambda m: m.neuron(), lambda m: m.to("neuron:1")):
        module = move(torch.nn.LazyLinear(3))
        device = next(module.parameters()).device
        assert module(torch.ones(2, 4, device=device)).shape == (2, 3)
        assert module.weight.shape == (3, 4) and module.weight.device == device


def _optimizer_cases():
    for info in optim_db:
        name = info.optim_cls.__name__
        marks = [pytest.mark.skip(reason=_UNSUPPORTED_OPTIMIZERS[name])] if name in _UNSUPPORTED_OPTIMIZERS else []
        yield pytest.param(info, id=name, marks=marks)


def _train(info, kwargs: dict, device: str) -> list[torch.Tensor]:
    """Three steps of `info`'s optimizer on a bias-free two-layer MLP (2-D parameters, as Muon requires)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3, bias=False), torch.nn.Tanh(), torch.nn.Linear(3, 2, bias=False))
    model.to(device)
    optimizer = info.optim_cls(model.parameters(), **{k: _to_device(v, device) for k, v in kwargs.items()})
    batches = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(5, 4, generator=batches).to(device)

        def closure(x: torch.Tensor = x) -> torch.Tensor:
            optimizer.zero_grad()
            loss = model(x).pow(2).sum()
            loss.backward()
            return loss

        if info.step_requires_closure:
            optimizer.step(closure)
        else:
            closure()
            optimizer.step()
    return [p.detach().cpu() for p in model.parameters()]


def _to_device(value, device: str):
    return value.to(device) if isinstance(value, torch.Tensor) else value


@pytest.mark.parametrize("info", list(_optimizer_cases()))
def test_optimizer_matches_cpu(info) -> None:
    """Every upstream configuration, in each implementation the optimizer supports (for-loop, foreach, fused)."""
    impls = [{}] + [{impl: True} for impl in ("foreach", "fused") if impl in info.supported_impls]
    configurations = info.optim_inputs_func(device="cpu", dtype=torch.float32)
    assert configurations
    for configuration in configurations:
        for impl in impls:
            kwargs = {**configuration.kwargs, **impl}
            where = f"{info.optim_cls.__name__}[{configuration.desc}] {impl or 'for-loop'}"
            for got, expected in zip(_train(info, kwargs, "neuron"), _train(info, kwargs, "cpu"), strict=True):
                torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, msg=where)
