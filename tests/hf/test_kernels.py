"""kernels (the Hub kernel loader) selects its `Neuron` backend variant on our device."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.optional
kernels = pytest.importorskip("kernels")


def test_neuron_backend_is_detected():
    import importlib

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
