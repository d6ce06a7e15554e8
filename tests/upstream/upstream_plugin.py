"""A pytest plugin that runs PyTorch's own device-generic test suites on `neuron` (README.md in this folder).

`python -m pytest -p upstream_plugin --pytorch-tests PATH` (with this folder on `sys.path`) collects the suites of
`SUITES` from PATH, a PyTorch source tree at the release of the installed torch (its root, or its `test/` folder),
and keeps the tests of their device-type classes instantiated for the requested device types (`neuron` by default;
`--upstream-devices cpu,neuron` also runs each test's CPU twin, to classify failures). Nothing is downloaded.

Every test of `expected_failures.txt` is marked `xfail(strict=True)` with its reason: a listed test that passes fails
the run, so the list can only shrink. A list entry naming a test that the suites no longer have is an error too.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

# PyTorch's test files whose device-generic classes run here; test_torch and test_autograd also have classes that
# are not device-generic (TestTorch, TestAutograd: CPU only), which `_instantiated_for` leaves out like CPU twins.
SUITES = (
    "test_binary_ufuncs.py",
    "test_view_ops.py",
    "test_indexing.py",
    "test_shape_ops.py",
    "test_sort_and_select.py",
    "test_tensor_creation_ops.py",
    "test_type_promotion.py",
    "test_torch.py",
    "test_autograd.py",
)
EXPECTED_FAILURES = Path(__file__).with_name("expected_failures.txt")
# Why a listed test fails on `neuron`; every entry names one of these before its own reason.
CATEGORIES = {
    "cpu-semantics": "neuron follows the CPU where the test expects CUDA's behaviour (CUDA-only assertions)",
    "python-backend": "a limit of torch 2.13 for a backend written in Python (PrivateUse1 hooks it lacks)",
    "by-design": "sparse, quantized and torch.Generator('neuron') are not part of the device (docs/design.md)",
    "fails-on-cpu": "the test fails on the CPU too, with torch 2.13 (its CPU twin is not ours to fix)",
}
# torch's class-name suffix for the PrivateUse1 instantiation, and the device type in the test names
_SUFFIX = {"neuron": "PRIVATEUSE1", "cpu": "CPU"}


@dataclass(frozen=True)
class Expected:
    """One line of the expected-failure list."""

    category: str
    reason: str
    line: int


def read_expected(path: Path) -> dict[str, Expected]:
    """`file::Class::test  # category: reason` lines (blank lines and whole-line comments aside), each id once,
    each with a known category and a reason."""
    expected: dict[str, Expected] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        test_id, _, note = (part.strip() for part in line.partition("#"))
        category, _, reason = (part.strip() for part in note.partition(":"))
        where = f"{path.name}:{number}"
        if test_id.count("::") != 2:
            raise pytest.UsageError(f"{where}: {test_id!r} is not a test id of the form file::Class::test")
        if category not in CATEGORIES or not reason:
            raise pytest.UsageError(
                f"{where}: every entry needs '# category: reason' with a category of {sorted(CATEGORIES)}; got {note!r}"
            )
        if test_id in expected:
            raise pytest.UsageError(f"{where}: {test_id} is listed twice (first on line {expected[test_id].line})")
        expected[test_id] = Expected(category, reason, number)
    return expected


def pytorch_test_folder(root: Path, suites: list[str]) -> Path:
    """The `test/` folder of the PyTorch source tree `root` (or `root` itself), which must hold `suites`; refused
    unless the tree's `version.txt` is the installed torch's release: the suites test their own release's internals."""
    folder = root / "test" if (root / "test").is_dir() else root
    version_file = folder.parent / "version.txt"
    if not version_file.is_file():
        raise pytest.UsageError(
            f"--pytorch-tests {root}: no version.txt at {version_file}, so the tree's PyTorch release is unknown; "
            "pass the root of a PyTorch source tree (or its test/ folder)"
        )
    tree = version_file.read_text().strip()
    installed = torch.__version__.split("+")[0]
    if tree.split(".")[:2] != installed.split(".")[:2]:
        raise pytest.UsageError(
            f"--pytorch-tests {root}: the tree is PyTorch {tree}, the installed torch is {installed}; "
            f"use the tests of the v{installed} tag"
        )
    missing = [name for name in suites if not (folder / name).is_file()]
    if missing:
        raise pytest.UsageError(f"--pytorch-tests {root}: {folder} has no {', '.join(missing)}")
    return folder


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("upstream", "PyTorch's device-generic suites on neuron (tests/upstream)")
    group.addoption("--pytorch-tests", metavar="PATH", help="a PyTorch source tree at the installed torch's release")
    group.addoption("--upstream-devices", default="neuron", metavar="TYPES",
                    help="device types to run, comma-separated: neuron (default), or cpu,neuron to classify")
    group.addoption("--upstream-suite", action="append", default=[], metavar="FILE",
                    help=f"run only this suite (repeatable); default: all of {', '.join(SUITES)}")
    group.addoption("--upstream-expected", default=str(EXPECTED_FAILURES), metavar="LIST",
                    help="the expected-failure list (default: expected_failures.txt beside this plugin)")
    group.addoption("--upstream-report", metavar="JSON",
                    help="write each failing neuron test with its CPU twin's outcome (with --upstream-devices cpu,neuron)")


def pytest_configure(config: pytest.Config) -> None:
    root = config.getoption("pytorch_tests")
    if root is None:
        raise pytest.UsageError("upstream_plugin needs --pytorch-tests PATH (a PyTorch source tree; tests/upstream/README.md)")
    devices = [d for d in config.getoption("upstream_devices").split(",") if d]
    unknown = set(devices) - set(_SUFFIX)
    if unknown:
        raise pytest.UsageError(f"--upstream-devices: unknown device types {sorted(unknown)}; choose from {sorted(_SUFFIX)}")
    suites = config.getoption("upstream_suite") or list(SUITES)
    unknown = set(suites) - set(SUITES)
    if unknown:
        raise pytest.UsageError(f"--upstream-suite: {sorted(unknown)} are not among {list(SUITES)}")
    folder = pytorch_test_folder(Path(root).resolve(), suites)
    # read by instantiate_device_type_tests when the suites are imported, in this process and in xdist's workers
    os.environ["PYTORCH_TESTING_DEVICE_ONLY_FOR"] = ",".join(devices)
    config.args[:] = [str(folder / name) for name in suites]
    config.pluginmanager.register(
        _Runner(read_expected(Path(config.getoption("upstream_expected"))), devices, config.getoption("upstream_report")), "upstream-runner"
    )


def _test_id(item: pytest.Item) -> str:
    return f"{item.path.name}::{item.cls.__name__}::{item.name}"


def _cpu_twin(nodeid: str) -> str:
    """The CPU instantiation of a neuron test: class suffix PRIVATEUSE1 -> CPU, `_neuron` -> `_cpu` in its name."""
    path, cls, name = nodeid.rsplit("::", 2)
    head, _, tail = name.rpartition("_neuron")
    return f"{path}::{cls.removesuffix(_SUFFIX['neuron'])}{_SUFFIX['cpu']}::{head}_cpu{tail}"


def _outcome(report: pytest.TestReport) -> str:
    if hasattr(report, "wasxfail"):
        return "xfailed"
    if report.failed and str(report.longrepr).startswith("[XPASS(strict)]"):
        return "xpassed"  # listed, and passes: its line goes
    return report.outcome


class _Runner:
    """Selects the instantiated tests, marks the expected failures, records outcomes for `--upstream-report`."""

    def __init__(self, expected: dict[str, Expected], devices: list[str], report: str | None) -> None:
        self.expected = expected
        self.devices = devices
        self.report = report
        self.outcomes: dict[str, str] = {}

    def _instantiated(self, item: pytest.Item) -> bool:
        """Whether `item` is a test of a device-generic class instantiated for one of the requested devices."""
        cls = getattr(item, "cls", None)
        return cls is not None and hasattr(cls, "device_type") and cls.__name__.endswith(
            tuple(_SUFFIX[d] for d in self.devices)
        )

    @pytest.hookimpl(tryfirst=True)  # before -k/-m deselect: stale entries are judged against all that was collected
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        kept, dropped = [], []
        for item in items:
            (kept if self._instantiated(item) else dropped).append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = kept
        if "neuron" in self.devices:
            self._check_stale(kept)
        for item in kept:
            entry = self.expected.get(_test_id(item))
            if entry is not None:
                item.add_marker(pytest.mark.xfail(strict=True, reason=f"{entry.category}: {entry.reason}"))

    def _check_stale(self, items: list[pytest.Item]) -> None:
        collected = {_test_id(item) for item in items}
        files = {item.path.name for item in items}
        stale = sorted(t for t in self.expected if t.split("::")[0] in files and t not in collected)
        if stale:
            more = f" and {len(stale) - 20} more" if len(stale) > 20 else ""
            raise pytest.UsageError(
                "the expected-failure list names tests the suites do not have (renamed or removed upstream: delete "
                f"those lines): {', '.join(stale[:20])}{more}"
            )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """A test's outcome (xdist's controller receives every worker's reports): its worst phase."""
        if self.report and (report.when == "call" or report.outcome != "passed"):
            if self.outcomes.get(report.nodeid, "passed") == "passed":
                self.outcomes[report.nodeid] = _outcome(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """`--upstream-report`: each failing (or listed and passing) neuron test, with its CPU twin's outcome (written
        by xdist's controller, not its workers)."""
        if not self.report or hasattr(session.config, "workerinput"):
            return
        failing = {
            nodeid.rsplit("/", 1)[-1]: {"neuron": outcome, "cpu": self.outcomes.get(_cpu_twin(nodeid), "not run")}
            for nodeid, outcome in sorted(self.outcomes.items())
            if nodeid.rsplit("::", 2)[1].endswith(_SUFFIX["neuron"]) and outcome in ("failed", "xfailed", "xpassed")
        }
        Path(self.report).write_text(json.dumps(failing, indent=1) + "\n")
