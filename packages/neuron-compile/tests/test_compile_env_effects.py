"""TorchNeuron's compile variables have their documented effect: TORCH_NEURONX_RETAIN_DEVICE_MODE,
TORCH_NEURONX_DISABLE_NEFF_CACHE (and our earlier name as its alias), TORCH_NEURONX_METRICS_ENABLED."""

from __future__ import annotations

import pytest
import torch

from neuron_compile.settings import CompileSettings

pytestmark = pytest.mark.usefixtures("fresh_dynamo_and_metrics")


def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_retain_device_mode_returns_cpu_outputs_for_cpu_inputs(monkeypatch) -> None:
    x = torch.randn(5)
    assert torch.compile(double, backend="neuron")(x).device.type == "neuron"  # the default: outputs on neuron
    torch._dynamo.reset()
    monkeypatch.setenv("TORCH_NEURONX_RETAIN_DEVICE_MODE", "1")
    out = torch.compile(double, backend="neuron")(x)
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, x * 2)
    y = torch.randn(5, device="neuron")
    assert torch.compile(double, backend="neuron")(y).device.type == "neuron"  # neuron inputs stay on neuron


def test_retain_device_mode_copies_in_place_changes_back(monkeypatch) -> None:
    monkeypatch.setenv("TORCH_NEURONX_RETAIN_DEVICE_MODE", "1")

    def add_ten(x: torch.Tensor) -> torch.Tensor:
        x.add_(10)
        return x

    x = torch.randn(4, 4)
    expected = x + 10
    result = torch.compile(add_ten, backend="neuron", fullgraph=True)(x)
    assert result.device.type == "cpu"
    torch.testing.assert_close(x, expected)  # the CPU input itself changed
    torch.testing.assert_close(result, expected)


def test_retain_device_mode_rejects_mixed_devices(monkeypatch) -> None:
    monkeypatch.setenv("TORCH_NEURONX_RETAIN_DEVICE_MODE", "1")
    compiled = torch.compile(lambda a, b: (a * 2, b * 3), backend="neuron")  # no op mixes the devices
    with pytest.raises(RuntimeError, match="cannot mix input devices with TORCH_NEURONX_RETAIN_DEVICE_MODE=1, "
                                           "got cpu and neuron"):
        compiled(torch.randn(3), torch.randn(3, device="neuron"))


@pytest.mark.parametrize("name", ["TORCH_NEURONX_DISABLE_NEFF_CACHE", "TORCH_NEURONX_NEFF_DISABLE_CACHE"])
def test_either_cache_switch_disables_the_persistent_cache(name, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path))
    assert CompileSettings.resolve().cache_dir == tmp_path
    monkeypatch.setenv(name, "1")
    assert CompileSettings.resolve().cache_dir is None


def test_metrics_disabled_records_no_graph(monkeypatch) -> None:
    monkeypatch.setenv("TORCH_NEURONX_METRICS_ENABLED", "0")
    torch.compile(double, backend="neuron")(torch.randn(3, device="neuron"))
    assert torch.neuron.get_dynamo_metrics() == []
