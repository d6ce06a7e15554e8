"""kernels (the Hub kernel loader) on `neuron`: its `Neuron` backend is detected, and a local kernel repository whose
`torch-neuron` build is neuron-nki's RMSNorm kernel replaces a transformers Llama's RMSNorm under `kernelize`."""

from __future__ import annotations

import importlib

import pytest
import torch
from hf_support import ROOT

pytestmark = pytest.mark.optional
kernels = pytest.importorskip("kernels")
torch_neuronx = pytest.importorskip("torch_neuronx")

REPO = ROOT / "examples" / "kernels" / "rmsnorm"  # a kernel repo: <variant>/{metadata.json, __init__.py, ...}
NKI_RMSNORM = ("nki::rmsnorm_fwd", "nki::rmsnorm_bwd")


def test_neuron_backend_is_detected():
    from kernels import backends

    kernelize = importlib.import_module("kernels.layer.kernelize")

    backend = backends._backend()
    assert isinstance(backend, backends.Neuron) and backend.variant_str == "neuron"
    assert kernelize._has_neuron_ops()
    # kernelize accepts `neuron` as a device; with no kernel mapped the layer keeps computing the CPU's result.
    torch.manual_seed(0)
    cpu_model, x = torch.nn.Linear(4, 4), torch.randn(3, 4)
    model = kernels.kernelize(torch.nn.Linear(4, 4).to("neuron"), device="neuron", mode=kernels.Mode.INFERENCE)
    model.load_state_dict(cpu_model.state_dict())
    torch.testing.assert_close(model(x.to("neuron")).cpu(), cpu_model(x))


def test_local_repository_resolves_the_neuron_variant():
    module = kernels.get_local_kernel(REPO)
    (metadata,) = [k.metadata for k in kernels.get_loaded_kernels() if k.module is module]
    assert str(metadata.backend.backend_type) == "neuron" and metadata.python_depends == ["nki"]
    assert module.__file__.endswith("torch-neuron/__init__.py")  # the variant kernels picked for `Neuron`
    assert module.layers.LlamaRMSNorm.has_backward


@pytest.fixture
def hub_rmsnorm(monkeypatch):
    """transformers' LlamaRMSNorm made kernelizable as the hub layer "RMSNorm", with kernels' own API for third-party
    layers. transformers 5.23.0 would do it itself, but only with kernels >= 0.18.2 (the newest release is 0.17.2):
    its `use_kernel_forward_from_hub` is a no-op and `use_kernels=True` raises (test below)."""
    from transformers.models.llama import modeling_llama

    cls = modeling_llama.LlamaRMSNorm
    for attr in ("kernel_layer_name", "kernel_condition"):  # the class attributes are removed again at teardown
        monkeypatch.setattr(cls, attr, getattr(cls, attr, None), raising=False)
    kernels.replace_kernel_forward_from_hub(cls, "RMSNorm")
    return kernels.LocalLayerRepository(repo_path=REPO, layer_name="LlamaRMSNorm")


def _step(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Logits and the gradients of a next-token loss, on the model's device; returned on the CPU."""
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    grads = {name: p.grad.cpu() for name, p in model.named_parameters() if "norm" in name}
    return out.logits.detach().cpu(), grads


@pytest.mark.parametrize("mode", ["INFERENCE", "TRAINING"])
def test_kernelize_llama_rmsnorm_runs_the_nki_kernel(tiny_llama, hub_rmsnorm, mode):
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    expected_logits, expected_grads = _step(tiny_llama(), ids)

    model = tiny_llama().to("neuron")
    torch_neuronx.clear_op_tracking()
    _step(model, ids.to("neuron"))
    assert not set(NKI_RMSNORM) & set(torch_neuronx.get_executed_ops())  # transformers' own forward: no fused op

    model.zero_grad()
    with kernels.use_kernel_mapping({"RMSNorm": {"neuron": hub_rmsnorm}}, inherit_mapping=False):
        kernels.kernelize(model, mode=getattr(kernels.Mode, mode))  # device found from the parameters: neuron
    assert model.model.norm.forward.__func__.__module__.endswith(".layers")  # the repository's layer
    torch_neuronx.clear_op_tracking()
    logits, grads = _step(model, ids.to("neuron"))
    assert set(NKI_RMSNORM) <= set(torch_neuronx.get_executed_ops())
    torch.testing.assert_close(logits, expected_logits, rtol=1e-4, atol=1e-5)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-4, atol=1e-5, msg=name)


def _transformers_kernels_enabled() -> bool:
    from transformers.utils.import_utils import is_kernels_available

    return is_kernels_available()


@pytest.mark.skipif("not _transformers_kernels_enabled()", reason="transformers gates its kernels path on kernels>=0.18.2")
def test_transformers_use_kernels_with_the_local_repository(tiny_llama):
    """transformers' own path (its layers marked for the hub, `KernelConfig` with a local repository). Checked with
    transformers' version gate forced open on kernels 0.17.2; runs by itself once the installed kernels passes it."""
    from transformers import KernelConfig

    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    expected = tiny_llama().eval()(input_ids=ids).logits
    model = tiny_llama().to("neuron").eval()
    model.set_use_kernels(True, KernelConfig({"RMSNorm": {"neuron": f"{REPO}:LlamaRMSNorm"}}, use_local_kernel=True))
    torch_neuronx.clear_op_tracking()
    logits = model(input_ids=ids.to("neuron")).logits.cpu()
    assert "nki::rmsnorm_fwd" in torch_neuronx.get_executed_ops()
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif("_transformers_kernels_enabled()", reason="this kernels release passes transformers' gate")
def test_transformers_use_kernels_needs_a_newer_kernels_release(tiny_llama):
    """Why the `hub_rmsnorm` fixture registers the layer: transformers 5.23.0 turns its kernels integration off below
    kernels 0.18.2 (the newest release is 0.17.2), so `use_kernels` fails before any device code runs."""
    with pytest.raises(ValueError, match=r"0\.18\.2 <= version"):
        tiny_llama().to("neuron").set_use_kernels(True)
