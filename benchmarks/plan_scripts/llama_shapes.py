"""Llama model shapes the plan scripts build from configs (no weights): Llama-3.1's, from the config.json of
meta-llama/Llama-3.1-{8B,70B,405B}, Llama-2-7B's (meta-llama/Llama-2-7b-hf), and tiny ones of the same kind for quick looks and tests."""

from __future__ import annotations

_SPECIAL_TOKENS = dict(bos_token_id=128000, eos_token_id=128001)  # <|begin_of_text|>, <|end_of_text|>
LLAMA_3_1 = {
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, **_SPECIAL_TOKENS),
    "70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8, vocab_size=128256, **_SPECIAL_TOKENS),
    "405b": dict(hidden_size=16384, intermediate_size=53248, num_hidden_layers=126, num_attention_heads=128,
                 num_key_value_heads=8, vocab_size=128256, **_SPECIAL_TOKENS),
}

LLAMA_2_7B = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=32, vocab_size=32000, bos_token_id=1, eos_token_id=2, rope_theta=10000.0)


def tiny(layers: int, heads: int = 8, kv_heads: int = 4) -> dict[str, int]:
    """A tiny Llama of `layers` decoder layers (hidden 64, vocabulary 256, its last two ids begin and end text)."""
    return dict(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, vocab_size=256, bos_token_id=254, eos_token_id=255)
