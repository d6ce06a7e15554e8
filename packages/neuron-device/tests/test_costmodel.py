"""The cost model: roofline per engine against the published figures, and the per-op estimates the runtime charges."""

from __future__ import annotations

import pytest
import torch
from device_support import elapsed_ms

from neuron_device.simulation import costmodel
from neuron_device.topology import TARGETS
from neuron_spec import costs

TRN2 = TARGETS["trn2"]
HBM_PER_CORE_TRN2 = 2.9e12 / 8  # chip bandwidth shared by 8 physical cores
LAUNCH = costmodel.LAUNCH_SECONDS
# HBM traffic goes through the DMA engines: one queue head latency first (the calibrated model, issue 17; the
# roofline these tests first pinned had none), and an engine instruction pays two operand accesses
DMA_HEAD = costs.DMA_QUEUE_HEAD_NS * 1e-9
VECTOR_ACCESS_TRN2 = 2 * costs.ACCESS_CYCLES / 0.96e9


def test_4096_cubed_bf16_matmul_on_trn2_is_within_10_percent_of_peak():
    n = 4096
    ideal = 2 * n**3 / 79e12
    estimate = costmodel.estimate_kernel({"tensor": 2 * n**3}, 3 * n * n * 2, dtype=torch.bfloat16, target=TRN2)
    assert estimate.bound == "tensor"
    assert abs(estimate.seconds - ideal) / ideal < 0.10
    print(f"4096^3 bf16 matmul on trn2: estimate {estimate.seconds * 1e3:.4f} ms, 2*4096^3/79e12 {ideal * 1e3:.4f} ms")


@pytest.mark.parametrize(
    ("target", "dtype", "tflops"),
    [
        ("trn1", torch.bfloat16, 92), ("trn1", torch.float32, 23),
        ("trn2", torch.float16, 79), ("trn2", torch.float32, 20), ("trn2", torch.float8_e4m3fn, 158),
        ("trn3", torch.bfloat16, 79), ("trn3", torch.float8_e5m2, 315),
    ],
)
def test_tensor_engine_rate_by_target_and_dtype(target, dtype, tflops, highest_precision):
    flops = 1e12
    estimate = costmodel.estimate_kernel({"tensor": flops}, 0, dtype=dtype, target=TARGETS[target])
    assert estimate.engine_seconds["tensor"] == pytest.approx(flops / (tflops * 1e12))


def test_fp32_matmul_uses_bf16_rate_when_matmul_precision_allows(highest_precision):
    assert costmodel.tensor_flops_per_second(TRN2, torch.float32) == 20e12
    torch.set_float32_matmul_precision("high")
    assert costmodel.tensor_flops_per_second(TRN2, torch.float32) == 79e12


def test_fp32_matmul_op_charged_at_bf16_rate_under_high_precision(highest_precision):
    a = torch.ones(1024, 1024, device="neuron")
    torch.set_float32_matmul_precision("high")
    elapsed = elapsed_ms(lambda: a @ a)
    compute, memory = 2 * 1024**3 / 79e12, DMA_HEAD + 3 * 4 * 1024**2 / HBM_PER_CORE_TRN2  # fp32 moves 4 bytes
    assert memory > compute
    assert elapsed == pytest.approx((memory + LAUNCH) * 1e3)


def test_fp32_matmuls_of_one_shape_are_charged_at_the_precision_of_each_call(highest_precision):
    """The op ledger caches a matmul's charge per shapes: switching the precision between calls of the same shapes
    charges the other rate, and switching back the first again (a cache keyed by shapes alone would not)."""
    a = torch.ones(1024, 1024, device="neuron")
    highest = elapsed_ms(lambda: a @ a)
    torch.set_float32_matmul_precision("high")
    high = elapsed_ms(lambda: a @ a)
    torch.set_float32_matmul_precision("highest")
    assert highest == pytest.approx((2 * 1024**3 / 20e12 + LAUNCH) * 1e3)
    assert high == pytest.approx((DMA_HEAD + 3 * 4 * 1024**2 / HBM_PER_CORE_TRN2 + LAUNCH) * 1e3)
    assert elapsed_ms(lambda: a @ a) == pytest.approx(highest)


def test_large_elementwise_op_is_hbm_bound():
    n = 1 << 26  # fp32 a + b: two inputs read, one output written
    hbm_bytes = 3 * 4 * n
    estimate = costmodel.estimate_kernel({"vector": 2 * n}, hbm_bytes, dtype=torch.float32, target=TRN2)
    assert estimate.bound == "memory"
    assert estimate.memory_seconds == pytest.approx(DMA_HEAD + hbm_bytes / HBM_PER_CORE_TRN2)
    assert estimate.engine_seconds["vector"] == pytest.approx(2 * n / (256 * 0.96e9) + VECTOR_ACCESS_TRN2)
    assert estimate.seconds == pytest.approx(DMA_HEAD + hbm_bytes / HBM_PER_CORE_TRN2 + LAUNCH)


def test_vector_engine_runs_16_bit_types_at_twice_the_rate_on_trn2():
    fp32 = costmodel.estimate_kernel({"vector": 1e9}, 0, dtype=torch.float32, target=TRN2)
    bf16 = costmodel.estimate_kernel({"vector": 1e9}, 0, dtype=torch.bfloat16, target=TRN2)
    # the data part doubles; the operand accesses are a fixed cost per instruction
    assert fp32.engine_seconds["vector"] - VECTOR_ACCESS_TRN2 == pytest.approx(
        2 * (bf16.engine_seconds["vector"] - VECTOR_ACCESS_TRN2))


def test_slowest_engine_or_memory_sets_the_time():
    estimate = costmodel.estimate_kernel({"scalar": 1e9, "vector": 1e6}, 1e3, target=TRN2)
    assert estimate.bound == "scalar"
    assert estimate.seconds == pytest.approx(1e9 / (128 * 1.2e9) + 2 * costs.ACCESS_CYCLES / 1.2e9 + LAUNCH)


def test_empty_kernel_costs_the_launch():
    estimate = costmodel.estimate_kernel({}, 0, target=TRN2)
    assert estimate.bound == "launch"
    assert estimate.seconds == LAUNCH


def test_two_cores_of_a_logical_core_double_rates_and_hbm_share():
    one = costmodel.estimate_kernel({"tensor": 1e12}, 1e9, dtype=torch.bfloat16, target=TRN2)
    two = costmodel.estimate_kernel({"tensor": 1e12}, 1e9, dtype=torch.bfloat16, target=TRN2, cores=2)
    assert two.engine_seconds["tensor"] == pytest.approx(one.engine_seconds["tensor"] / 2)
    assert two.memory_seconds - DMA_HEAD == pytest.approx((one.memory_seconds - DMA_HEAD) / 2)  # the latency stays


def test_transfer_over_the_host_link():
    assert costmodel.transfer_seconds(64_000_000, TRN2) == pytest.approx(costmodel.TRANSFER_FIXED_SECONDS + 1e-3)


@pytest.mark.parametrize(
    ("work", "hbm_bytes", "cores", "message"),
    [
        ({"tensorcore": 1.0}, 0, 1, "unknown engine 'tensorcore'"),
        ({"vector": -1.0}, 0, 1, "non-negative"),
        ({}, -5, 1, "hbm_bytes must be non-negative"),
        ({}, 0, 0, "at least one core"),
    ],
)
def test_bad_input_is_rejected(work, hbm_bytes, cores, message):
    with pytest.raises(ValueError, match=message):
        costmodel.estimate_kernel(work, hbm_bytes, target=TRN2, cores=cores)


# The per-op estimates the eager runtime charges (default target trn2, eager ops on one physical core).


def test_matmul_op_is_charged_its_flops_at_the_tensor_engine_rate(highest_precision):
    a, b = torch.ones(1024, 1024, device="neuron"), torch.ones(1024, 1024, device="neuron")
    elapsed = elapsed_ms(lambda: a @ b)
    assert elapsed == pytest.approx((2 * 1024**3 / 20e12 + LAUNCH) * 1e3)


def test_bf16_matmul_op_is_charged_at_the_bf16_rate():
    a = torch.ones(1024, 1024, dtype=torch.bfloat16, device="neuron")
    elapsed = elapsed_ms(lambda: a @ a)
    assert elapsed == pytest.approx((2 * 1024**3 / 79e12 + LAUNCH) * 1e3)


def test_convolution_op_is_charged_its_flops(highest_precision):
    x = torch.ones(1, 64, 64, 64, device="neuron")
    conv = torch.nn.Conv2d(64, 64, 3, padding=1, bias=False).to("neuron")
    with torch.no_grad():
        elapsed = elapsed_ms(lambda: conv(x))
    flops = 2 * (64 * 64 * 64) * (64 * 3 * 3)  # 2 x outputs x MACs per output
    assert elapsed == pytest.approx((flops / 20e12 + LAUNCH) * 1e3)


def test_elementwise_op_is_charged_its_hbm_traffic():
    n = 1 << 22
    a, b = torch.ones(n, device="neuron"), torch.ones(n, device="neuron")
    elapsed = elapsed_ms(lambda: a + b)
    assert elapsed == pytest.approx((DMA_HEAD + 3 * 4 * n / HBM_PER_CORE_TRN2 + LAUNCH) * 1e3)


def test_metadata_only_view_costs_nothing():
    a = torch.ones(64, 64, device="neuron")
    assert elapsed_ms(lambda: a.t()) == 0.0


def test_matmul_array_flops_charges_the_idle_part_of_the_array():
    # shapes that fill the 128 x 128 array cost their FLOPs
    assert costmodel.matmul_array_flops(1024, 1024, 1024) == 2 * 1024**3
    # a mat-vec fills one column: each 128-deep slice is a 64-cycle pass per 128 rows (NKI's matmul cost)
    assert costmodel.matmul_array_flops(4096, 4096, 1) == 2 * 128 * 128 * 64 * 32 * 32
    # either operand can be the stationary one: the cheaper orientation is taken
    assert costmodel.matmul_array_flops(1, 4096, 4096) == costmodel.matmul_array_flops(4096, 4096, 1)
    assert costmodel.matmul_array_flops(0, 8, 8) == 0.0


@pytest.mark.parametrize("update", ["index_copy_", "setitem"])
def test_an_in_place_scatter_is_charged_the_rows_it_moves(update):
    """Issue 38 (E4's eager prefill): a static KV cache's update, `cache.index_copy_(2, positions, new)` (or its
    fallback `cache[:, :, positions] = new`), writes its rows into the cache's buffer: the rows and their positions
    in, the rows out, not the whole cache read and written. An out-of-place `index_copy` does write a new cache."""
    cache = torch.zeros(1, 1, 8192, 128, dtype=torch.bfloat16, device="neuron")
    new = torch.ones(1, 1, 16, 128, dtype=torch.bfloat16, device="neuron")
    positions = torch.arange(16, device="neuron")
    rows, index = new.nbytes, positions.nbytes

    def scatter():
        if update == "index_copy_":
            cache.index_copy_(2, positions, new)
        else:
            cache[:, :, positions] = new

    def expected_ms(elements: int, hbm_bytes: int) -> float:
        return costmodel.estimate_kernel({"gpsimd": elements}, hbm_bytes, dtype=torch.bfloat16).seconds * 1e3

    assert elapsed_ms(scatter) == pytest.approx(expected_ms(16 * 128, rows + index + rows))
    out_of_place = elapsed_ms(lambda: cache.index_copy(2, positions, new))
    assert out_of_place == pytest.approx(expected_ms(cache.numel(), 2 * cache.nbytes + rows + index))


@pytest.mark.parametrize("gather", ["embedding", "index_select"])
def test_a_gather_reads_only_the_rows_it_selects(gather):
    """Issue 38 (E4's eager prefill): an embedding lookup of 128 tokens reads their 128 rows of the table, not the
    whole table (32,000 x 4,096 bf16, 262 MB: ~1 ms a lookup on a trn1 core), as the compiled path prices a gather
    (`neuron_compile.passes`); a table smaller than what is gathered from it is read once."""
    table = torch.zeros(32000, 256, dtype=torch.bfloat16, device="neuron")
    tokens = torch.arange(128, device="neuron")
    out_bytes = 128 * 256 * 2

    def lookup(rows):
        if gather == "embedding":
            return torch.nn.functional.embedding(rows, table)
        return table.index_select(0, rows)

    def expected_ms(hbm_bytes: int, elements: int) -> float:
        return costmodel.estimate_kernel({"gpsimd": elements}, hbm_bytes, dtype=torch.bfloat16).seconds * 1e3

    assert elapsed_ms(lambda: lookup(tokens)) == pytest.approx(expected_ms(out_bytes + tokens.nbytes + out_bytes,
                                                                           128 * 256))
    repeated = torch.zeros(64000, dtype=torch.int64, device="neuron")  # every row twice over: the table read once
    assert elapsed_ms(lambda: lookup(repeated)) == pytest.approx(
        expected_ms(table.nbytes + repeated.nbytes + 2 * table.nbytes, 2 * table.numel()))
