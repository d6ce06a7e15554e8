"""TorchNeuron's compile metrics: `get_dynamo_metrics()` per-graph records and the `graph_stats` metric table
(`TORCH_NEURONX_ENABLED_METRIC_TABLES`, `TORCH_NEURONX_METRICS_DIR`, one CSV per rank written at exit)."""

from __future__ import annotations

import csv
import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_neuronx
from neuron_compile import metrics

pytestmark = pytest.mark.usefixtures("fresh_dynamo_and_metrics")


def scale_shift(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


def test_get_dynamo_metrics_is_one_record_per_graph_in_torchneurons_shape() -> None:
    compiled = torch.compile(scale_shift, backend="neuron", options={"model_name": "tiny"})
    for size in (3, 4, 4):
        compiled(torch.randn(size, device="neuron"))
    records = torch.neuron.get_dynamo_metrics()
    assert [type(r) for r in records] == [metrics.NeuronCompilationMetrics] * 2  # the repeated shape 4 reuses its graph
    assert [f.name for f in dataclasses.fields(records[0])] == [
        "graph_id", "graph_name", "model_name", "has_collectives", "graph_node_count", "timestamp",
        "torch_neuronx_fx_passes_us", "torch_neuronx_lower_us", "torch_neuronx_compile_us"]
    first, second = records
    assert first.model_name == "tiny" and first.graph_name.startswith("tiny_")
    assert first.graph_id != second.graph_id  # a new shape is a new graph
    assert first.graph_node_count == 4  # x, mul, add, output: the Dynamo graph before the Neuron passes
    assert first.has_collectives is False
    # the documented form, dicts: indexing, keys and dict() give the same fields as attribute access
    assert first["graph_id"] == first.graph_id and first["model_name"] == "tiny"
    assert dict(first) == dataclasses.asdict(first) and list(first) == list(dict(first))
    with pytest.raises(KeyError):
        first["no_such_field"]
    assert 0 < first.torch_neuronx_fx_passes_us + first.torch_neuronx_lower_us <= first.torch_neuronx_compile_us
    assert torch_neuronx.get_dynamo_metrics() == records  # the same function under both names
    assert torch_neuronx.neuron_dynamo_backend.get_dynamo_metrics() == records
    torch_neuronx.reset_dynamo_metrics()
    assert torch.neuron.get_dynamo_metrics() == []


def test_unknown_metric_table_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setenv("TORCH_NEURONX_ENABLED_METRIC_TABLES", "graph_stat")
    with pytest.raises(ValueError, match=r"\['graph_stat'\] are not registered; available tables: \['graph_stats'\]"):
        metrics.write_metric_tables()


def test_graph_stats_table_is_written_at_exit_per_rank(tmp_path) -> None:
    script = textwrap.dedent("""
        import torch
        f = torch.compile(lambda x: x.sin() + 1, backend="neuron", options={"model_name": "m"})
        f(torch.randn(4, device="neuron")); f(torch.randn(5, device="neuron"))
    """)
    env = {**os.environ, "TORCH_NEURONX_ENABLED_METRIC_TABLES": "graph_stats",
           "TORCH_NEURONX_METRICS_DIR": str(tmp_path), "RANK": "3", "TORCH_NEURONX_NEFF_DISABLE_CACHE": "1"}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=300)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metric_table_graph_stats_rank3.csv"]
    with open(tmp_path / "metric_table_graph_stats_rank3.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2
    assert list(rows[0]) == metrics.METRIC_TABLES["graph_stats"]
    assert {row["model_name"] for row in rows} == {"m"} and all(int(r["torch_neuronx_compile_us"]) > 0 for r in rows)


def test_no_table_is_written_unless_enabled(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("TORCH_NEURONX_ENABLED_METRIC_TABLES", raising=False)
    monkeypatch.setenv("TORCH_NEURONX_METRICS_DIR", str(tmp_path))
    assert metrics.write_metric_tables() == []
    assert list(tmp_path.iterdir()) == []
