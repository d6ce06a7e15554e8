"""``nki.benchmark`` called with type placeholders, as the tutorials' ``__main__`` blocks do (issue 20 item 7)."""

from __future__ import annotations

import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.language as nl
import neuronxcc.nki.typing as nt
from neuronxcc.nki.tutorials import matmul


def test_placeholder_carries_shape_and_dtype():
    t = nt.tensor[[8192, 4096], nl.bfloat16]
    assert t.shape == (8192, 4096) and t.dtype == nl.bfloat16 and not t.mutable
    assert nt.mutable_tensor[[4, 4], nl.float32].mutable
    assert nt.tensor[128, 512].shape == (128, 512)


def test_benchmark_with_placeholders_reports_simulated_latency():
    bench = nki.benchmark(warmup=5, iters=10)(matmul.matmul_tiled)
    out = bench(nt.tensor[[256, 128], nl.bfloat16], nt.tensor[[256, 512], nl.bfloat16])
    assert out.shape == (128, 512) and out.dtype == nl.bfloat16
    latency = bench.benchmark_result.nc_latency
    p99 = latency.get_latency_percentile(99)
    assert p99 > 0 and p99 == latency.get_latency_percentile(50)

    # the same kernel on explicit arrays of the same types has the same simulated latency
    explicit = nki.benchmark(matmul.matmul_tiled)
    a = np.zeros((256, 128), nl.bfloat16)
    explicit(a, np.zeros((256, 512), nl.bfloat16))
    assert explicit.benchmark_result.nc_latency.get_latency_percentile(99) == p99


def test_placeholder_without_dtype_is_refused():
    bench = nki.benchmark(matmul.matmul_tiled)
    with pytest.raises(TypeError, match="needs both a shape and a dtype"):
        bench(nt.tensor[256, 128], nt.tensor[[256, 512], nl.bfloat16])
