"""Shape buckets (`torch_neuronx.pad_to_buckets`, `TORCH_NEURONX_SHAPE_BUCKETS`): prompts of many lengths compile one
graph per bucket, with the unpadded run's results and the padded graph's simulated time; bad bucket specs and calls
it cannot mask are refused, naming the problem."""

from __future__ import annotations

import pytest
import torch

import torch_neuronx
from neuron_compile import metrics
from neuron_compile.buckets import ShapeBuckets

pytestmark = pytest.mark.usefixtures("fresh_dynamo_and_metrics")


def test_buckets_as_lists_or_powers_of_two_from_the_api_and_the_environment(monkeypatch) -> None:
    assert torch_neuronx.powers_of_two(16, 128) == (16, 32, 64, 128)
    assert ShapeBuckets(seq_len="pow2:16-64", batch=[1, 4]) == ShapeBuckets(seq_len=(16, 32, 64), batch=(1, 4))
    monkeypatch.setenv("TORCH_NEURONX_SHAPE_BUCKETS", "seq_len=pow2:8-32; batch=1,2,4")
    assert ShapeBuckets.from_env() == ShapeBuckets(seq_len=(8, 16, 32), batch=(1, 2, 4))
    wrapped = torch_neuronx.pad_to_buckets(lambda input_ids, attention_mask: input_ids[..., None])  # the variable's
    ids = torch.ones(3, 9, dtype=torch.long)
    assert wrapped(ids, torch.ones_like(ids)).shape == (3, 9, 1)
    assert wrapped.buckets == ShapeBuckets.from_env()
    buckets = ShapeBuckets(seq_len=(8, 16, 32))
    assert [buckets.bucket("seq_len", n) for n in (1, 8, 9, 32)] == [8, 8, 16, 32]
    assert buckets.bucket("batch", 3) == 3  # no batch buckets: the batch is not padded


@pytest.mark.parametrize(("spec", "message"), [
    ({"seq_len": []}, "the seq_len bucket list is empty"),
    ({"seq_len": [16, 16, 32]}, "seq_len buckets must be strictly increasing, got 16 after 16"),
    ({"batch": [4, 2]}, "batch buckets must be strictly increasing, got 2 after 4"),
    ({"seq_len": [0, 8]}, "seq_len buckets must be positive integers, got 0"),
    ({"batch": [-1]}, "batch buckets must be positive integers, got -1"),
    ({"seq_len": "pow2:32-16"}, "smallest 32 is above largest 16"),
    ({"seq_len": "pow2:3-16"}, "smallest must be a positive power of two, got 3"),
    ({"seq_len": "16;32"}, "integers separated by ','"),
    ({}, "no buckets given"),
])
def test_bad_bucket_specs_are_refused_naming_the_problem(spec, message) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        ShapeBuckets(**spec)


@pytest.mark.parametrize(("value", "message"), [
    ("seq_len=8,4", "seq_len buckets must be strictly increasing, got 4 after 8"),
    ("length=8", "TORCH_NEURONX_SHAPE_BUCKETS: expected 'seq_len=...'"),
    ("seq_len=8;seq_len=16", "seq_len is given twice"),
    ("", "none given; pass seq_len and/or batch, or set TORCH_NEURONX_SHAPE_BUCKETS"),
])
def test_bad_environment_specs_are_refused_naming_the_variable_or_problem(monkeypatch, value, message) -> None:
    monkeypatch.setenv("TORCH_NEURONX_SHAPE_BUCKETS", value)
    with pytest.raises(ValueError, match=message):
        torch_neuronx.pad_to_buckets(lambda input_ids, attention_mask: input_ids)


def test_a_length_above_the_largest_bucket_is_refused() -> None:
    fn = torch_neuronx.pad_to_buckets(lambda input_ids, attention_mask: input_ids, seq_len=[4, 8], batch=[2])
    ids = torch.ones(1, 9, dtype=torch.long)
    with pytest.raises(ValueError, match="seq_len 9 is above the largest seq_len bucket 8"):
        fn(ids, torch.ones_like(ids))
    ids = torch.ones(3, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="batch 3 is above the largest batch bucket 2"):
        fn(ids, torch.ones_like(ids))


def test_what_it_cannot_mask_is_refused_never_padded_silently() -> None:
    seen = []
    fn = torch_neuronx.pad_to_buckets(lambda input_ids, attention_mask=None, position_ids=None, **kw: seen.append(1),
                                      seq_len=[8])
    ids = torch.ones(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="needs a 2-D attention_mask"):
        fn(ids)
    with pytest.raises(ValueError, match="cannot pad argument 'position_ids'"):
        fn(ids, torch.ones_like(ids), position_ids=torch.arange(5).expand(2, 5))
    with pytest.raises(ValueError, match="cannot pad argument 'inputs_embeds'"):
        fn(ids, torch.ones_like(ids), inputs_embeds=torch.zeros(2, 5, 4))
    with pytest.raises(ValueError, match="needs input_ids"):
        fn(input_ids=None, attention_mask=torch.ones_like(ids))
    assert seen == []


def test_an_output_it_cannot_tell_is_per_position_is_refused() -> None:
    """A 2-D output whose dim 1 is the padded length may be (batch, features) (a pooled output as wide as the
    bucket): cutting it would be a silent wrong answer, so only the per-position names are cut."""
    def forward(input_ids, attention_mask):
        return {"start_logits": input_ids.float(), "pooled": torch.zeros(input_ids.shape[0], 8)}

    fn = torch_neuronx.pad_to_buckets(forward, seq_len=[8])
    ids = torch.ones(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"pooled of shape \(2, 8\) has the padded length 8 in dim 1"):
        fn(ids, torch.ones_like(ids))
    with pytest.raises(ValueError, match="extra positional arguments"):
        torch_neuronx.pad_to_buckets(lambda input_ids, attention_mask, *rest: None, seq_len=[8])(ids, ids, 3)


def test_padding_is_masked_and_cut_back() -> None:
    """Right padding for a forward: ids padded with the pad id, the mask with zeros, extra batch rows repeat the first
    row; the outputs come back at the call's shape."""
    calls = []

    def forward(input_ids, attention_mask, labels=None):
        calls.append((input_ids, attention_mask, labels))
        return {"logits": input_ids.float().unsqueeze(-1).expand(-1, -1, 3)}

    fn = torch_neuronx.pad_to_buckets(forward, seq_len=[4, 8], batch=[1, 4], pad_token_id=7)
    ids = torch.tensor([[1, 2, 3, 4, 5], [6, 5, 4, 3, 2]])
    out = fn(ids, torch.ones_like(ids), labels=ids)
    padded_ids, padded_mask, padded_labels = calls[0]
    assert padded_ids.tolist() == [[1, 2, 3, 4, 5, 7, 7, 7], [6, 5, 4, 3, 2, 7, 7, 7]] + [[1, 2, 3, 4, 5, 7, 7, 7]] * 2
    assert padded_mask.tolist() == [[1] * 5 + [0] * 3] * 4
    assert padded_labels[0].tolist() == [1, 2, 3, 4, 5, -100, -100, -100]
    assert torch.equal(out["logits"], ids.float().unsqueeze(-1).expand(-1, -1, 3))


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    transformers.set_seed(0)
    return transformers.LlamaForCausalLM(config).eval().to("neuron")


@pytest.mark.optional
def test_40_prompt_lengths_compile_one_graph_per_bucket_with_the_unpadded_results() -> None:
    model = _tiny_llama()
    buckets = [16, 32, 48]
    fn = torch_neuronx.pad_to_buckets(torch.compile(model, backend="neuron"), seq_len=buckets, batch=[2])
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for length in range(3, 43):
            ids = torch.randint(3, 128, (2, length), generator=generator).to("neuron")
            mask = torch.ones_like(ids)
            mask[1, :length // 3] = 0  # a left-padded row of the caller's own
            expected = model(input_ids=ids, attention_mask=mask)
            got = fn(input_ids=ids, attention_mask=mask)
            assert got.logits.shape == expected.logits.shape
            torch.testing.assert_close(got.logits, expected.logits, rtol=1e-5, atol=1e-5)
            assert got.past_key_values.get_seq_length() == length  # the returned cache cropped to the prompt
    assert metrics.counters()["compilations"] == len(buckets)


@pytest.mark.optional
def test_the_simulated_time_is_the_padded_graphs() -> None:
    from neuron_device import timeline

    model = _tiny_llama()
    compiled = torch.compile(model, backend="neuron")
    fn = torch_neuronx.pad_to_buckets(compiled, seq_len=[256])
    clock = timeline.timeline(0)

    def seconds(call, length):
        ids = torch.ones(1, length, dtype=torch.long, device="neuron")
        call(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)  # compiled, warm
        start = clock.synchronize()
        call(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
        return clock.synchronize() - start

    with torch.no_grad():
        full = seconds(compiled, 256)
        short = seconds(fn, 5)
        unpadded = seconds(compiled, 5)
    assert unpadded < full  # a shorter graph is cheaper: the comparison below can tell them apart
    # the padded graph's kernels, plus the pad and cut around them (a few small eager ops on `neuron`, 11 us here
    # against the graphs' 31 us difference)
    assert full <= short < full + (full - unpadded) / 2


@pytest.mark.optional
def test_generate_buckets_the_prompt_with_the_unpadded_tokens() -> None:
    """generate with a static cache, whose decode transformers compiles: each prompt left-padded to its bucket
    (generate masks it) and its batch of 3 to 4 rows, so prompts of many lengths compile one decode graph per bucket
    (its cache is bucket + max_new_tokens long) and the tokens and scores are the unpadded run's."""
    model = _tiny_llama()
    buckets = [8, 16, 24]
    generate = torch_neuronx.pad_to_buckets(model.generate, seq_len=buckets, batch=[4])
    generator = torch.Generator().manual_seed(1)
    options = {"max_new_tokens": 3, "do_sample": False, "cache_implementation": "static", "output_scores": True,
               "return_dict_in_generate": True}
    with torch.no_grad():
        runs = []
        for length in range(2, 24, 2):
            ids = torch.randint(3, 128, (3, length), generator=generator).to("neuron")
            runs.append((ids, generate(ids, attention_mask=torch.ones_like(ids), **options)))
        graphs = metrics.counters()["compilations"]
        for ids, got in runs:
            expected = model.generate(ids, disable_compile=True, **options)
            assert torch.equal(got.sequences, expected.sequences)
            for mine, theirs in zip(got.scores, expected.scores, strict=True):
                torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
    assert graphs == len(buckets)


def test_generate_needs_max_new_tokens() -> None:
    def generate(inputs=None, attention_mask=None, max_length=None, max_new_tokens=None):
        raise AssertionError("not called")

    fn = torch_neuronx.pad_to_buckets(generate, seq_len=[8])
    ids = torch.ones(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="generate needs max_new_tokens"):
        fn(ids, attention_mask=torch.ones_like(ids), max_length=12)
