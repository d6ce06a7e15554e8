"""accelerate on `neuron` in one process: device choice, training vs CPU, RNG-state checkpoints, memory helpers."""

from __future__ import annotations

import pytest
import torch
from hf_support import token_batches

pytestmark = pytest.mark.optional
accelerate = pytest.importorskip("accelerate")


def _train(tiny_llama, cpu: bool) -> tuple[str, list[float]]:
    accelerator = accelerate.Accelerator(cpu=cpu)
    model = tiny_llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = torch.utils.data.DataLoader(token_batches(3), batch_size=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for batch in loader:
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return accelerator.device.type, losses


def test_accelerator_trains_on_neuron_like_cpu(tiny_llama):
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    cpu_device, cpu_losses = _train(tiny_llama, cpu=True)
    AcceleratorState._reset_state(reset_partial_state=True)
    device, losses = _train(tiny_llama, cpu=False)
    assert (cpu_device, device) == ("cpu", "neuron")
    assert PartialState().distributed_type == DistributedType.NO
    torch.testing.assert_close(losses, cpu_losses, rtol=1e-4, atol=1e-4)


def test_checkpoint_restores_neuron_rng_state(tmp_path):
    accelerator = accelerate.Accelerator()
    torch.neuron.manual_seed_all(7)
    accelerator.save_state(str(tmp_path))
    states = torch.load(tmp_path / "random_states_0.pkl", weights_only=False)
    assert len(states["torch_neuron_manual_seed"]) == torch.neuron.device_count()
    expected = torch.randn(5, device="neuron").cpu()
    accelerator.load_state(str(tmp_path))
    torch.testing.assert_close(torch.randn(5, device="neuron").cpu(), expected, rtol=0, atol=0)
    torch.manual_seed(7)
    torch.testing.assert_close(expected, torch.randn(5), rtol=0, atol=0)  # same numbers as the CPU's generator


def test_memory_helpers_see_neuron_allocations():
    from accelerate.test_utils.testing import get_backend
    from accelerate.utils.memory import clear_device_cache

    backend, count, memory_allocated = get_backend()
    assert (backend, count) == ("neuron", torch.neuron.device_count())
    before = memory_allocated()
    torch.neuron.reset_peak_memory_stats()
    block = torch.empty(1 << 20, dtype=torch.uint8, device="neuron")
    assert memory_allocated() >= before + (1 << 20)
    assert torch.neuron.max_memory_allocated() >= before + (1 << 20)
    del block
    clear_device_cache()
    assert memory_allocated() == before
