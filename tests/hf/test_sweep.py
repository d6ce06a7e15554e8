"""The architecture sweeps (`benchmarks/hf_models.py`, `benchmarks/diffusers_models.py`) on a fixed sample: a few
representative causal LMs (dense, GQA, MoE with integer `histc` on `neuron`, SSM, and apertus, whose xIELU
`torch.min(x, tensor)` lost its gradient through a device kernel on a CompositeImplicitAutograd overload), one model
per task-head family, a few diffusers models and pipeline families, and one compiled pair; plus the sweep's
machinery (tiny configs, resuming from the JSON report, the worker subprocess)."""

from __future__ import annotations

from pathlib import Path

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


@pytest.mark.parametrize("model_type", ["gpt_neo", "mamba2", "llama4", "ernie4_5_moe", "mistral_large4", "step3p7"])
def test_tiny_config_builds(model_type):
    """Configs whose per-layer patterns or shape constraints the shrinking must keep consistent (mistral_large4 and
    step3p7 have per-layer lists fixed in their default text configs, which their validators check)."""
    import hf_models

    config = hf_models.tiny_config(model_type)
    assert config.get_text_config().vocab_size == 512


def test_tiny_config_draws_no_noise():
    """VITS draws its noise partly from the CPU generator and partly from its device's: the sweep zeroes it."""
    import hf_models

    config = hf_models.tiny_config("vits")
    assert (config.noise_scale, config.noise_scale_duration) == (0.0, 0.0)


def test_skip_done_resumes_from_the_json_file(tmp_path, capsys):
    import hf_models

    results = tmp_path / "results.jsonl"
    # a line of the causal-LM-only sweep (no task, no mode: causal-lm, eager)
    results.write_text('{"model_type": "llama", "status": "pass", "reason": "", "seconds": 1.0}\n')
    assert hf_models.main(["--only", "llama", "--tasks", "causal-lm", "--json", str(results), "--skip-done"]) == 0
    assert results.read_text().count("\n") == 1  # not run again
    # the sweep now counts (model type, task) pairs rather than causal-LM architectures
    assert "1/1 CPU-runnable (model type, task) pairs pass" in capsys.readouterr().out


# One (model type, task) pair per task-head family: text encoders and their heads, seq2seq, vision, speech.
FAMILY_SAMPLE = [
    ("bert", "masked-lm"), ("bert", "sequence-classification"), ("bert", "multiple-choice"),
    ("roberta", "token-classification"), ("distilbert", "question-answering"), ("t5", "seq-to-seq-causal-lm"),
    ("bart", "base"), ("vit", "image-classification"), ("convnext", "image-classification"),
    ("segformer", "semantic-segmentation"), ("wav2vec2", "ctc"), ("hubert", "audio-classification"),
    ("whisper", "speech-seq-2-seq"),
    ("blip", "image-text-to-text"),  # its generate() writes BOS into input_ids: the sweep passes it copies
]


@pytest.mark.parametrize(("model_type", "task"), FAMILY_SAMPLE)
def test_task_head_matches_cpu(model_type, task):
    import hf_models

    result = hf_models.check(model_type, task)
    assert result.status == "pass", result.reason


def test_compiled_head_matches_cpu():
    import hf_models

    result = hf_models.check("bert", "sequence-classification", compiled=True)
    assert result.status == "pass", result.reason


def test_every_auto_mapping_is_a_task():
    import hf_models

    tasks = hf_models.task_mappings()
    assert tasks["base"]["bert"] == "BertModel" and tasks["causal-lm"]["llama"] == "LlamaForCausalLM"
    assert tasks["ctc"]["wav2vec2"] == "Wav2Vec2ForCTC"


def test_inputs_follow_the_task():
    """Padding (left for prompts that generate, right otherwise) and labels of each task's kind."""
    import hf_models

    config = hf_models.tiny_config("bert")
    model = hf_models.head_class("bert", "token-classification")(config)
    inputs = hf_models.make_inputs(model, config, "token-classification")
    assert inputs["attention_mask"][-1, -hf_models.PADDED:].sum() == 0
    assert inputs["labels"].shape == inputs["input_ids"].shape
    config = hf_models.tiny_config("llama")
    inputs = hf_models.make_inputs(hf_models.head_class("llama", "causal-lm")(config), config, "causal-lm")
    assert inputs["attention_mask"][-1, : hf_models.PADDED].sum() == 0
    assert (inputs["labels"][inputs["attention_mask"] == 0] == -100).all()


def _pool_run(pairs: list[tuple[str, str]], timeout: float) -> list:
    import _sweep
    import hf_models

    results: list = []
    _sweep.Pool(hf_models.__file__, compiled=False, timeout=timeout, record=results.append).run(pairs)
    return results


def test_worker_pool_reports_each_pair():
    results = _pool_run([("bert", "base"), ("bert", "text-encoding"), ("gpt2", "base")], timeout=600)
    assert [(r.model_type, r.task, r.status) for r in results] == [
        ("bert", "base", "pass"), ("bert", "text-encoding", "pass"), ("gpt2", "base", "pass")]


FAULTY_WORKER = """
import os, sys, time
sys.path.insert(0, {benchmarks!r})
import _sweep

def check(model, task, compiled):
    if model != "cpu-crash":
        _sweep.cpu_reference_done()
    if model in ("crash", "cpu-crash"):
        os._exit(3)
    if model == "hang":
        time.sleep(600)
    return _sweep.Result(model, "pass", "", 0.0, task)

_sweep.serve(check, compiled=False)
"""


def test_a_pair_that_crashes_or_hangs_its_worker_fails_alone(tmp_path):
    """The worker is replaced; only the pair it was running fails, with the cause, and the rest still run. A crash
    before the check's CPU reference is done makes the pair `cpu-fail` (not counted)."""
    import _sweep

    script = tmp_path / "faulty_worker.py"
    script.write_text(FAULTY_WORKER.format(benchmarks=str(Path(_sweep.__file__).parent)))
    results: list = []
    pool = _sweep.Pool(str(script), compiled=False, timeout=5, record=results.append)
    pool.run([("ok", "a"), ("crash", "a"), ("ok", "b"), ("hang", "a"), ("ok", "c"), ("cpu-crash", "a"), ("ok", "d")])
    assert [(r.model_type, r.task, r.status) for r in results] == [
        ("ok", "a", "pass"), ("crash", "a", "fail"), ("ok", "b", "pass"), ("hang", "a", "timeout"), ("ok", "c", "pass"),
        ("cpu-crash", "a", "cpu-fail"), ("ok", "d", "pass")]
    assert results[1].reason.startswith("worker exited with code 3")
    assert results[3].reason == "timed out after 5s"
    assert results[5].reason.startswith("on the CPU run: worker exited with code 3")


@pytest.mark.parametrize("class_name", ["AutoencoderKL", "FluxTransformer2DModel", "SD3Transformer2DModel"])
def test_diffusers_model_matches_cpu(class_name):
    pytest.importorskip("diffusers")
    import diffusers_models

    result = diffusers_models.check(class_name)
    assert result.status == "pass", result.reason


@pytest.mark.parametrize("family", ["ddim", "pixart-sigma"])
def test_diffusers_pipeline_family_matches_cpu(family):
    pytest.importorskip("diffusers")
    import diffusers_models

    result = diffusers_models.check_pipeline(family)
    assert result.status == "pass", result.reason
