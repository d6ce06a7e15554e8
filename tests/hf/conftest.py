"""Fixtures of the Hugging Face drop-in tests: tiny random models, no downloads (helpers to import are in
`hf_support`)."""

from __future__ import annotations

import os
import sys

import pytest
from hf_support import ROOT

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may be downloaded: every model is built from a config
sys.path.insert(0, str(ROOT / "benchmarks"))  # hf_models: the sweep's tiny-config builder


@pytest.fixture
def tiny_llama():
    """A factory of tiny Llama causal LMs with the same random weights for a given seed."""
    transformers = pytest.importorskip("transformers")

    def build(seed: int = 0, **overrides):
        config = transformers.LlamaConfig(
            vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            **overrides,
        )
        transformers.set_seed(seed)
        return transformers.LlamaForCausalLM(config)

    return build
