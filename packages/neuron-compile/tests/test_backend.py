"""neuron-compile 0.1.0 declares the backend and refuses, clearly, to pretend it compiles."""

import importlib.metadata

import pytest
import torch


def test_backend_entry_point_is_declared():
    names = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="torch_dynamo_backends")}
    assert names.get("neuron") == "neuron_compile.backend:neuron_backend"


def test_compile_raises_not_implemented_naming_the_gap():
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x * 2, backend="neuron")
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
        compiled(torch.ones(2, device="neuron"))
    assert isinstance(info.value.inner_exception, NotImplementedError)
    assert "not implemented yet" in str(info.value.inner_exception)
