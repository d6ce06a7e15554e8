"""TRL's `SFTTrainer` on `neuron`: a tiny Llama (from a config, random weights) and a word-level tokenizer built in
memory (nothing downloaded), two training steps; TRL pads to a multiple of 128 on neuron (static shapes), and the
losses are checked against the same run on the CPU."""

from __future__ import annotations

import os
import tempfile

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from datasets import Dataset
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, set_seed
from trl import SFTConfig, SFTTrainer

CONFIG = LlamaConfig(
    vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
)
ROWS = torch.randint(3, CONFIG.vocab_size, (4, 16), generator=torch.Generator().manual_seed(0))


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, CONFIG.vocab_size)}}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab=vocab, unk_token="<pad>")), pad_token="<pad>", bos_token="<s>",
        eos_token="</s>",
    )


def sft(use_cpu: bool) -> tuple[int | None, list[float]]:
    """Two SFT steps (batch 2, pre-tokenized rows); returns the padding multiple TRL chose and the logged losses."""
    set_seed(0)
    with tempfile.TemporaryDirectory() as output_dir:
        config = SFTConfig(
            output_dir=output_dir, use_cpu=use_cpu, max_steps=2, per_device_train_batch_size=2, learning_rate=1e-2,
            logging_steps=1, report_to=[], save_strategy="no", seed=0, dataloader_pin_memory=False,
        )
        trainer = SFTTrainer(
            model=LlamaForCausalLM(CONFIG), args=config, processing_class=tokenizer(),
            train_dataset=Dataset.from_list([{"input_ids": row.tolist()} for row in ROWS]),
        )
        trainer.train()
    print(f"trained on {config.device}")
    return config.pad_to_multiple_of, [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


if __name__ == "__main__":
    pad_to, losses = sft(use_cpu=False)
    _, expected = sft(use_cpu=True)
    assert pad_to == 128, pad_to  # TRL's neuron path: pad every batch to a multiple of 128
    torch.testing.assert_close(losses, expected, rtol=1e-4, atol=1e-4)
    print(f"SFTTrainer losses on neuron {[round(v, 4) for v in losses]} == CPU")
