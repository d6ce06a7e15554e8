"""The persistent compile cache: keys, integrity (corrupted or foreign entries are recompiled, never loaded), hits
from another process, and concurrent processes compiling the same graph."""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from neuron_compile import cache, envvars, metrics
from neuron_compile.passes import KernelPlan
from neuron_compile.settings import CompileSettings

WORKER = Path(__file__).with_name("cache_worker.py")


def _graph(scale: float) -> torch.fx.GraphModule:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * scale + 1

    return torch.fx.symbolic_trace(f)


def _settings(cache_dir: Path, **options) -> CompileSettings:
    # overridden, not set and popped: popping would unset the session's cache directory (conftest) for every later
    # test of the process, which would then use, and drop entries of, the user's own cache
    with envvars.CACHE_DIR.overridden(str(cache_dir)):
        return CompileSettings.resolve(None, options)


def test_key_depends_on_graph_inputs_and_options(tmp_path) -> None:
    settings = _settings(tmp_path)
    x = torch.ones(4, device="neuron")
    key = cache.cache_key(_graph(2.0), [x], settings)
    assert key == cache.cache_key(_graph(2.0), [x], settings)
    assert key != cache.cache_key(_graph(3.0), [x], settings)
    assert key != cache.cache_key(_graph(2.0), [torch.ones(5, device="neuron")], settings)
    assert key != cache.cache_key(_graph(2.0), [x.double()], settings)
    assert key != cache.cache_key(_graph(2.0), [x], _settings(tmp_path, model_name="other"))


def test_key_depends_on_autocast_and_the_target(tmp_path, monkeypatch) -> None:
    """Everything a plan or a graph's code depends on besides the graph: the autocast state (`neuron`'s and the
    CPU's) and the simulated target and logical core size."""
    from neuron_device import services
    from neuron_spec.machine import read_topology

    settings = _settings(tmp_path)
    x = torch.ones(4, device="neuron")
    key = cache.cache_key(_graph(2.0), [x], settings)
    for device_type in ("neuron", "cpu"):
        with torch.autocast(device_type, dtype=torch.bfloat16):
            assert cache.cache_key(_graph(2.0), [x], settings) != key
    for environment in ({"NEURON_PLATFORM_TARGET_OVERRIDE": "trn1"}, {"NEURON_LOGICAL_NC_CONFIG": "1"}):
        monkeypatch.setattr(services, "topology", lambda environment=environment: read_topology(environment))
        assert cache.cache_key(_graph(2.0), [x], settings) != key


@pytest.fixture(autouse=True)
def private_inductor_dir(tmp_path, monkeypatch):
    """Each test sees its own process-private Inductor directory, as a fresh process would."""
    monkeypatch.setattr(cache, "_private_dir", (os.getpid(), tmp_path / "inductor"))
    (tmp_path / "inductor").mkdir()


def _store_entry(tmp_path: Path) -> cache.CacheEntry:
    """A stored entry with one artifact file, made without compiling."""
    settings = _settings(tmp_path / "cache")
    with cache.entry(_graph(2.0), [torch.ones(2, device="neuron")], settings) as stored:
        assert not stored.hit
        artifact = stored.inductor / "xy" / f"artifact-{stored.key[:8]}.py"
        artifact.parent.mkdir(parents=True, exist_ok=True)
        artifact.write_text("print('compiled')\n")
        stored.store({"forward": KernelPlan([])})
    artifact.unlink()  # a new process would not have it
    return stored


def _lookup(tmp_path: Path) -> cache.CacheEntry:
    settings = _settings(tmp_path / "cache")
    with cache.entry(_graph(2.0), [torch.ones(2, device="neuron")], settings) as found:
        return found


def test_valid_entry_is_installed(tmp_path) -> None:
    stored = _store_entry(tmp_path)
    found = _lookup(tmp_path)
    assert found.hit and set(found.plans) == {"forward"}
    assert (found.inductor / "xy" / f"artifact-{stored.key[:8]}.py").read_text() == "print('compiled')\n"


def test_corrupted_file_is_detected_and_the_entry_dropped(tmp_path) -> None:
    stored = _store_entry(tmp_path)
    (stored.path / "files" / "xy" / f"artifact-{stored.key[:8]}.py").write_text("import os; os.system('x')\n")
    with pytest.warns(UserWarning, match="is corrupted"):
        found = _lookup(tmp_path)
    assert not found.hit and not stored.path.exists()
    assert not (found.inductor / "xy" / f"artifact-{stored.key[:8]}.py").exists()


def test_entry_not_signed_by_this_cache_is_rejected(tmp_path) -> None:
    stored = _store_entry(tmp_path)
    manifest = json.loads((stored.path / "manifest.json").read_text())
    manifest["plans"]["forward"]["kernels"] = [{"nodes": [], "work": {}, "hbm_bytes": 1e12, "dtype": "torch.float32",
                                                "anchor_engine": "dma"}]
    (stored.path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.warns(UserWarning, match="signature mismatch"):
        assert not _lookup(tmp_path).hit


def _run_worker(cache_dir: Path, inductor_dir: Path, host_code: str | None = None, *args: str,
                env: dict[str, str] | None = None) -> subprocess.Popen:
    env = {**os.environ, "TORCH_NEURONX_NEFF_CACHE_DIR": str(cache_dir), "TORCHINDUCTOR_CACHE_DIR": str(inductor_dir),
           **(env or {})}
    if host_code is not None:
        env["NEURON_COMPILE_HOST_CODE"] = host_code
    return subprocess.Popen([sys.executable, str(WORKER), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _result(process: subprocess.Popen) -> dict:
    stdout, stderr = process.communicate(timeout=900)
    assert process.returncode == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


_EXACT = ("output", "grads", "simulation")  # what a hit reproduces exactly: results, simulated time and memory


@pytest.mark.slow
@pytest.mark.compiler
@pytest.mark.multiprocess
@pytest.mark.parametrize("host_code", ["aten", "inductor"])
def test_second_process_hits_and_a_corrupted_entry_recompiles(tmp_path, host_code) -> None:
    def run(inductor_dir: str) -> dict:
        return _result(_run_worker(tmp_path / "cache", tmp_path / inductor_dir, host_code))

    first = run("inductor-1")
    assert (first["cache_misses"], first["cache_hits"]) == (1, 0) and first["grad_ok"]
    assert first["simulation"]["device_seconds"] > 0 and first["simulation"]["memory"]
    second = run("inductor-2")
    assert (second["cache_misses"], second["cache_hits"]) == (0, 1) and second["grad_ok"]
    assert second["autograd_cache_hits"] == 1  # nothing traced, planned or lowered again
    assert {k: second[k] for k in _EXACT} == {k: first[k] for k in _EXACT}
    # the compiled C++ kernels (Inductor) or the AOTAutograd record bundling the planned graph ("aten")
    corrupted = list((tmp_path / "cache" / "entries").glob("*/files/**/*.so" if host_code == "inductor"
                                                          else "*/files/aotautograd/*/*"))
    assert corrupted, "the entry holds the compiled host code"
    data = corrupted[0].read_bytes()
    corrupted[0].write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # one bit pattern changed
    third = run("inductor-3")
    assert (third["cache_misses"], third["cache_hits"]) == (1, 0) and third["grad_ok"]
    assert {k: third[k] for k in _EXACT} == {k: first[k] for k in _EXACT}


@pytest.mark.slow
@pytest.mark.compiler
@pytest.mark.multiprocess
@pytest.mark.all_wheels  # the `neuron` process group is neuron-distributed's
def test_a_tensor_parallel_graph_hits_another_processs_entry(tmp_path) -> None:
    """AOTAutograd's key of a graph taking a `DeviceMesh` pickled the mesh with its cached Python hash, which differs
    between processes (`_patches.device_mesh_state_without_its_hash`): a DTensor graph never hit AOTAutograd's
    cache in another process, and every process (every planned rank, every plan) traced and compiled it again."""
    pytest.importorskip("neuron_distributed")
    import socket

    def run(inductor_dir: str) -> dict:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        return _result(_run_worker(tmp_path / "cache", tmp_path / inductor_dir, None, "--tensor-parallel",
                                   env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}))

    first = run("inductor-1")
    assert (first["cache_misses"], first["cache_hits"], first["autograd_cache_hits"]) == (1, 0, 0)
    second = run("inductor-2")
    assert (second["cache_misses"], second["cache_hits"], second["autograd_cache_hits"]) == (0, 1, 1)
    # the simulated time and memory too: the miss's compile ran ops on the device (Inductor's pattern examples of a
    # graph traced on `neuron`), which the hit skips; compile time charges nothing (`services.compiling`)
    assert {k: second[k] for k in ("output", "simulation")} == {k: first[k] for k in ("output", "simulation")}
    # those ops count no call and are no fallback either (the miss's compile counted 26 clones); the compiled
    # graph's run is charged, its ops inside its kernels
    for run in (first, second):
        assert (run["first_call"]["calls"], run["first_call"]["fallback_ops"]) == ({}, [])
        assert run["first_call"]["device_seconds"] > 0


@pytest.mark.slow
@pytest.mark.compiler
@pytest.mark.multiprocess
def test_two_processes_compiling_the_same_model_both_succeed(tmp_path) -> None:
    processes = [_run_worker(tmp_path / "cache", tmp_path / f"inductor-{i}") for i in range(2)]
    results = [_result(p) for p in processes]
    assert sorted((r["cache_misses"], r["cache_hits"]) for r in results) == [(0, 1), (1, 0)]


def _compile_counting(x: torch.Tensor, **options) -> dict:
    """A fresh compile of one small function (Dynamo reset): its compile and cache counters."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.neuron.reset_dynamo_metrics()
    out = torch.compile(lambda t: (t * 3 + 1).tanh(), backend="neuron", options=options)(x)
    torch.testing.assert_close(out.cpu(), (x.cpu() * 3 + 1).tanh())
    return {**metrics.counters(), **counters["aot_autograd"], **counters["inductor"]}


@pytest.mark.slow  # C++ compiles; it sets the host code itself, so compile-inductor (not slow tests) would repeat it
@pytest.mark.compiler
@pytest.mark.parametrize("host_code", ["aten", "inductor"])
def test_inductor_caches_hit_exactly_when_ours_does(tmp_path, monkeypatch, host_code) -> None:
    """AOTAutograd's cache (and Inductor's FX-graph cache) serve our hits (nothing is traced, planned or lowered
    again), and never serve our misses."""
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "cache"))
    x = torch.randn(16, device="neuron")
    first = _compile_counting(x, host_code=host_code)
    assert first["cache_misses"] == 1 and not first.get("fxgraph_cache_bypass")
    assert first.get("autograd_cache_saved") == 1 and not first.get("autograd_cache_bypass")
    again = _compile_counting(x, host_code=host_code)
    assert again["cache_hits"] == 1 and again.get("autograd_cache_hit") == 1
    renamed = _compile_counting(x, host_code=host_code, model_name="renamed")
    assert renamed["cache_misses"] == 1 and not renamed.get("autograd_cache_hit")


def _simulated_seconds_and_workspace(fn, *args) -> tuple[float, int]:
    from neuron_device import timeline

    clock = timeline.timeline(0)
    gc.collect()  # earlier tests' garbage dies now, not at a collection inside the measured call
    torch.neuron.reset_peak_memory_stats()
    before = torch.neuron.memory_allocated()
    start = clock.synchronize()
    fn(*args)
    # the call's own peak: what was allocated before it (tensors of earlier tests still alive) is not its workspace
    return clock.synchronize() - start, torch.neuron.max_memory_allocated() - before


@pytest.mark.compiler
@pytest.mark.fixed_host_code
def test_every_aten_host_code_cache_path_gives_the_cold_figures(tmp_path, monkeypatch) -> None:
    """A hit, an AOTAutograd record without our entry (its plan travels with it), and a stored host code that cannot
    be rebuilt (a stale or damaged record that passed the entry's checks: compiled afresh) all give the cold
    compile's results, simulated time and memory: never a wrong answer or a missing plan."""
    from neuron_compile import output_code

    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "cache"))
    x = torch.randn(64, 32, device="neuron")

    def run() -> tuple[torch.Tensor, float, int]:
        torch._dynamo.reset()
        fn = torch.compile(lambda t: (t @ t.T).softmax(-1) * 2, backend="neuron", options={"host_code": "aten"})
        fn(x)  # compile
        seconds, peak = _simulated_seconds_and_workspace(fn, x)
        return fn(x).cpu(), seconds, peak

    cold = run()
    assert cold[1] > 0
    warm = run()
    assert metrics.counters()["cache_hits"] >= 1
    assert torch.equal(warm[0], cold[0]) and warm[1:] == cold[1:]
    shutil.rmtree(tmp_path / "cache" / "entries")  # our entry gone, AOTAutograd's record still in this process
    from torch._dynamo.utils import counters

    counters.clear()
    orphan = run()  # the plan comes with the loaded host code
    assert counters["aot_autograd"]["autograd_cache_hit"] == 1
    assert torch.equal(orphan[0], cold[0]) and orphan[1:] == cold[1:]

    def unloadable(self, example_inputs):
        raise RuntimeError("a stale record")

    monkeypatch.setattr(output_code.AtenHostCode, "_load", unloadable)
    shutil.rmtree(tmp_path / "cache" / "entries")
    counters.clear()
    fallback = run()
    assert counters["aot_autograd"]["autograd_cache_bypass"] == 1 and not counters["aot_autograd"]["autograd_cache_hit"]
    assert torch.equal(fallback[0], cold[0]) and fallback[1:] == cold[1:]


def test_disabled_cache_uses_no_inductor_cache_either(monkeypatch) -> None:
    """With our cache off, Inductor's FX-graph cache is off too: keyed without neuron-compile's version, it could
    serve code an older neuron-compile generated."""
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCH_NEURONX_NEFF_DISABLE_CACHE", "1")
    x = torch.randn(16, device="neuron")
    for _ in range(2):
        torch._dynamo.reset()
        counters.clear()
        torch.compile(lambda t: (t * 5 - 1).sigmoid(), backend="neuron")(x)
        assert not any(key.startswith("fxgraph_cache") for key in counters["inductor"]), dict(counters["inductor"])


_PRIVATE_DIRS_OF_FORKED_CHILDREN = """
import json, multiprocessing, os, sys
from neuron_compile import cache
from neuron_device import services

def child(ending, write):
    os.write(write, (str(cache.private_inductor_dir()) + "\\n").encode())
    if ending == "os._exit":  # as neuron-plan's forked ranks end
        services.run_at_exit()
        os._exit(0)
    if ending == "sys.exit":
        sys.exit(0)
    # "return": a multiprocessing worker forked, which ends by os._exit after its finalizers

parent = cache.private_inductor_dir()
seen = {}
for ending in ("sys.exit", "os._exit", "return"):
    read, write = os.pipe()
    if ending == "return":
        worker = multiprocessing.get_context("fork").Process(target=child, args=(ending, write))
        worker.start()
        worker.join()
    else:
        pid = os.fork()
        if pid == 0:
            child(ending, write)
        os.waitpid(pid, 0)
    os.close(write)
    made = os.read(read, 4096).decode().strip()
    seen[ending] = [made != str(parent), os.path.exists(made)]
print(json.dumps({"parent_kept": parent.is_dir(), "children": seen}))
"""


def test_a_forked_child_makes_and_removes_its_own_private_inductor_dir(tmp_path) -> None:
    """Each process compiles into a private Inductor directory of its own, a forked child too, removed at its end
    however it ends: by the interpreter's exit, by `os._exit` after `services.run_at_exit` (neuron-plan's forked
    ranks), or as a forked multiprocessing worker. A child used its parent's and left its own in the temporary
    directory when it ended by `os._exit` (some 275 were found in /tmp); one that exited normally removed its
    parent's."""
    done = subprocess.run([sys.executable, "-c", _PRIVATE_DIRS_OF_FORKED_CHILDREN], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"parent_kept": True, "children": {ending: [True, False]
                                                      for ending in ("sys.exit", "os._exit", "return")}}
    assert not list(tmp_path.glob("neuron-compile-inductor-*"))  # nor the parent's, after its exit


# -- trust: another user cannot get code run; I/O problems never fail a compile (issue 19, items 9 and 10) ---------


def _attacker_resigns(entry_path: Path, key: bytes) -> None:
    """What anyone who can write the cache directory could do: rewrite a file and re-sign the manifest."""
    import hashlib
    import hmac

    artifact = next(p for p in (entry_path / "files").rglob("*") if p.is_file())
    artifact.write_text("import os; os.system('echo pwned')\n")
    manifest = json.loads((entry_path / "manifest.json").read_text())
    manifest["files"] = {k: hashlib.sha256(artifact.read_bytes()).hexdigest() for k in manifest["files"]}
    body = {k: v for k, v in manifest.items() if k != "mac"}
    manifest["mac"] = hmac.new(key, json.dumps(body, sort_keys=True).encode(), hashlib.sha256).hexdigest()
    (entry_path / "manifest.json").write_text(json.dumps(manifest, sort_keys=True))


def test_the_key_is_the_users_not_the_cache_directorys(tmp_path) -> None:
    stored = _store_entry(tmp_path)
    assert not list((tmp_path / "cache").rglob("*.key")), "nothing in the cache directory can sign an entry"
    key = cache.key_path()
    assert os.stat(key).st_mode & 0o777 == 0o600 and os.stat(key.parent).st_mode & 0o777 == 0o700
    # A writer of the cache directory re-signs with any key it can see or make: the entry is refused, not run.
    _attacker_resigns(stored.path, b"k" * 32)
    with pytest.warns(UserWarning, match="signature mismatch"):
        found = _lookup(tmp_path)
    assert not found.hit and not list(found.inductor.rglob("artifact-*"))


@pytest.mark.parametrize("where", ["directory", "entry", "file"])
def test_a_cache_writable_by_others_is_refused(tmp_path, where) -> None:
    stored = _store_entry(tmp_path)
    target = {"directory": tmp_path / "cache", "entry": stored.path, "file": stored.path / "manifest.json"}[where]
    target.chmod(target.stat().st_mode | 0o002)
    cache._warned.clear()
    with pytest.warns(UserWarning, match="writable by other users"):
        found = _lookup(tmp_path)
    assert not found.hit and not list((tmp_path / "inductor").rglob("artifact-*"))


def test_a_cache_owned_by_another_user_is_refused(tmp_path, monkeypatch) -> None:
    """Simulated: this process pretends to be another uid, so everything on disk belongs to "someone else"."""
    _store_entry(tmp_path)
    real = os.geteuid()
    monkeypatch.setattr(cache.os, "geteuid", lambda: real + 1)
    cache._warned.clear()
    with pytest.warns(UserWarning, match="owned by another user"):
        found = _lookup(tmp_path)
    assert not found.hit and found.root is None


def test_a_key_others_can_read_is_refused(tmp_path) -> None:
    _store_entry(tmp_path)
    cache.key_path().chmod(0o644)
    cache._warned.clear()
    try:
        with pytest.warns(UserWarning, match="mode 0600"):
            assert not _lookup(tmp_path).hit
    finally:
        cache.key_path().chmod(0o600)


def _compile_once(monkeypatch, cache_dir: Path, scale: float) -> torch.Tensor:
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(cache_dir))
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x * scale + 1, backend="neuron")
    return compiled(torch.ones(3, device="neuron")).cpu()


def _cache_warnings_compiling(monkeypatch, cache_dir: Path, *scales: float) -> list[str]:
    """Compile ``x * scale + 1`` for each scale into `cache_dir` (each result checked); return the compile-cache
    warnings raised on the way (the once-per-process warning memory cleared first)."""
    import warnings

    cache._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for scale in scales:
            assert torch.equal(_compile_once(monkeypatch, cache_dir, scale), torch.full((3,), scale + 1))
    return [str(w.message) for w in caught if "compile cache" in str(w.message)]


def test_a_read_only_cache_directory_compiles_with_one_warning(tmp_path, monkeypatch) -> None:
    """A read-only file system under the cache directory (simulated: tests may run as root, which writes anyway)."""
    import errno

    read_only = tmp_path / "read-only"
    mkdir = Path.mkdir

    def refusing_mkdir(self, *args, **kwargs):
        if self.is_relative_to(read_only):
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refusing_mkdir)
    about_cache = _cache_warnings_compiling(monkeypatch, read_only / "cache", 2.0, 4.0)
    assert len(about_cache) == 1 and "Read-only" in about_cache[0], about_cache


def test_a_full_disk_at_store_compiles_with_one_warning(tmp_path, monkeypatch) -> None:
    import errno

    full_dir = tmp_path / "full"
    write_text = Path.write_text

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    def full_under_cache(self, *args, **kwargs):
        if self.is_relative_to(full_dir):
            full()
        return write_text(self, *args, **kwargs)

    # The store is where a full disk hits: the copied Inductor files (inductor host code) and the manifest (both).
    monkeypatch.setattr(cache.shutil, "copyfile", full)
    monkeypatch.setattr(Path, "write_text", full_under_cache)
    about_cache = _cache_warnings_compiling(monkeypatch, full_dir, 2.0, 3.0)
    assert len(about_cache) == 1 and "No space left" in about_cache[0], about_cache
    assert not [p for p in (full_dir / "entries").iterdir()], "no partial entry is left"


# -- planted files: no hang, no crash, a warning and a recompile (issue 40) ------------------------------------------


def _shared_dir(tmp_path: Path) -> Path:
    """A directory anyone may create files in (sticky, like /tmp), where the cache is made."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    return shared


def _within_bound(fn):
    """`fn()`'s result; a test failure, not a hang, if it blocks (opening a FIFO waits for a writer forever)."""
    import threading

    result: list = []
    worker = threading.Thread(target=lambda: result.append(fn()), daemon=True)
    worker.start()
    worker.join(120)
    assert result, "blocked on a planted cache file"
    return result[0]


def _plant_fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _plant_symlink(path: Path) -> None:
    copy = path.with_name("elsewhere")
    shutil.copyfile(path, copy)
    path.unlink()
    path.symlink_to(copy)


def _plant_huge(path: Path) -> None:
    os.truncate(path, 1 << 40)  # sparse: a terabyte of zeros that takes no disk space


def _plant_nested(path: Path) -> None:
    path.write_text("[" * 200_000 + "]" * 200_000)


@pytest.mark.parametrize(("what", "plant"), [
    ("manifest.json", _plant_fifo), ("artifact", _plant_fifo), ("manifest.json", _plant_symlink),
    ("artifact", _plant_symlink), ("manifest.json", _plant_huge), ("artifact", _plant_huge),
    ("manifest.json", _plant_nested)])
def test_a_planted_entry_file_is_a_warning_and_a_recompile(tmp_path, what, plant) -> None:
    shared = _shared_dir(tmp_path)
    stored = _store_entry(shared)
    plant(stored.path / "manifest.json" if what == "manifest.json"
          else next(p for p in (stored.path / "files").rglob("artifact-*")))
    cache._warned.clear()
    with pytest.warns(UserWarning, match="compile cache.*(invalid|not used)"):
        found = _within_bound(lambda: _lookup(shared))
    assert not found.hit and not list(found.inductor.rglob("artifact-*"))


def test_a_fifo_as_the_lock_file_is_a_warning_not_a_hang(tmp_path) -> None:
    shared = _shared_dir(tmp_path)
    stored = _store_entry(shared)
    _plant_fifo(shared / "cache" / "locks" / f"{stored.key}.lock")
    cache._warned.clear()
    with pytest.warns(UserWarning, match="not a regular file"):
        found = _within_bound(lambda: _lookup(shared))
    assert not found.hit and found.root is None


def test_a_fifo_as_the_signing_key_is_a_warning_not_a_hang(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    cache.key_path().parent.mkdir(mode=0o700, parents=True)
    os.mkfifo(cache.key_path(), 0o600)
    cache._warned.clear()
    with pytest.warns(UserWarning, match="not a regular file"):
        found = _within_bound(lambda: _lookup(tmp_path))
    assert not found.hit and found.root is None


@pytest.mark.compiler
def test_a_planted_manifest_recompiles_with_the_right_result(tmp_path, monkeypatch) -> None:
    """End to end: torch.compile over a cache whose entry's manifest became a FIFO, with a short lock timeout."""
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT", "5")
    cache_dir = _shared_dir(tmp_path) / "cache"
    _cache_warnings_compiling(monkeypatch, cache_dir, 2.0)
    for manifest in (cache_dir / "entries").glob("*/manifest.json"):
        _plant_fifo(manifest)
    about_cache = _within_bound(lambda: _cache_warnings_compiling(monkeypatch, cache_dir, 2.0))
    assert len(about_cache) == 1 and "not a regular file" in about_cache[0], about_cache


def test_a_read_only_pre_populated_cache_is_read(tmp_path, monkeypatch) -> None:
    """A shared, pre-populated mount: nothing can be created in it (no lock directory, no lock file), yet its
    entries are hits; new entries are not stored (simulated: tests may run as root, which writes anyway)."""
    import errno

    stored = _store_entry(tmp_path)
    shutil.rmtree(tmp_path / "cache" / "locks")
    read_only = tmp_path / "cache"
    mkdir, open_ = Path.mkdir, os.open

    def refusing_mkdir(self, *args, **kwargs):
        if self.is_relative_to(read_only) and not self.is_dir():
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return mkdir(self, *args, **kwargs)

    def refusing_open(path, flags, *args, **kwargs):
        if Path(path).is_relative_to(read_only) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and not Path(path).exists():
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return open_(path, flags, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refusing_mkdir)
    monkeypatch.setattr(cache.os, "open", refusing_open)
    cache._warned.clear()
    with pytest.warns(UserWarning, match="is read-only.*not stored"):
        found = _lookup(tmp_path)
    assert found.hit and (found.inductor / "xy" / f"artifact-{stored.key[:8]}.py").exists()
    settings = _settings(tmp_path / "cache")
    with cache.entry(_graph(5.0), [torch.ones(2, device="neuron")], settings) as missed:
        assert not missed.hit and not missed.writable
        missed.store({"forward": KernelPlan([])})
    assert len(list((tmp_path / "cache" / "entries").iterdir())) == 1
