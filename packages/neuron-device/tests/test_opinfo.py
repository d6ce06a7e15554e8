"""PyTorch's OpInfo database on `neuron`, compared against CPU (acceptance: >= 99 % of (op, dtype) pairs, no crash).

The sweep itself lives in `opinfo_support.py` (runnable alone for a full report); these tests run it and check the
harness can catch what it is meant to catch.
"""

from __future__ import annotations

import sys
import textwrap

import opinfo_support
import pytest
import torch
from opinfo_support import Outcome

REQUIRED_PASS_RATE = 0.99


@pytest.mark.slow
def test_opinfo_sweep_matches_cpu():
    """Every OpInfo x (float32, bfloat16, int64, bool), every sample: >= 99 % of pairs pass and nothing crashes."""
    pairs = opinfo_support.all_pairs(opinfo_support.load_op_db())
    results = opinfo_support.run_sweep(pairs)
    text = opinfo_support.report(results)
    print(text)
    crashes = [r for r in results if r.status == "crash"]
    passed = sum(r.status == "pass" for r in results)
    assert not crashes, text
    assert passed >= REQUIRED_PASS_RATE * len(results), text


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

        yield SampleInput(torch.arange(6, dtype=dtype).reshape(2, 3), args=(2,))

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
        if x.device.type == "neuron":
            x.add_(1)
        return x * k

    outcome = opinfo_support.check_pair(_FakeOp(mutates_on_neuron), torch.float32)
    assert outcome.status == "fail" and "inputs after the call" in outcome.reason


def test_irreproducible_random_op_fails():
    draws = iter(range(100))

    def unseeded_on_neuron(x, k):
        noise = torch.rand(x.shape, device=x.device)  # draws from the seeded generator: marks the sample random
        return noise + next(draws) if x.device.type == "neuron" else noise

    outcome = opinfo_support.check_pair(_FakeOp(unseeded_on_neuron), torch.float32)
    assert outcome.status == "fail" and "rerun under the same seed" in outcome.reason


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
