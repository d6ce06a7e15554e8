"""PEFT LoRA and TRL SFTTrainer on `neuron`, each against the same run on CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hf_support import token_batches

pytestmark = pytest.mark.optional
peft = pytest.importorskip("peft")


def _lora_steps(tiny_llama, device: str) -> tuple[list[float], dict, torch.Tensor]:
    model = peft.get_peft_model(
        tiny_llama(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    ).to(device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for example in token_batches(3, batch=1):
        ids = example["input_ids"][None].to(device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    lora = {name: p.detach().cpu() for name, p in model.named_parameters() if "lora_" in name}
    merged = model.merge_and_unload()
    probe = torch.arange(3, 19)[None]
    return losses, lora, merged(input_ids=probe.to(device)).logits.detach().cpu()


def test_lora_finetune_and_merge_match_cpu(tiny_llama):
    cpu_losses, cpu_lora, cpu_logits = _lora_steps(tiny_llama, "cpu")
    losses, lora, logits = _lora_steps(tiny_llama, "neuron")
    assert lora and lora.keys() == cpu_lora.keys()
    torch.testing.assert_close(losses, cpu_losses, rtol=1e-4, atol=1e-5)
    for name, weight in lora.items():
        torch.testing.assert_close(weight, cpu_lora[name], rtol=1e-3, atol=1e-5, msg=name)
    torch.testing.assert_close(logits, cpu_logits, rtol=1e-3, atol=1e-4)


def _tokenizer():
    """A word-level tokenizer over the tiny vocabulary, built in memory (nothing can be downloaded)."""
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, 128)}}
    model = tokenizers.models.WordLevel(vocab=vocab, unk_token="<pad>")
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer(model), pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )


def _sft(tiny_llama, tmp_path, use_cpu: bool) -> tuple[object, list[float]]:
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    rows = [{"input_ids": example["input_ids"].tolist()} for example in token_batches(4, batch=1)]
    config = trl.SFTConfig(
        output_dir=str(tmp_path / str(use_cpu)), use_cpu=use_cpu, max_steps=2, per_device_train_batch_size=2,
        learning_rate=1e-2, logging_steps=1, report_to=[], save_strategy="no", seed=0, dataloader_pin_memory=False,
    )
    trainer = trl.SFTTrainer(
        model=tiny_llama(), args=config, train_dataset=datasets.Dataset.from_list(rows), processing_class=_tokenizer()
    )
    trainer.train()
    return config, [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def test_sft_trainer_runs_on_neuron_with_padding_like_cpu(tiny_llama, tmp_path):
    cpu_config, cpu_losses = _sft(tiny_llama, tmp_path, use_cpu=True)
    config, losses = _sft(tiny_llama, tmp_path, use_cpu=False)
    assert (cpu_config.pad_to_multiple_of, config.pad_to_multiple_of) == (None, 128)  # trl's static-shape path
    assert len(losses) == 2
    # Padding to 128 only adds ignored (-100) positions: the loss is the CPU's.
    torch.testing.assert_close(losses, cpu_losses, rtol=1e-4, atol=1e-4)


def test_trl_env_reports_the_chip():
    pytest.importorskip("trl")
    trl_script = Path(sys.executable).with_name("trl")  # the console script `trl = trl.cli:main`
    result = subprocess.run([str(trl_script), "env"], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    assert "trn2" in result.stdout, result.stdout
