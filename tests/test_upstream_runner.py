"""The runner of PyTorch's device-generic suites on `neuron` (tests/upstream/upstream_plugin.py), on a PyTorch tree
of our own making: the real suites need a PyTorch source tree (tests/upstream/README.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

UPSTREAM = Path(__file__).parent / "upstream"
_spec = importlib.util.spec_from_file_location("upstream_plugin", UPSTREAM / "upstream_plugin.py")
plugin = sys.modules["upstream_plugin"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plugin)

# A suite in the form of PyTorch's: a device-generic class (instantiated for each device type) and a plain one.
SUITE = """
import torch
from torch.testing._internal.common_device_type import dtypes, instantiate_device_type_tests
from torch.testing._internal.common_utils import TestCase


class TestTiny(TestCase):
    @dtypes(torch.float32)
    def test_ok(self, device, dtype):
        self.assertEqual(torch.ones(2, device=device, dtype=dtype).sum().item(), 2)

    def test_listed_failure(self, device):
        self.assertEqual(1, 2)

    def test_unlisted_failure(self, device):
        self.assertEqual(1, 2)

    def test_listed_but_passes(self, device):
        pass

    def test_neuron_only_failure(self, device):
        self.assertEqual(torch.zeros(1, device=device).device.type, "cpu")


class TestPlain(TestCase):
    def test_plain(self):
        self.assertEqual(1, 2)


instantiate_device_type_tests(TestTiny, globals())
"""


def _tree(root: Path, version: str = torch.__version__.split("+")[0]) -> Path:
    (root / "test").mkdir(parents=True)
    (root / "version.txt").write_text(version + "\n")
    (root / "test" / "test_shape_ops.py").write_text(SUITE)
    return root


def test_runs_the_neuron_instantiations_with_their_expected_failures_and_classifies_by_the_cpu_twin(tmp_path):
    tree = _tree(tmp_path / "pytorch")
    listed = tmp_path / "expected.txt"
    listed.write_text(textwrap.dedent("""\
        # PyTorch's own failure and a fixed one
        test_shape_ops.py::TestTinyPRIVATEUSE1::test_listed_failure_neuron  # fails-on-cpu: fails on the CPU too
        test_shape_ops.py::TestTinyPRIVATEUSE1::test_listed_but_passes_neuron  # cpu-semantics: fixed since
    """))
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(UPSTREAM), *sys.path])}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "upstream_plugin", "--pytorch-tests", str(tree), "--upstream-suite",
         "test_shape_ops.py", "--upstream-expected", str(listed), "--upstream-devices", "cpu,neuron",
         "--upstream-report", str(report), "-p", "no:cacheprovider", "-q", "-rfxX"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600, check=False,
    )
    summary = result.stdout.splitlines()[-1]
    # 5 neuron and 5 CPU instantiations; TestPlain (no device) is left out; the CPU's 2 failures are PyTorch's
    assert result.returncode == 1 and "5 failed, 4 passed, 1 deselected, 1 xfailed" in summary, result.stdout[-3000:]
    assert "XPASS(strict)" in result.stdout and "fails-on-cpu: fails on the CPU too" in result.stdout
    assert json.loads(report.read_text()) == {
        "test_shape_ops.py::TestTinyPRIVATEUSE1::test_listed_but_passes_neuron": {"neuron": "xpassed", "cpu": "passed"},
        "test_shape_ops.py::TestTinyPRIVATEUSE1::test_listed_failure_neuron": {"neuron": "xfailed", "cpu": "failed"},
        "test_shape_ops.py::TestTinyPRIVATEUSE1::test_neuron_only_failure_neuron": {"neuron": "failed", "cpu": "passed"},
        "test_shape_ops.py::TestTinyPRIVATEUSE1::test_unlisted_failure_neuron": {"neuron": "failed", "cpu": "failed"},
    }


@pytest.mark.parametrize(("line", "error"), [
    ("test_x.py::TestXPRIVATEUSE1::test_a_neuron", "every entry needs '# category: reason'"),
    ("test_x.py::TestXPRIVATEUSE1::test_a_neuron  # cpu-semantics:", "every entry needs '# category: reason'"),
    ("test_x.py::TestXPRIVATEUSE1::test_a_neuron  # flaky: sometimes", "every entry needs '# category: reason'"),
    ("test_x.py::test_a_neuron  # by-design: sparse", "is not a test id"),
])
def test_every_expected_failure_has_a_known_category_and_a_reason(tmp_path, line, error):
    listed = tmp_path / "expected.txt"
    listed.write_text(f"# header\n\n{line}\n")
    with pytest.raises(pytest.UsageError, match=f"expected.txt:3: .*{error}"):
        plugin.read_expected(listed)


def test_an_expected_failure_is_listed_once(tmp_path):
    listed = tmp_path / "expected.txt"
    listed.write_text("a.py::B::c  # by-design: sparse\na.py::B::c  # by-design: sparse\n")
    with pytest.raises(pytest.UsageError, match="listed twice"):
        plugin.read_expected(listed)


def test_the_checked_in_list_is_well_formed():
    for entry in plugin.read_expected(plugin.EXPECTED_FAILURES).values():
        assert entry.category in plugin.CATEGORIES and entry.reason


def test_the_suites_of_another_release_or_an_unknown_one_are_refused(tmp_path):
    with pytest.raises(pytest.UsageError, match=r"the tree is PyTorch 2\.12\.0.*use the tests of the v"):
        plugin.pytorch_test_folder(_tree(tmp_path / "old", "2.12.0"), ["test_shape_ops.py"])
    bare = tmp_path / "bare"
    (bare / "test").mkdir(parents=True)
    with pytest.raises(pytest.UsageError, match=r"no version\.txt"):
        plugin.pytorch_test_folder(bare, ["test_shape_ops.py"])
    tree = _tree(tmp_path / "current")
    assert plugin.pytorch_test_folder(tree, ["test_shape_ops.py"]) == tree / "test"
    assert plugin.pytorch_test_folder(tree / "test", ["test_shape_ops.py"]) == tree / "test"
    with pytest.raises(pytest.UsageError, match=r"has no test_torch\.py"):
        plugin.pytorch_test_folder(tree, ["test_shape_ops.py", "test_torch.py"])
