"""PyTorch's OpInfo database on `neuron`, compared against CPU (acceptance: >= 99 % of (op, dtype) pairs, no crash).

The sweep itself lives in `opinfo_support.py` (runnable alone for a full report); these tests run it and check the
harness can catch what it is meant to catch.
"""

from __future__ import annotations

import sys
import textwrap
import warnings

import opinfo_support
import pytest
import torch
from opinfo_support import Outcome

REQUIRED_PASS_RATE = 0.99

_SPARSE = "sparse layouts are not supported on neuron: a clear NotImplementedError instead of CPU's sparse result"
_DEVICE_POLICY = (
    "upstream picks the accumulation policy per device type (`_AUTO_DEFAULTS[(device.type, dtype)]` in "
    "torch/nn/modules/linear_cross_entropy_options.py): CPU has its own entry, neuron gets the generic fallback, "
    "so bfloat16 losses differ from CPU's by up to one bfloat16 ulp"
)
# Pairs known to fail, each with its reason. They count as failures in the pass rate; the sweep also fails when a
# pair outside this list fails (a regression) or a pair in it passes (the list is stale).
EXPECTED_FAILURES: dict[tuple[str, str], str] = {
    ("sparse.sampled_addmm", "float32"): _SPARSE,
    ("sparse.mm.reduce", "float32"): _SPARSE,
    ("sparse.mm.reduce", "bfloat16"): _SPARSE,
    ("to_sparse", "float32"): _SPARSE,
    ("to_sparse", "bfloat16"): _SPARSE,
    ("to_sparse", "int64"): _SPARSE,
    ("to_sparse", "bool"): _SPARSE,
    ("nn.functional.linear_cross_entropy.chunked", "bfloat16"): _DEVICE_POLICY,
    ("nn.functional.linear_cross_entropy.chunked_none", "bfloat16"): _DEVICE_POLICY,
}


# The sweep is split into shards, each one test, so the two pytest-xdist workers of a CI session share it (one
# sweep worker process a shard). Each shard asserts, on its pairs, no crash, every failing pair listed in
# EXPECTED_FAILURES and every listed pair of the shard failing. Over all shards (`test_sweep_shards_partition_the_pairs`)
# the failing pairs are then exactly EXPECTED_FAILURES, so the whole sweep's pass rate is the one
# `test_expected_failures_keep_the_required_pass_rate` checks against REQUIRED_PASS_RATE.
SWEEP_SHARDS = 4


def _sweep_shard(pairs: list[tuple[str, str]], shard: int) -> list[tuple[str, str]]:
    return pairs[shard::SWEEP_SHARDS]


@pytest.mark.slow
@pytest.mark.parametrize("shard", range(SWEEP_SHARDS))
def test_opinfo_sweep_matches_cpu(shard):
    """Every OpInfo x (float32, bfloat16, int64, bool), every sample, one shard of the pairs: nothing crashes and
    the failing pairs are the expected ones (the whole sweep's >= 99 %: see above)."""
    pairs = _sweep_shard(opinfo_support.all_pairs(opinfo_support.load_op_db()), shard)
    results = opinfo_support.run_sweep(pairs, workers=1)
    text = opinfo_support.report(results)
    print(text)
    crashes = [r for r in results if r.status == "crash"]
    failing = {(r.op, r.dtype) for r in results if r.status != "pass"}
    expected = EXPECTED_FAILURES.keys() & set(pairs)
    assert not crashes, text
    assert failing <= EXPECTED_FAILURES.keys(), f"unexpected failures {sorted(failing - EXPECTED_FAILURES.keys())}"
    assert expected <= failing, f"now passing: {sorted(expected - failing)}"


def test_sweep_shards_partition_the_pairs(ops):
    """The shards of `test_opinfo_sweep_matches_cpu` together check every pair, each once."""
    pairs = opinfo_support.all_pairs(ops)
    shards = [_sweep_shard(pairs, shard) for shard in range(SWEEP_SHARDS)]
    assert sorted(pair for shard in shards for pair in shard) == sorted(pairs)
    assert all(shards)


def test_expected_failures_keep_the_required_pass_rate(ops):
    """With the shards' checks passing, exactly EXPECTED_FAILURES fail: the whole sweep's pass rate is this one."""
    pairs = opinfo_support.all_pairs(ops)
    assert len(pairs) - len(EXPECTED_FAILURES) >= REQUIRED_PASS_RATE * len(pairs)


def test_custom_op_and_autograd_function_databases_match_cpu():
    """Upstream's OpInfos of `torch.library.custom_op`s and `autograd.Function`s (NumPy kernels behind torch ops, as
    user extensions write them), in float32 and int64 where the CPU supports them, through the sweep's harness.
    (Their samples cannot be made in bool: `sample_inputs_numpy_nonzero` fails on the CPU too.)"""
    from torch.testing._internal.autograd_function_db import autograd_function_db
    from torch.testing._internal.custom_op_db import custom_op_db

    expected = {  # writes into `x.cpu().numpy()`, which is a copy on any accelerator (CUDA too), not `x`
        "NumpyExpMarkDirtyAutogradFunction": "result",
    }
    failures, checked = {}, 0
    for op in [*custom_op_db, *autograd_function_db]:
        for dtype in sorted(op.supported_dtypes("cpu") & {torch.float32, torch.int64}, key=str):
            outcome = opinfo_support.check_pair(op, dtype)
            checked += outcome.samples
            if outcome.status != "pass":
                failures.setdefault(op.name, outcome.reason)
    assert {name: name in expected and expected[name] in reason for name, reason in failures.items()} == {
        name: True for name in expected
    }, failures
    assert checked >= 40


def test_expected_failures_name_real_pairs(ops):
    assert EXPECTED_FAILURES.keys() <= set(opinfo_support.all_pairs(ops))


def test_sparse_results_raise_a_clear_error():
    with pytest.raises(NotImplementedError, match="only strided"):
        torch.ones(2, 2, device="neuron").to_sparse()


def test_sparse_neuron_tensors_raise_a_clear_error():
    """Ops that make or take a sparse `neuron` tensor directly, not through the CPU (torch's own message names a
    'Sparseneuron' backend); `nn.Embedding(sparse=True)` makes one in backward."""
    with pytest.raises(NotImplementedError, match=r"_sparse_coo_tensor_with_dims_and_tensors .* only strided"):
        torch.sparse_coo_tensor(torch.tensor([[0, 1]]), torch.ones(2), (3,), device="neuron")
    embedding = torch.nn.Embedding(10, 3, sparse=True).to("neuron")
    with pytest.raises(NotImplementedError, match=r"nn\.Embedding and nn\.EmbeddingBag: sparse=False"):
        embedding(torch.tensor([1, 2], device="neuron")).sum().backward()


def test_cpu_exact_list_is_complete():
    """Every op with both a CPU kernel and a composite kernel runs the CPU kernel on neuron (see `ops.cpu_exact`)."""
    from neuron_device.ops.cpu_exact import CPU_KERNEL_OVER_COMPOSITE

    has = torch._C._dispatch_has_kernel_for_dispatch_key
    found = {
        name.removeprefix("aten::")
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("aten::")
        and has(name, "CPU")
        and (has(name, "CompositeExplicitAutograd") or has(name, "CompositeImplicitAutograd"))
    }
    assert found == set(CPU_KERNEL_OVER_COMPOSITE)


# --- the harness -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ops():
    return opinfo_support.load_op_db()


@pytest.mark.parametrize("name", ["add", "sort", "index_put", "zeros", "nn.functional.conv2d"])
def test_deterministic_ops_pass(ops, name):
    outcome = opinfo_support.check_pair(ops[name], torch.float32)
    assert outcome.status == "pass", outcome.reason
    assert outcome.samples > 0 and not outcome.random


@pytest.mark.parametrize("name", ["normal", "bernoulli", "nn.functional.dropout", "empty_like"])
def test_random_ops_are_checked_as_random(ops, name):
    outcome = opinfo_support.check_pair(ops[name], torch.float32)
    assert outcome.status == "pass", outcome.reason
    assert outcome.random


class _FakeOp:
    """Just enough of an OpInfo for `check_pair`: one sample, a function chosen by the test."""

    name, variant_test_name, decorators = "fake", "", ()

    def __init__(self, fn):
        self.fn = fn

    def sample_inputs(self, device, dtype, requires_grad=False):
        from torch.testing._internal.opinfo.core import SampleInput

        yield SampleInput(torch.arange(6, dtype=dtype, device=device).reshape(2, 3), args=(2,))

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def test_wrong_value_on_neuron_fails():
    def off_by_one_on_neuron(x, k):
        return x * k + (x.device.type == "neuron")

    outcome = opinfo_support.check_pair(_FakeOp(off_by_one_on_neuron), torch.float32)
    assert outcome.status == "fail" and "result" in outcome.reason


def test_result_left_on_cpu_fails():
    outcome = opinfo_support.check_pair(_FakeOp(lambda x, k: (x * k).cpu()), torch.float32)
    assert outcome.status == "fail" and "expected a neuron tensor" in outcome.reason


def test_neuron_must_raise_when_cpu_raises():
    def raises_on_cpu_only(x, k):
        if x.device.type == "cpu":
            raise ValueError("bad input")
        return x

    outcome = opinfo_support.check_pair(_FakeOp(raises_on_cpu_only), torch.float32)
    assert outcome.status == "fail" and "CPU raised ValueError" in outcome.reason


def test_different_mutation_of_an_input_fails():
    def mutates_on_neuron(x, k):
        result = x * k
        if x.device.type == "neuron":
            x.add_(1)
        return result

    outcome = opinfo_support.check_pair(_FakeOp(mutates_on_neuron), torch.float32)
    assert outcome.status == "fail" and "inputs after the call" in outcome.reason


def test_warning_only_on_neuron_fails():
    def warns(x, k):
        warnings.warn(f"tensor on {x.device} ignored", stacklevel=2)  # the same on both devices, names aside
        if x.device.type == "neuron":
            warnings.warn("An output with one or more elements was resized", stacklevel=2)
        return x * k

    outcome = opinfo_support.check_pair(_FakeOp(warns), torch.float32)
    assert outcome.status == "fail" and "neuron warned where the CPU did not" in outcome.reason
    assert "resized" in outcome.reason


def test_irreproducible_random_op_fails():
    draws = iter(range(100))

    def unseeded_on_neuron(x, k):
        noise = torch.rand(x.shape, device=x.device)  # draws from the seeded generator: marks the sample random
        return noise + next(draws) if x.device.type == "neuron" else noise

    outcome = opinfo_support.check_pair(_FakeOp(unseeded_on_neuron), torch.float32)
    assert outcome.status == "fail" and "rerun under the same seed" in outcome.reason


def test_low_precision_result_closer_to_float64_than_cpu_passes():
    """bfloat16 results may differ from CPU's when they are at least as accurate (the matmul numerics policy)."""

    def less_accurate_on_cpu(x, k):
        exact = x.double() / 3
        if x.device.type == "cpu" and x.dtype is torch.bfloat16:
            exact = exact + 0.05
        return exact.to(x.dtype)

    assert opinfo_support.check_pair(_FakeOp(less_accurate_on_cpu), torch.bfloat16).status == "pass"
    assert opinfo_support.check_pair(_FakeOp(lambda x, k: (x / 3 + (x.device.type == "neuron"))),
                                     torch.bfloat16).status == "fail"


def test_thinning_keeps_spread_and_order():
    assert opinfo_support._thin(list(range(10)), 20) == list(range(10))
    assert opinfo_support._thin(list(range(10)), 5) == [0, 2, 4, 6, 8]


def test_crash_and_hang_are_recorded_not_fatal(tmp_path):
    """A worker that dies or hangs on a pair: that pair is a crash, the others still get their verdict."""
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys, time
        for op, dtype in json.load(sys.stdin):
            print(json.dumps({"start": [op, dtype]}), flush=True)
            if op == "dies":
                os._exit(-11)
            if op == "hangs":
                time.sleep(60)
            print(json.dumps({"done": {"op": op, "dtype": dtype, "status": "pass"}}), flush=True)
    """))
    pairs = [("a", "float32"), ("dies", "float32"), ("b", "bool"), ("hangs", "int64"), ("c", "bool")]
    results = opinfo_support.run_sweep(pairs, workers=1, timeout=5, command=[sys.executable, str(script)])
    assert [(r.op, r.status) for r in results] == [
        ("a", "pass"), ("dies", "crash"), ("b", "pass"), ("hangs", "crash"), ("c", "pass")
    ]
    assert "hang" in results[3].reason


def test_report_counts_pairs_per_dtype():
    results = [Outcome("a", "float32", "pass"), Outcome("b", "float32", "fail", "why"), Outcome("a", "bool", "pass")]
    text = opinfo_support.report(results)
    assert "float32: 1/2 = 50.00 %" in text and "bool: 1/1 = 100.00 %" in text
    assert "overall: 2/3 = 66.67 %" in text and "FAIL b [float32]: why" in text
