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


@pytest.mark.parametrize("model_type", ["gpt_neo", "mamba2", "llama4", "ernie4_5_moe"])
def test_tiny_config_builds(model_type):
    """Configs whose per-layer patterns or shape constraints the shrinking must keep consistent."""
    import hf_models

    config = hf_models.tiny_config(model_type)
    assert config.get_text_config().vocab_size == 512


def test_skip_done_resumes_from_the_json_file(tmp_path, capsys):
    import hf_models

    results = tmp_path / "results.jsonl"
    results.write_text('{"model_type": "llama", "status": "pass", "reason": "", "seconds": 1.0}\n')
    assert hf_models.main(["--only", "llama", "--json", str(results), "--skip-done"]) == 0
    assert results.read_text().count("\n") == 1  # not run again
    assert "1/1 CPU-runnable architectures pass" in capsys.readouterr().out
