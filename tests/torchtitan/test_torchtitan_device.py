"""torchtitan's view of `neuron` in one process: the accelerator it picks, its memory monitor, and the tokenizer and
data set the training tests make (read by torchtitan's own loaders)."""

from __future__ import annotations

import pytest

pytest.importorskip("torchtitan")

import torch
from titan_support import make_assets

pytestmark = pytest.mark.optional


def test_neuron_is_torchtitans_device():
    """torchtitan trains on `torch._utils._get_available_device_type()` (falling back to "cuda"): `neuron`, with
    `torch.neuron` as its device module, without a flag."""
    from torchtitan.tools import utils

    assert utils.device_type == "neuron"
    assert utils.device_module is torch.neuron


def test_memory_monitor_reads_neuron():
    """torchtitan's `DeviceMemoryMonitor` (the `memory:` of its step log) reads torch.cuda's memory API from
    `torch.neuron`: name, capacity, peak statistics."""
    from torchtitan.components.metrics import DeviceMemoryMonitor

    monitor = DeviceMemoryMonitor("neuron")
    assert monitor.device_capacity == torch.neuron.get_device_properties(0).total_memory > 0
    kept = torch.ones(1 << 20, device="neuron")
    stats = monitor.get_peak_stats()
    assert stats.max_active_gib >= kept.numel() * 4 / 2**30
    assert stats.max_reserved_gib >= stats.max_active_gib
    assert stats.num_alloc_retries == 0 and stats.num_ooms == 0


def test_assets_load_through_torchtitan(tmp_path, monkeypatch):
    """The tokenizer and the `c4_test`-shaped data set load through torchtitan's loaders, offline, and give samples
    of the sequence length, starting with the begin-of-text token."""
    import datasets
    from torchtitan.components.tokenizer import HuggingFaceTokenizer

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")  # not the user's cache
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataset

    tokenizer_path, data_path = make_assets(tmp_path)
    tokenizer = HuggingFaceTokenizer(str(tokenizer_path))
    assert tokenizer.bos_id is not None and tokenizer.eos_id is not None
    assert tokenizer.decode(tokenizer.encode("the loss of a step", add_bos=False, add_eos=False)) == "the loss of a step"

    dataset = HuggingFaceTextDataset("c4_test", str(data_path), tokenizer, seq_len=64)
    inputs, labels = next(iter(dataset))
    assert inputs["input"].shape == labels.shape == (64,)
    assert inputs["input"][0] == tokenizer.bos_id
    assert torch.equal(inputs["input"][1:], labels[:-1])
