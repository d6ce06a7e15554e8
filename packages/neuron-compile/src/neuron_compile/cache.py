"""The persistent compile cache (`TORCH_NEURONX_NEFF_CACHE_DIR`, default `~/.cache/neuron-compile`).

An entry is keyed on the Dynamo graph's code, its inputs' metadata (shapes, strides, dtypes, devices, grad), the
graph's constant tensors (content hash), the compile settings (options), the grad mode, matmul precision and
autocast state (`neuron`'s and the CPU's), the target and logical core size, the substitutable Neuron kernels
installed, the versions of neuron-compile and torch, and a digest of neuron-compile's sources and of the code and
figures a kernel plan is computed from (so a graph rewritten or priced by other code is never reused, even at the
same version). It holds what AOTAutograd's and Inductor's caches stored for the graph (the AOTAutograd record, which
for the "aten" host code bundles the planned graph and its plan, `output_code`; for Inductor's host code also its
FX-graph records, the generated Python and the compiled C++ libraries) and the kernel plans, under a JSON manifest
with the SHA-256 of every file and an HMAC of the manifest.

Safety:
* Inductor never reads the shared directory. Each process compiles against a private Inductor cache directory; an
  entry's files are copied into it only after the manifest's HMAC and every file's digest check out. So nothing is
  unpickled unless this user's key signed it, and a corrupted or foreign entry is deleted and recompiled, never
  executed.
* The HMAC key is the user's, not the cache's: `$XDG_CONFIG_HOME/neuron-compile/cache.key` (default `~/.config`),
  32 random bytes, mode 0600, in a 0700 directory, owned by the user; anyone who can write the cache directory
  still cannot sign an entry. A key that is not the user's own, not 0600 or not 32 bytes is refused.
* A cache directory, or an entry, owned by another user or writable by anyone but its owner, or a symlink where a
  directory or file should be, is refused: one warning, then the compile runs without the cache.
* Cache I/O never fails a compile: a read-only, full, unwritable or missing directory, or a bad key, gives one
  warning per directory and a compile without the cache (a failed store likewise leaves no partial entry).
* Every file read from the cache (manifest, stored files, lock, key) is opened without following a symlink and
  without blocking, and must be a regular file of bounded size (a FIFO or device planted there would block the
  compile forever, a sparse file of terabytes read for hours); the manifest's nesting depth is bounded before it
  is parsed (a 200,000-deep one would end the compile with RecursionError). Any failure: a warning and a recompile.
* A read-only cache (a shared, pre-populated mount) is read: when its lock file cannot be created, entries are
  read without the lock (they are renamed into place whole) and nothing is stored, after one warning.
* Concurrent processes: a compile holds an exclusive file lock on its key (`fcntl.flock`), so a second process
  waits for the first and then hits its entry (`TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT` seconds at most). Entries
  are written to a temporary directory and renamed into place, so readers never see half an entry.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import hmac
import inspect
import json
import os
import re
import shutil
import stat
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

import neuron_spec.costs
import neuron_spec.hardware
from neuron_device import services

from . import __version__, envvars, nki_substitution, passes
from .passes import KernelPlan
from .settings import CompileSettings

__all__ = ["CacheEntry", "UntrustedCache", "cache_key", "entry", "key_path"]

_FORMAT = 5  # 2: kernel plans carry `workspace_bytes`; 3: the "aten" host code is stored (AOTAutograd record);
# 4: the "aten" host code carries its outputs' sources; 5: its graph in a compact form where it can be
_MAX_MANIFEST_BYTES = 64 << 20  # a manifest lists files and kernel plans: a few MB for the largest graphs
_MAX_MANIFEST_DEPTH = 64  # its JSON nests about 6 levels deep
_MAX_FILE_BYTES = 4 << 30  # a stored Inductor file (generated code, a compiled library)
_SKIPPED_SUFFIXES = (".lock", ".tmp")
_private_dir: tuple[int, Path] | None = None  # (the process that made it, the directory)


def _tensor_meta(value: torch.Tensor) -> list[Any]:
    return [list(value.shape), list(value.stride()), str(value.dtype), value.device.type, value.requires_grad]


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _tensor_meta(value)
    if isinstance(value, (int, float, bool, str)) or value is None:
        return value
    return type(value).__name__


@functools.cache
def _source_digest() -> str:
    """SHA-256 of the sources a compiled graph and its kernel plan are made by: every module of neuron-compile (its
    passes, decompositions and host code), eager's op-cost formulas, the cost model, the hardware figures and the
    cost model's named parameters."""
    package = Path(inspect.getfile(passes)).parent
    sources = sorted(package.glob("*.py")) + [
        Path(inspect.getfile(module))
        for module in (inspect.getmodule(services.estimate_kernel), inspect.getmodule(services.op_info),
                       neuron_spec.costs, neuron_spec.hardware)]
    digest = hashlib.sha256()
    for source in sources:
        digest.update(source.name.encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()


def _target() -> list[Any]:
    """The simulated chip a plan is made for: its target and the logical NeuronCore size."""
    topology = services.topology()
    return [topology.target.name, topology.lnc]


def _autocast(device_type: str) -> list[Any]:
    """The autocast state a graph is traced under; its dtype only when enabled (the dtype is per thread, and a thread
    other than the one that imported torch starts from torch's default, not `neuron`'s bfloat16)."""
    enabled = torch.is_autocast_enabled(device_type)
    return [enabled, str(torch.get_autocast_dtype(device_type)) if enabled else None]


def cache_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], settings: CompileSettings) -> str:
    """The entry key of a graph compiled with `example_inputs` and `settings` (hex SHA-256)."""
    constants = []
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, str(node.target), None)
            if isinstance(value, torch.Tensor):
                data = value.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes() if value.numel() else b""
                constants.append([str(node.target), _tensor_meta(value), hashlib.sha256(data).hexdigest()])
    fields = {
        "format": _FORMAT,
        "graph": gm.code,
        "inputs": [_describe(v) for v in example_inputs],
        "constants": constants,
        "settings": settings.cache_fields(),
        "grad": torch.is_grad_enabled(),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "autocast": {"neuron": _autocast("neuron"), "cpu": _autocast("cpu")},
        "target": _target(),
        "substitutions": sorted(str(op) for op in nki_substitution.substitutable_ops()),
        "sources": _source_digest(),
        "neuron_compile": __version__,
        "torch": torch.__version__,
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


class UntrustedCache(Exception):
    """The cache directory, an entry or the key is not safe to use (the reason is the message)."""


def _open_regular(path: Path, flags: int, limit: int, mode: int = 0o600) -> int:
    """A descriptor of `path`, which must be a regular file of at most `limit` bytes: opened without following a
    symlink and without blocking (opening a FIFO blocks until a writer comes), then checked on the descriptor."""
    try:
        descriptor = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UntrustedCache(f"{path} is a symlink") from None
        raise
    info = os.fstat(descriptor)
    if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
        os.close(descriptor)
        what = "not a regular file" if not stat.S_ISREG(info.st_mode) else f"larger than {limit} bytes"
        raise UntrustedCache(f"{path} is {what}")
    os.set_blocking(descriptor, True)
    return descriptor


def _read_regular(path: Path, limit: int) -> bytes:
    """The contents of the regular file `path` of at most `limit` bytes (see `_open_regular`)."""
    with os.fdopen(_open_regular(path, os.O_RDONLY, limit), "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:  # grew after the check
        raise UntrustedCache(f"{path} is larger than {limit} bytes")
    return data


def _parse_manifest(data: bytes) -> dict[str, Any]:
    """Parse a manifest, refusing one nested deeper than a manifest can be before the recursive parser sees it."""
    text = data.decode()
    depth = 0
    for match in _JSON_NESTING.finditer(text):
        token = match.group()
        depth += 1 if token in ("[", "{") else -1 if token in ("]", "}") else 0
        if depth > _MAX_MANIFEST_DEPTH:
            raise ValueError(f"manifest is nested deeper than {_MAX_MANIFEST_DEPTH} levels")
    manifest = json.loads(text)
    if not isinstance(manifest, dict):
        raise ValueError("manifest is not a JSON object")
    return manifest


_JSON_NESTING = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')  # strings (skipped whole) and brackets


def _check_owned(path: Path, what: str) -> None:
    """Refuse `path` unless it is this user's own, writable by no one else, and not a symlink."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise UntrustedCache(f"{what} {path} is a symlink")
    if info.st_uid != os.geteuid():
        raise UntrustedCache(f"{what} {path} is owned by another user (uid {info.st_uid})")
    if info.st_mode & 0o022:
        raise UntrustedCache(f"{what} {path} is writable by other users (mode {stat.S_IMODE(info.st_mode):o})")


def key_path() -> Path:
    """Where this user's signing key lives: outside every cache directory."""
    base = envvars.XDG_CONFIG_HOME.read() or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "neuron-compile" / "cache.key"


def _user_key() -> bytes:
    """The user's HMAC key, created (mode 0600, directory 0700) on first use; refused unless it is private."""
    path = key_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_owned(path.parent, "the key directory")
    for _ in range(100):
        try:
            descriptor = _open_regular(path, os.O_RDONLY, 32)
        except FileNotFoundError:
            temporary = path.with_name(f".key-{uuid.uuid4().hex}.tmp")
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(os.urandom(32))
            with contextlib.suppress(FileExistsError):
                os.link(temporary, path)  # atomic: the first process to link wins
            temporary.unlink()
            continue
        with os.fdopen(descriptor, "rb") as handle:
            info = os.fstat(handle.fileno())
            data = handle.read()
        if info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise UntrustedCache(f"the key {path} must be the user's own with mode 0600")
        if len(data) == 32:
            return data
        time.sleep(0.01)  # another process is between creating and linking it
    raise UntrustedCache(f"the key {path} is not a 32-byte key; delete it to make a new one")


_warned: set[str] = set()


def _warn_unusable(root: Path, error: BaseException, outcome: str = "is not used", then: str = "compiling without it"
                   ) -> None:
    """One warning per cache directory and process: the compile goes on without the cache (or, for a read-only
    cache, without storing into it)."""
    if str(root) in _warned:
        return
    _warned.add(str(root))
    import warnings

    warnings.warn(f"neuron compile cache {root} {outcome} ({type(error).__name__}: {error}); {then}", stacklevel=5)


_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)  # what creating a file in a read-only cache fails with


def _open_root(root: Path) -> bytes:
    """Check (creating if missing) the cache directory and its parts; return the key to sign with. A read-only
    cache may lack its lock directory (see `entry`)."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_owned(root, "the cache directory")
    for part in ("entries", "locks"):
        try:
            (root / part).mkdir(mode=0o700, exist_ok=True)
        except OSError as error:
            if part == "entries" or error.errno not in _READ_ONLY:
                raise
            continue
        _check_owned(root / part, "the cache directory")
    return _user_key()


def _mac(secret: bytes, manifest: Mapping[str, Any]) -> str:
    body = {k: v for k, v in manifest.items() if k != "mac"}
    return hmac.new(secret, json.dumps(body, sort_keys=True).encode(), hashlib.sha256).hexdigest()


def private_inductor_dir() -> Path:
    """This process's Inductor cache directory: Inductor only reads what we put there. Made at the process's first
    use, a forked child's too (its parent's is the parent's to remove, and a compile's new files are told apart by
    the directory's contents), and removed at its end (`services.at_exit`: neuron-plan's forked ranks and
    multiprocessing's forked workers end by `os._exit`, which runs no `atexit` handler)."""
    global _private_dir
    if _private_dir is None or _private_dir[0] != os.getpid():
        path = Path(tempfile.mkdtemp(prefix="neuron-compile-inductor-"))
        _private_dir = (os.getpid(), path)
        services.at_exit(shutil.rmtree, path, True)
    return _private_dir[1]


def _files(directory: Path) -> set[str]:
    return {
        str(path.relative_to(directory))
        for path in directory.rglob("*")
        if path.is_file() and not path.name.endswith(_SKIPPED_SUFFIXES)
    }


@contextlib.contextmanager
def _inductor_dir(directory: Path) -> Iterator[None]:
    with envvars.INDUCTOR_CACHE_DIR.overridden(str(directory)):
        yield


@contextlib.contextmanager
def _locked(path: Path, timeout: float) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with os.fdopen(_open_regular(path, os.O_RDONLY | os.O_CREAT, _MAX_FILE_BYTES), "rb") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"waited {timeout:g} s for another process compiling the same graph (lock {path}); raise "
                        f"{envvars.CACHE_LOCK_TIMEOUT.name} or remove the stale lock"
                    ) from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class CacheEntry:
    """One key's entry: `hit` after a verified load (its files are then in the private Inductor dir)."""

    def __init__(self, root: Path | None, key: str, inductor: Path | None, secret: bytes = b"") -> None:
        self.root = root
        self.key = key
        self.inductor = inductor
        self._secret = secret
        self.writable = True  # False for a read-only cache: read, never stored into
        self.hit = False
        self.plans: dict[str, KernelPlan] = {}
        self._before: set[str] = set()

    @property
    def path(self) -> Path:
        assert self.root is not None
        return self.root / "entries" / self.key

    def _discard(self) -> None:
        trash = self.path.with_name(f".trash-{self.key}-{uuid.uuid4().hex}")
        with contextlib.suppress(OSError):  # gone already, or a read-only cache
            self.path.rename(trash)
            shutil.rmtree(trash, ignore_errors=True)

    def _check_trusted(self) -> None:
        """The entry and everything in it are this user's and writable by no one else."""
        _check_owned(self.path, "the cache entry")
        for path in self.path.rglob("*"):
            _check_owned(path, "the cache entry's file")

    def load(self) -> None:
        """Verify and install the stored entry; a bad entry is deleted (and the graph recompiled)."""
        if self.root is None or not (self.path / "manifest.json").exists():
            return
        try:
            self._check_trusted()
        except (UntrustedCache, OSError) as error:
            _warn_unusable(self.path, error)  # another user's entry: neither loaded nor deleted
            return
        try:
            manifest = _parse_manifest(_read_regular(self.path / "manifest.json", _MAX_MANIFEST_BYTES))
            if not hmac.compare_digest(str(manifest.get("mac", "")), _mac(self._secret, manifest)):
                raise ValueError("manifest signature mismatch")
            if manifest.get("key") != self.key or manifest.get("format") != _FORMAT:
                raise ValueError("manifest is for another key or format")
            contents = {}
            for relative, digest in manifest["files"].items():
                source = self.path / "files" / relative
                if not source.resolve().is_relative_to((self.path / "files").resolve()):
                    raise ValueError(f"file {relative} is outside the entry")
                contents[relative] = _read_regular(source, _MAX_FILE_BYTES)
                if hashlib.sha256(contents[relative]).hexdigest() != digest:
                    raise ValueError(f"file {relative} is corrupted")
            plans = {stage: KernelPlan.from_json(data) for stage, data in manifest["plans"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError, UntrustedCache) as error:
            import warnings

            warnings.warn(f"neuron compile cache entry {self.key[:12]} is invalid ({error}); recompiling", stacklevel=4)
            self._discard()
            return
        assert self.inductor is not None
        for relative, data in contents.items():  # the bytes just verified, not the file again
            target = self.inductor / relative
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        self.plans = plans
        self.hit = True

    def store(self, plans: Mapping[str, KernelPlan]) -> None:
        """Save what this compile added to the private Inductor dir, and the plans, as this key's entry (a failure
        to write, e.g. a full disk, warns and leaves no entry: the compile itself succeeded)."""
        if self.root is None or self.inductor is None or not self.writable:
            return
        temporary = self.root / "entries" / f".tmp-{self.key}-{uuid.uuid4().hex}"
        try:
            self._write(temporary, plans)
        except OSError as error:
            shutil.rmtree(temporary, ignore_errors=True)
            _warn_unusable(self.root, error)

    def _write(self, temporary: Path, plans: Mapping[str, KernelPlan]) -> None:
        assert self.inductor is not None
        new_files = sorted(_files(self.inductor) - self._before)
        (temporary / "files").mkdir(parents=True)
        digests = {}
        for relative in new_files:
            target = temporary / "files" / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.inductor / relative, target)
            digests[relative] = hashlib.sha256(target.read_bytes()).hexdigest()
        manifest: dict[str, Any] = {
            "format": _FORMAT,
            "key": self.key,
            "neuron_compile": __version__,
            "torch": torch.__version__,
            "files": digests,
            "plans": {stage: plan.to_json() for stage, plan in plans.items()},
        }
        manifest["mac"] = _mac(self._secret, manifest)
        (temporary / "manifest.json").write_text(json.dumps(manifest, sort_keys=True))
        try:
            temporary.rename(self.path)
        except OSError:  # an entry appeared meanwhile (a process without our lock, e.g. cache cleared): keep it
            shutil.rmtree(temporary, ignore_errors=True)


@contextlib.contextmanager
def entry(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], settings: CompileSettings) -> Iterator[CacheEntry]:
    """Hold the key's lock, load its entry if valid, and compile inside the private Inductor cache directory.
    A cache that cannot be used (see the module's Safety notes) yields an entry without a cache, after one warning."""
    if settings.cache_dir is None:
        yield CacheEntry(None, "", None)
        return
    root = settings.cache_dir
    key = cache_key(gm, example_inputs, settings)
    inductor = private_inductor_dir()
    with contextlib.ExitStack() as held:
        try:
            secret = _open_root(root)
            found = CacheEntry(root, key, inductor, secret)
            try:
                held.enter_context(_locked(root / "locks" / f"{key}.lock", settings.lock_timeout))
            except OSError as error:  # a read-only cache: entries are renamed into place whole, so read unlocked
                if error.errno not in _READ_ONLY:
                    raise
                _warn_unusable(root, error, "is read-only", "its entries are read, new ones are not stored")
                found.writable = False
            found.load()
        except (OSError, UntrustedCache) as error:
            held.close()
            _warn_unusable(root, error)
            yield CacheEntry(None, key, None)
            return
        held.enter_context(_inductor_dir(inductor))
        found._before = _files(inductor)
        yield found
