"""transformers on `neuron`: detection, Trainer (device chosen by TrainingArguments) and generate(), vs CPU."""

from __future__ import annotations

import pytest
import torch
from hf_support import token_batches

pytestmark = pytest.mark.optional
transformers = pytest.importorskip("transformers")


def test_neuron_is_detected():
    from transformers.utils import import_utils

    assert import_utils.is_torch_neuron_available()
    assert import_utils.is_torch_neuron_available(check_device=True)
    assert not import_utils.is_torch_neuroncore_available()  # the old torch_xla path stays off


def _train(tiny_llama, tmp_path, use_cpu: bool, **extra) -> tuple[list[float], dict, object]:
    model = tiny_llama()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / ("cpu" if use_cpu else "neuron")), use_cpu=use_cpu, max_steps=3,
        per_device_train_batch_size=2, learning_rate=1e-2, logging_steps=1, report_to=[], save_strategy="no",
        seed=0, dataloader_pin_memory=False, **extra,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=token_batches(1))  # one batch, seen 3 times
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    weights = {name: p.detach().cpu() for name, p in model.named_parameters()}
    return losses, weights, args


def test_trainer_trains_on_neuron_like_cpu(tiny_llama, tmp_path):
    cpu_losses, cpu_weights, cpu_args = _train(tiny_llama, tmp_path, use_cpu=True)
    losses, weights, args = _train(tiny_llama, tmp_path, use_cpu=False)
    assert (str(cpu_args.device), str(args.device)) == ("cpu", "neuron:0")  # chosen by TrainingArguments
    assert len(losses) == 3 and losses[-1] < losses[0]
    torch.testing.assert_close(losses, cpu_losses, rtol=1e-4, atol=1e-4)
    for name, weight in weights.items():
        torch.testing.assert_close(weight, cpu_weights[name], rtol=1e-3, atol=1e-4, msg=name)


def _generate(model, device: str, **kwargs) -> torch.Tensor:
    model = model.to(device).eval()
    prompt = torch.tensor([[1, 17, 42, 99, 5, 63]], device=device)
    transformers.set_seed(1234)
    return model.generate(prompt, max_new_tokens=8, pad_token_id=0, **kwargs).cpu()


@pytest.mark.parametrize(
    "kwargs", [{"do_sample": False}, {"do_sample": True, "top_k": 20, "temperature": 0.9}], ids=["greedy", "sample"]
)
def test_generate_dynamic_cache_same_tokens_as_cpu(tiny_llama, kwargs):
    expected = _generate(tiny_llama(), "cpu", **kwargs)
    tokens = _generate(tiny_llama(), "neuron", **kwargs)
    assert tokens.shape == (1, 14)
    assert torch.equal(tokens, expected)


@pytest.mark.compiler
def test_trainer_with_torch_compile_picks_neuron_backend(tiny_llama, tmp_path):
    cpu_losses, _, _ = _train(tiny_llama, tmp_path, use_cpu=True)
    losses, _, args = _train(tiny_llama, tmp_path / "compiled", use_cpu=False, torch_compile=True)
    assert args.torch_compile_backend == "neuron"  # transformers' own choice on this device
    torch.testing.assert_close(losses, cpu_losses, rtol=1e-4, atol=1e-4)


@pytest.mark.compiler
def test_generate_static_cache_is_compiled_and_matches_cpu(tiny_llama):
    expected = _generate(tiny_llama(), "cpu", do_sample=False)
    torch._dynamo.reset()
    tokens = _generate(tiny_llama(), "neuron", do_sample=False, cache_implementation="static")
    assert torch.equal(tokens, expected)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0  # generate() compiled the forward itself
