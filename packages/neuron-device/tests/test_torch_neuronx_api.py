"""TorchNeuron's top-level `torch_neuronx` functions exist, are `torch.neuron`'s own, and answer as documented."""

from __future__ import annotations

import pytest
import torch
from device_support import run_python

import torch_neuronx

SAME_AS_TORCH_NEURON = [
    "current_device", "current_stream", "default_stream", "device", "device_count", "empty_cache",
    "get_device_properties", "max_memory_allocated", "max_memory_reserved", "memory_allocated", "memory_reserved",
    "memory_stats", "memory_summary", "reset_accumulated_memory_stats", "reset_peak_memory_stats", "set_device",
    "set_stream", "stream", "synchronize", "Stream", "Event", "StreamContext",
]


@pytest.mark.parametrize("name", SAME_AS_TORCH_NEURON)
def test_top_level_name_is_torch_neurons(name: str) -> None:
    assert getattr(torch_neuronx, name) is getattr(torch.neuron, name)


def test_device_functions() -> None:
    assert torch_neuronx.device_count() == torch.neuron.device_count() > 1
    previous = torch_neuronx.current_device()
    try:
        torch_neuronx.set_device(1)
        assert torch_neuronx.current_device() == 1
        assert torch.empty(1, device="neuron").device == torch.device("neuron", 1)
        with torch_neuronx.device(0):
            assert torch_neuronx.current_device() == 0
    finally:
        torch_neuronx.set_device(previous)
    props = torch_neuronx.get_device_properties("neuron:0")
    assert props.name == "trn2" and props.total_memory > 0
    with pytest.raises(RuntimeError, match="Invalid device index 99"):
        torch_neuronx.set_device(99)


def test_memory_functions() -> None:
    torch_neuronx.empty_cache()
    before = torch_neuronx.memory_allocated()
    x = torch.empty(1024, device="neuron")
    assert torch_neuronx.memory_allocated() > before
    assert torch_neuronx.max_memory_allocated() >= torch_neuronx.memory_allocated()
    assert torch_neuronx.memory_stats()["allocated_bytes.all.current"] == torch_neuronx.memory_allocated()
    assert "Allocated memory" in torch_neuronx.memory_summary()
    del x


def test_is_neuron_runtime_initialized_follows_first_use() -> None:
    code = ("import torch, torch_neuronx; a = torch_neuronx.is_neuron_runtime_initialized(); "
            "torch.ones(1, device='neuron'); print(a, torch_neuronx.is_neuron_runtime_initialized())")
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True"]


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'no_such_function'"):
        torch_neuronx.no_such_function  # noqa: B018


@pytest.mark.parametrize("name, wheel", [("get_dynamo_metrics", "neuron-compile"),
                                         ("neuron_dynamo_backend", "neuron-compile"), ("nki_op", "neuron-nki")])
@pytest.mark.all_wheels  # the wheel's plugin is installed there, and fails to load
def test_name_of_a_missing_wheel_says_which_wheel(name: str, wheel: str) -> None:
    blocked = "neuron_compile" if wheel == "neuron-compile" else "nki"
    code = f"""import sys, warnings
warnings.simplefilter("ignore")  # the blocked wheel's plugin fails to load: it warns
class Absent:  # the wheel is not installed
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] == {blocked!r}:
            raise ModuleNotFoundError("No module named " + repr(fullname), name=fullname)
sys.meta_path.insert(0, Absent())
import torch_neuronx
try:
    torch_neuronx.{name}
except ImportError as e:
    print(e)
"""
    result = run_python(code, fresh=True)  # fresh: the import hook must be in place before torch loads the plugins
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"torch_neuronx.{name} needs the {wheel} package (pip install {wheel})"
