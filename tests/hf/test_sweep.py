"""The causal-LM sweep (`benchmarks/hf_models.py`) on a few representative architectures: dense, GQA, MoE (integer
`histc` on `neuron`), SSM, and apertus (xIELU's `torch.min(x, tensor)` lost its gradient through a device kernel on a
CompositeImplicitAutograd overload)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.optional
pytest.importorskip("transformers")


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "qwen2_moe", "mamba", "gemma3_text", "apertus"])
def test_forward_backward_generate_match_cpu(model_type):
    import hf_models

    result = hf_models.check(model_type)
    assert result.status == "pass", result.reason


def test_tiny_config_is_tiny():
    import hf_models

    config = hf_models.tiny_config("llama")
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (64, 2, 512)
