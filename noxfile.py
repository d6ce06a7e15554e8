"""Test sessions: each wheel alone (with only its declared dependencies), all four together, and lint.

Where each test runs (tests/README.md, "Which session runs what"): a wheel's session runs all of its folder's tests
(slow and multi-process included, `optional` ones aside), with only that wheel and its declared dependencies
installed; `hf` runs the `optional` ones (they need transformers or accelerate); `all` runs the
cross-package tests of `tests/` and, from the wheels' folders, only the tests marked `all_wheels`: those that need a
sibling wheel (they skip alone) or whose outcome can differ when the other wheels' plugins are active. A test whose
outcome cannot differ runs once, in its wheel's session.

`nox` runs them all (what CI runs); `nox -s device` runs one. Virtualenvs are reused between runs (`.ci/run` keeps
them outside the checkout, keyed by what decides their contents), and torch is pinned (2.13.0) by neuron-device's own
metadata, so pip takes the CPU build from the local wheel cache, once: the sessions share one installation of it
(`_share_torch`).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tomllib
from pathlib import Path

import nox

nox.options.reuse_existing_virtualenvs = True
# compile-inductor runs inside the compile session (the same installation: one virtualenv less to create).
nox.options.sessions = ["lint", "device", "compile", "distributed", "nki", "all", "hf", "torchtitan", "docs"]

PYTHON = "3.11"
DEVICE = "packages/neuron-device"
# The metadata-only `torch-neuronx` distribution (no code): installed wherever neuron-device is, so libraries that
# detect TorchNeuron by distribution (diffusers) find it. No dependencies: pip never looks anything up for it.
TORCH_NEURONX = "packages/torch-neuronx"
# Each package's own directory, and the sibling packages it depends on (installed from this checkout, never from
# an index: the names may exist there as unrelated projects).
PACKAGES = {
    "device": [],
    "compile": [DEVICE],
    "distributed": [DEVICE],
    "nki": [DEVICE],
}
PATHS = {name: f"packages/neuron-{name}" for name in PACKAGES}
TEST_TOOLS = ["pytest", "pytest-xdist", "expecttest", "hypothesis"]
# Tests run on two pytest-xdist workers (CI's two cores), each with one intra-op thread: two workers with torch's
# default of a thread per core would oversubscribe the cores. Tests that launch several processes run among the others
# on the same workers, in the same pytest run: a worker waiting on a test's ranks leaves the other worker's tests the
# core (the distributed session's 132 multiprocess tests, on a quiet machine: 127 s in one process, 111 s on two
# workers), and each pytest run pays its workers' start-up (importing torch and collecting: 7-10 s of wall); so does
# torchtitan's, whose two modules run side by side.
#
# Bytecode is written (PYTHONDONTWRITEBYTECODE unset: None removes a variable in nox): a machine that sets it (this
# one's image does) otherwise compiles every imported module from source in every process: `import torch` 3.7 s of
# CPU against 1.4 s with its .pyc files, paid again by each pytest worker, subprocess test and rank. The modules a
# session imports are compiled once, on first import (installed with --no-compile: only those are compiled), torch's
# into the installation every session shares (`_share_torch`).
TEST_ENV: dict[str, str | None] = {"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": None}
# worksteal: a worker that runs out of tests takes queued ones from the other, so the session does not wait on
# one worker's queue behind a long test (the OpInfo sweep's shards, the compiled-model tests).
WORKERS = ("-n", "2", "--dist", "worksteal")
# Tests marked `optional` need a library no wheel declares (transformers, accelerate): the sessions of the wheels and
# `all` leave them out, and the session that installs those libraries (hf) runs them from every test folder, so none
# is skipped for a missing library.
NOT_OPTIONAL = "not optional"


def _install(session: nox.Session, *requirements: str, shared_torch: bool = True) -> None:
    """pip install without byte-compiling: torch alone has thousands of modules, of which a test run imports a
    fraction, compiled on first import (about 20 s less per virtualenv). torch comes from the shared installation
    (`_share_torch`) unless `shared_torch` is False (sessions that do not need it)."""
    if shared_torch:
        _share_torch(session)
    session.install("--no-compile", *requirements)


def _torch_requirement() -> str:
    """The torch pin, as neuron-device declares it (the one place it is written)."""
    metadata = tomllib.loads(Path(DEVICE, "pyproject.toml").read_text())
    return next(dep for dep in metadata["project"]["dependencies"] if dep.replace(" ", "").startswith("torch=="))


def _share_torch(session: nox.Session) -> None:
    """torch and its own dependencies installed once, in a directory beside the virtualenvs, and joined to this one by
    a `.pth` file (appended to `sys.path`, after the virtualenv's own packages): pip then finds the pin satisfied and
    installs only the rest. On a fresh machine each virtualenv saved about 800 MB written and 10 s of CPU, and the
    bytecode torch's modules compile to on first import is shared by every session. torch's dependencies are every
    wheel's dependencies too (each declares torch), so an alone-session still holds only what its wheel declares.
    Without a virtualenv (`nox --no-venv`, `.ci/selection.py`'s recording session) nothing is shared."""
    if not isinstance(getattr(session, "virtualenv", None), nox.virtualenv.VirtualEnv):
        return
    requirement = _torch_requirement()
    shared = Path(session.virtualenv.location).parent / ("shared-" + requirement.replace("==", "-"))
    if not shared.is_dir():
        staging = shared.with_name(shared.name + ".partial")  # renamed when complete: a stopped install is redone
        shutil.rmtree(staging, ignore_errors=True)
        session.run("python", "-m", "pip", "install", "--quiet", "--no-compile", "--target", str(staging),
                    requirement)
        staging.rename(shared)
    purelib = session.run("python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))",
                          silent=True).strip()
    Path(purelib, "shared-torch.pth").write_text(f"{shared}\n")


def _pytest(session: nox.Session, *tests: str, marks: str = "", env: dict[str, str | None] | None = None,
            by_module: bool = False) -> None:
    """pytest over `tests` (folders or files): the tests `marks` selects (all by default), in one run on the two
    workers; with `by_module`, each module's tests on one worker (`--dist loadfile`: tests that share a module's
    fixture, which each worker would otherwise build again). Arguments after `--` replace the selection, and
    everything runs in one process."""
    env = {**TEST_ENV, **(env or {})}
    if session.posargs:
        session.run("python", "-m", "pytest", *tests, *session.posargs, env=env)
        return
    workers = (*WORKERS[:2], "--dist", "loadfile") if by_module else WORKERS
    session.run("python", "-m", "pytest", *tests, *workers, *(("-m", marks) if marks else ()), env=env)


def _install_alone(session: nox.Session, package: str) -> None:
    """The package, the siblings it declares, the test tools: nothing else."""
    _install(session, *TEST_TOOLS, *PACKAGES[package], PATHS[package], TORCH_NEURONX)


def _package_session(package: str):
    def session_function(session: nox.Session) -> None:
        _install_alone(session, package)
        _pytest(session, f"{PATHS[package]}/tests", marks=NOT_OPTIONAL)

    session_function.__doc__ = f"neuron-{package} alone, with only its declared dependencies."
    return nox.session(python=PYTHON, name=package)(session_function)


for _package in ("device", "distributed", "nki"):
    _package_session(_package)


@nox.session(python=PYTHON, name="compile")
def compile_alone(session: nox.Session) -> None:
    """neuron-compile alone, with only its declared dependencies; then compile-inductor's tests in the same
    virtualenv (arguments after `--` run in both host codes)."""
    _install_alone(session, "compile")
    _pytest(session, f"{PATHS['compile']}/tests", marks=NOT_OPTIONAL)
    _inductor_host_code_tests(session)


@nox.session(python=PYTHON, name="device-adaptive-eager")
def device_adaptive_eager(session: nox.Session) -> None:
    """neuron-device's tests with adaptive eager on (`TORCH_NEURONX_ENABLE_CONCATENATION=1`), neuron-device alone:
    every queued run executes op by op, so results must stay bitwise those of plain eager. Not slow tests (the
    OpInfo sweep runs with `nox -s device-adaptive-eager -- -m slow`)."""
    _install(session, *TEST_TOOLS, DEVICE, TORCH_NEURONX)
    _pytest(session, f"{DEVICE}/tests", marks="not slow", env={"TORCH_NEURONX_ENABLE_CONCATENATION": "1"})


def _inductor_host_code_tests(session: nox.Session) -> None:
    """neuron-compile's tests and adaptive eager's fused path on the "inductor" host code
    (`NEURON_COMPILE_HOST_CODE=inductor`: Inductor's C++ code generation; the `compile` session's first run tests the
    default "aten" host code). Not slow tests, to keep the C++ compiles few: the slow ones compile C++ or set the host
    code themselves (`nox -s compile-inductor -- -m slow` runs them). Nor those marked `fixed_host_code`: they name
    their host code themselves or compile without the neuron backend, so the variable cannot change their run."""
    _pytest(session, f"{PATHS['compile']}/tests", "tests/test_adaptive_eager_fused.py",
            marks=f"not slow and not fixed_host_code and {NOT_OPTIONAL}", env={"NEURON_COMPILE_HOST_CODE": "inductor"})


@nox.session(python=PYTHON, name="compile-inductor")
def compile_inductor(session: nox.Session) -> None:
    _install(session, *TEST_TOOLS, DEVICE, PATHS["compile"])
    _inductor_host_code_tests(session)


compile_inductor.__doc__ = _inductor_host_code_tests.__doc__ + " Alone; `nox -s compile` runs them too."


@nox.session(python=PYTHON, name="all")
def all_packages(session: nox.Session) -> None:
    """All four wheels together (plugins active): the cross-package tests (`tests/`, which mark theirs `all_wheels`)
    and the wheels' tests marked `all_wheels` (they need a sibling wheel, or another wheel's plugin changes what
    they run: neuron-nki's kernels replace SDPA, norms and softmax; neuron-compile fuses adaptive eager's runs).
    Every other test of a wheel ran in that wheel's own session and cannot differ here.

    Not slow tests (those ran in the wheels' sessions; `nox -s all -- -m "all_wheels and slow"` runs them).
    """
    _install(session, *TEST_TOOLS, *PATHS.values(), TORCH_NEURONX)
    # One pytest run over every test folder, so the two workers share all of it (test modules have distinct basenames:
    # pytest imports each folder's modules by their bare names).
    _pytest(session, *(f"{path}/tests" for path in PATHS.values()), "tests",
            marks=f"all_wheels and not slow and {NOT_OPTIONAL}")


@nox.session(python=PYTHON)
def hf(session: nox.Session) -> None:
    """The Hugging Face drop-in: pinned transformers, accelerate, diffusers, peft, trl, kernels next to the four
    wheels; tiny models from configs (no downloads). The libraries come from the package index, pinned in
    requirements-hf.txt; about 2 minutes of tests on a quiet 2-core machine, plus the architecture sweeps' fixed
    sample (tests/hf/test_sweep.py: one model per task-head family, diffusers models and pipeline families, one
    compiled pair; 75 s of CPU time, measured on a loaded machine)."""
    _install(session, *TEST_TOOLS, *PATHS.values(), TORCH_NEURONX, "-r", "requirements-hf.txt")
    session.env["HF_HUB_OFFLINE"] = "1"
    # tests/hf (all `optional`) and the wheels' tests that need these libraries (their sessions leave them out)
    _pytest(session, "tests/hf", *(f"{path}/tests" for path in PATHS.values()), marks="optional")


# What the torchtitan session exercises: the four wheels (sources, metadata), its tests and requirements, this file.
# CI skips the session when none of it changed since its last pass (issue 39): it is the longest session (about 8
# minutes on a quiet 2-core machine), and its outcome is a function of these files alone.
TORCHTITAN_COVERS = (":(glob)packages/*/src/**", ":(glob)packages/*/pyproject.toml", "tests/torchtitan",
                     "requirements-torchtitan.txt", "noxfile.py")


def _content_key(paths: tuple[str, ...]) -> str | None:
    """A hash of the committed content of `paths` (git pathspecs), or None when it cannot stand for what runs: not
    a git checkout, or a change not committed (edited or untracked files under them)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args, "--", *paths], capture_output=True, text=True, check=True).stdout

    try:
        if git("status", "--porcelain", "--untracked-files=all"):
            return None
        return hashlib.sha256(git("ls-files", "--stage").encode()).hexdigest()
    except (OSError, subprocess.CalledProcessError):
        return None


def _passed_before(session: nox.Session, paths: tuple[str, ...]) -> tuple[Path, str | None]:
    """(the record of the session's last pass, the content key of `paths` now); skips the session when its last pass
    on this machine (the record in nox's cache directory, kept with the virtualenvs) was on the same content.
    `nox -s NAME -- ...` (arguments given) always runs."""
    record, key = session.cache_dir / f"{session.name}.passed", _content_key(paths)
    if key is not None and not session.posargs and record.is_file() and record.read_text() == key:
        session.skip(f"nothing it covers changed since its last pass ({', '.join(paths)}; key {key[:12]}): "
                     f"delete {record} or give pytest arguments (`nox -s {session.name} -- -x`) to run it")
    return record, key


@nox.session(python=PYTHON)
def torchtitan(session: nox.Session) -> None:
    """torchtitan as a client: its own entry point (`torchrun -m torchtitan.train`) trains its debug models on 2
    ranks of `neuron` (FSDP, TP, eager and compiled with the "neuron" backend), checked against the same runs on the
    CPU with Gloo. torchtitan 0.2.2 and its dependencies come from the package index, pinned in
    requirements-torchtitan.txt; the tokenizer and data set are made by the tests (no downloads). About 6 minutes of
    CPU time, mostly the start-up of each rank (measured: 13m57s on a loaded 2-core machine). Skipped when nothing
    it covers (`TORCHTITAN_COVERS`) changed since its last pass on this machine."""
    record, key = _passed_before(session, TORCHTITAN_COVERS)
    _install(session, *TEST_TOOLS, *PATHS.values(), TORCH_NEURONX, "-r", "requirements-torchtitan.txt")
    session.env["HF_HUB_OFFLINE"] = "1"
    session.env["HF_DATASETS_OFFLINE"] = "1"
    # the training tests share their module's seed checkpoints and CPU reference runs: that module runs on one
    # worker, the plan tests (their own real runs) on the other
    _pytest(session, "tests/torchtitan", by_module=True)
    if key is not None:
        record.write_text(key)


@nox.session(python=PYTHON)
def upstream(session: nox.Session) -> None:
    """PyTorch's own device-generic suites instantiated for `neuron` (test_binary_ufuncs, test_view_ops, test_indexing,
    test_shape_ops, test_sort_and_select, test_tensor_creation_ops, test_type_promotion, and the device-type classes of
    test_torch and test_autograd), against tests/upstream/expected_failures.txt. The suites come from a PyTorch source
    tree at the installed torch's release, which no package ships: `nox -s upstream -- --pytorch-tests PATH` (more
    pytest arguments may follow). Not a default session (tests/upstream/README.md)."""
    if not any(arg.startswith("--pytorch-tests") for arg in session.posargs):
        session.error("upstream needs a PyTorch source tree at torch's release: nox -s upstream -- --pytorch-tests PATH")
    _install(session, *TEST_TOOLS, DEVICE, TORCH_NEURONX)
    session.run("python", "-m", "pytest", "-p", "upstream_plugin", *WORKERS, *session.posargs,
                env={**TEST_ENV, "PYTHONPATH": "tests/upstream"})


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff over the whole tree, and the layering of the wheels (tests/test_layering.py: which wheel may import what;
    standard library only, so it runs without installing the packages)."""
    _install(session, "ruff==0.17.6", shared_torch=False)
    session.run("ruff", "check", ".")
    session.run("python", "tests/test_layering.py")


DOCS_TOOLS = ["mkdocs==1.6.1", "mkdocstrings==1.0.8", "mkdocstrings-python==2.0.11"]


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """The documentation site (docs/, mkdocs.yml) built with --strict: any warning fails. The API reference is read
    from the packages' sources; the env-var table is checked against them by tests/test_docs_env_vars.py."""
    _install(session, *DOCS_TOOLS, shared_torch=False)
    session.run("mkdocs", "build", "--strict", "--site-dir", f"{session.create_tmp()}/site")
