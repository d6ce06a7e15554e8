"""Out of memory on `neuron`: raised as on CUDA, before host memory is taken, leaving nothing behind."""

from __future__ import annotations

import gc

import pytest
import torch

MiB, GiB = 1024**2, 1024**3


@pytest.fixture
def small_device():
    """neuron:0 with 64 MiB left to reserve (a per-process fraction, restored afterwards), and that limit."""
    gc.collect()
    torch.neuron.empty_cache()
    total = torch.neuron.get_device_properties(0).total_memory
    limit = torch.neuron.memory_reserved(0) + 64 * MiB
    torch.neuron.set_per_process_memory_fraction(limit / total, 0)
    torch.neuron.reset_peak_memory_stats(0)
    try:
        yield torch.device("neuron:0"), limit
    finally:
        torch.neuron.set_per_process_memory_fraction(1.0, 0)


def test_oom_error_type_and_message():
    assert issubclass(torch.neuron.OutOfMemoryError, torch.OutOfMemoryError)
    assert issubclass(torch.neuron.OutOfMemoryError, RuntimeError)
    gc.collect()
    before = torch.neuron.memory_allocated()
    ooms = torch.neuron.memory_stats()["num_ooms"]
    with pytest.raises(torch.neuron.OutOfMemoryError) as info:
        torch.empty(30 * GiB, dtype=torch.uint8, device="neuron")  # never allocated on the host either
    assert str(info.value).startswith(
        "Neuron out of memory. Tried to allocate 30.00 GiB. Neuron device 0 has a total capacity of 24.00 GiB of which "
    )
    assert "(Simulated trn2 logical NeuronCore, LNC=2.)" in str(info.value)
    assert torch.neuron.memory_allocated() == before
    assert torch.neuron.memory_stats()["num_ooms"] == ooms + 1
    assert torch.empty(GiB, dtype=torch.uint8, device="neuron").numel() == GiB


def test_oom_from_an_op_result_is_clean(small_device):
    small_device, _ = small_device
    x = torch.ones(1024, 1024, device=small_device)  # 4 MiB
    before = torch.neuron.memory_allocated(small_device)
    with pytest.raises(torch.OutOfMemoryError, match=r"Neuron device 0 .* allowed; "):
        x.repeat(32, 1)  # 128 MiB result
    assert torch.neuron.memory_allocated(small_device) == before
    assert torch.equal((x * 2).sum().cpu(), torch.tensor(2.0 * 1024 * 1024))


def test_training_continues_with_a_smaller_batch_after_oom(small_device):
    small_device, limit = small_device
    torch.manual_seed(0)

    def make_model() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 1))

    model = make_model().to(small_device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.002)
    target = torch.nn.Linear(512, 1)  # the mapping to learn, on the host

    def step(net: torch.nn.Module, opt: torch.optim.Optimizer, inputs: torch.Tensor) -> float:
        device = next(net.parameters()).device
        loss = torch.nn.functional.mse_loss(net(inputs.to(device)), target(inputs).detach().to(device))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    step(model, optimizer, torch.randn(32, 512))
    gc.collect()
    before = torch.neuron.memory_allocated(small_device)
    ooms = torch.neuron.memory_stats(small_device)["num_ooms"]
    with pytest.raises(torch.neuron.OutOfMemoryError):
        step(model, optimizer, torch.randn(16384, 512))  # the (16384, 2048) activation alone is 128 MiB
    gc.collect()
    assert torch.neuron.memory_allocated(small_device) == before
    assert torch.neuron.memory_stats(small_device)["num_ooms"] == ooms + 1

    # The failed step changed nothing: training on from here matches the same training on the CPU.
    reference = make_model()
    reference.load_state_dict({name: value.cpu() for name, value in model.state_dict().items()})
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.002)
    batches = [torch.randn(64, 512) for _ in range(5)]
    losses = [step(model, optimizer, batch) for batch in batches]
    expected = [step(reference, reference_optimizer, batch) for batch in batches]
    torch.testing.assert_close(losses, expected, rtol=1e-4, atol=1e-6)
    assert torch.neuron.max_memory_reserved(small_device) <= limit


def test_a_model_larger_than_a_trn2_core_ooms_without_touching_host_memory(python):
    """A 30 GiB model built on `meta`, materialised with `to_empty`: 24 layers fit in the 24 GiB of a trn2 logical
    core, the 25th does not. Device memory is host memory, but untouched pages are never resident: the process
    stays small, which shows no allocation beyond the model's own was made."""
    code = """
import gc, resource, torch
with torch.device("meta"):
    model = torch.nn.Sequential(*[torch.nn.Linear(16384, 32768, bias=False, dtype=torch.bfloat16) for _ in range(30)])
print(sum(p.numel() * p.element_size() for p in model.parameters()) // 2**30)
try:
    model.to_empty(device="neuron")
except torch.neuron.OutOfMemoryError as error:
    print(type(error).__name__, str(error).split(" Of the allocated")[0])
print(torch.neuron.memory_allocated() // 2**30, torch.neuron.memory_stats()["num_ooms"])
del model
gc.collect()
print(torch.neuron.memory_allocated())
with torch.device("meta"):
    smaller = torch.nn.Sequential(*[torch.nn.Linear(16384, 32768, bias=False, dtype=torch.bfloat16) for _ in range(20)])
smaller.to_empty(device="neuron")
print(torch.neuron.memory_allocated() // 2**30)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""
    result = python(code)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:5] == [
        "30",
        "OutOfMemoryError Neuron out of memory. Tried to allocate 1024.00 MiB. Neuron device 0 has a total capacity of "
        "24.00 GiB of which 0 bytes is free.",
        "24 1",
        "0",
        "20",
    ]
    assert int(lines[5]) < 2048  # peak resident MiB
