"""Instruction-level cost model: documented cycle counts, engine attribution, latency ordering."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from nki_testutil import bf16

import nki
import nki.isa as nisa
import nki.language as nl
from nki.tutorials import matmul


def _one_matmul(dtype, n_stat=128, n_mov=512):
    @nki.jit
    def k():
        s = nl.zeros((128, n_stat), dtype)
        m = nl.zeros((128, n_mov), dtype)
        d = nl.ndarray((n_stat, n_mov), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(d, s, m)

    return k.run().cost


@pytest.mark.parametrize("target,ghz", [("trn1", 2.8), ("trn2", 2.4), ("trn3", 2.4)])
def test_bf16_matmul_128x128x512_costs_documented_cycles(monkeypatch, target, ghz):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", target)
    cost = _one_matmul(nl.bfloat16)
    # max(min(64, N_stationary=128), N_moving=512) = 512 Tensor Engine cycles
    assert cost.engine_busy_ns["tensor"] == pytest.approx(512 / ghz)
    assert cost.instruction_counts["nc_matmul"] == 1
    assert cost.flops == 2 * 128 * 128 * 512


def test_matmul_cost_formula_fp32_and_small_moving():
    assert _one_matmul(nl.float32).engine_busy_ns["tensor"] == pytest.approx(4 * 512 / 2.4)
    assert _one_matmul(nl.bfloat16, n_stat=32, n_mov=16).engine_busy_ns["tensor"] == pytest.approx(32 / 2.4)
    assert _one_matmul(nl.bfloat16, n_stat=128, n_mov=16).engine_busy_ns["tensor"] == pytest.approx(64 / 2.4)
    assert _one_matmul(nl.float8_e4m3).engine_busy_ns["tensor"] == pytest.approx(512 / 2.4)


def test_vector_scalar_gpsimd_costs():
    @nki.jit
    def k():
        a = nl.zeros((128, 1024), nl.float32)
        b = nl.zeros((128, 1024), nl.float32)
        d = nl.ndarray((128, 1024), nl.float32)
        nisa.tensor_tensor(d, a, b, nl.add)  # 2N on Vector (fp32, both SBUF)
        nisa.activation(d, nl.exp, a)  # N on Scalar
        i = nl.ndarray((128, 1024), nl.int32)
        nisa.iota(i, [[1, 1024]])  # 150 + N on GpSimd

    cost = k.run().cost
    t = nki.TARGETS["trn2"]
    memset_ns = 2 * 1024 / t.vector_ghz
    assert cost.engine_busy_ns["vector"] == pytest.approx(2 * 1024 / t.vector_ghz + memset_ns)
    assert cost.engine_busy_ns["scalar"] == pytest.approx(1024 / t.scalar_ghz)
    assert cost.engine_busy_ns["gpsimd"] == pytest.approx((150 + 1024) / t.gpsimd_ghz)


def test_min_ii_and_bf16_fast_paths():
    @nki.jit
    def k():
        a = nl.zeros((128, 8), nl.bfloat16)
        d = nl.ndarray((128, 8), nl.bfloat16)
        nisa.tensor_tensor(d, a, a, nl.add)

    cost = k.run().cost
    assert cost.engine_busy_ns["vector"] == pytest.approx(2 * 64 / 0.96)  # memset + tensor_tensor, both MIN_II


def test_dma_cost_has_fixed_latency_and_bandwidth():
    @nki.jit
    def k(x):
        t = nl.load(x)
        return t

    def lat(shape):
        @nki.jit
        def kk(x):
            nl.load(x)

        return kk.run(np.zeros(shape, np.float32)).cost

    small, big = lat((128, 16)), lat((128, 4096))
    assert small.latency_ns > 1300  # fixed DMA cost dominates a small transfer
    per_byte_big = (big.latency_ns - 1300) / (128 * 4096 * 4)
    per_byte_small = (small.latency_ns - 1300) / (128 * 16 * 4)
    assert per_byte_small > 3 * per_byte_big  # small rows are overhead-bound
    assert big.hbm_bytes == 128 * 4096 * 4


def test_independent_engines_overlap_dependent_ones_serialise():
    @nki.jit
    def indep():
        a = nl.zeros((128, 2048), nl.float32)
        s = nl.ndarray((128, 2048), nl.float32)
        v = nl.ndarray((128, 2048), nl.float32)
        nisa.activation(s, nl.exp, a)
        nisa.tensor_scalar(v, a, nl.add, 1.0)

    @nki.jit
    def dep():
        a = nl.zeros((128, 2048), nl.float32)
        s = nl.ndarray((128, 2048), nl.float32)
        v = nl.ndarray((128, 2048), nl.float32)
        nisa.activation(s, nl.exp, a)
        nisa.tensor_scalar(v, s, nl.add, 1.0)

    c1, c2 = indep.run().cost, dep.run().cost
    assert c1.engine_busy_ns == c2.engine_busy_ns
    assert c1.latency_ns < c2.latency_ns


def test_five_matmul_steps_get_faster_on_trn2():
    rng = np.random.default_rng(0)
    K = M = N = 1024
    a, b = bf16(rng.standard_normal((K, M))), bf16(rng.standard_normal((K, N)))
    lat = [step.run(a, b).cost.latency_ns for step in matmul.STEPS[1:]]
    assert all(x > y for x, y in itertools.pairwise(lat)), lat
    # step 1 (fixed 64×128×512 problem) compared per multiply-accumulate with step 2
    a1, b1 = bf16(rng.standard_normal((128, 64))), bf16(rng.standard_normal((128, 512)))
    basic = matmul.matmul_basic.run(a1, b1).cost
    assert basic.latency_ns / (64 * 128 * 512) > lat[0] / (K * M * N)
    final = matmul.matmul_fully_optimized.run(a, b).cost
    assert final.utilisation()["tensor"] > 0.3
    assert final.mfu() == pytest.approx(2 * K * M * N / (final.latency_ns * 2 * 128 * 128 * 2.4))
    assert 0 < final.mbu() < 1


def test_cost_report_summary_and_json():
    cost = _one_matmul(nl.bfloat16)
    assert "simulated trn2" in cost.summary()
    assert '"simulated": true' in cost.to_json()
    assert cost.nc_latency.get_latency_percentile(99) == cost.latency_us


def test_sbuf_psum_peak_tracking():
    @nki.jit
    def k():
        a = nl.ndarray((128, 1024), nl.float32)
        del a
        nl.ndarray((128, 512), nl.float32, buffer=nl.psum)

    cost = k.run().cost
    assert cost.sbuf_peak_bytes_per_partition == 4096 and cost.psum_peak_bytes_per_partition == 2048


def test_dtype_import_sanity():
    assert np.zeros(1, ml_dtypes.bfloat16).dtype == nl.bfloat16
