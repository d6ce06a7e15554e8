"""Which test ids a noxfile's sessions run: each session's pytest commands collected (`--collect-only -q`), never run.

    python .ci/selection.py collect [--noxfile PATH] OUT.json   # ids per session (and per pytest command)
    python .ci/selection.py check BEFORE.json AFTER.json        # every id BEFORE ran still runs in AFTER

Why: the sessions split the tests between each wheel alone and all wheels together (tests/README.md); a change to
that split must keep every test running somewhere. A test id is keyed by the variables a session sets beyond the
common test environment (compile-inductor's `NEURON_COMPILE_HOST_CODE=inductor` runs the compile tests in another
configuration, so its ids count apart from the compile session's); a test split into parametrized cases counts as
run when its cases run. An id that still runs, but not in a configuration it ran in before, is listed for review
and does not fail the check. Collection uses the interpreter running this
script, with the packages importable (the development virtualenv); a module skipped at import by a missing optional
library is not seen here.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class _RecordingSession:
    """Stands for nox's Session: installs nothing, records the pytest commands a session function would run."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.posargs: list[str] = []
        self.env: dict[str, str] = {}
        self.runs: list[tuple[list[str], dict[str, str]]] = []
        # nox's cache directory, where a session may keep a record of its last pass: an empty one, so that no
        # session is skipped (and none is recorded where a real run would read it)
        self.cache_dir = Path(tempfile.mkdtemp(prefix="selection-cache-"))

    def install(self, *args, **kwargs) -> None:
        pass

    def create_tmp(self) -> str:
        return "/tmp"

    def run(self, *args, env=None, **kwargs) -> None:
        if list(args[:3]) == ["python", "-m", "pytest"]:
            self.runs.append((list(args[3:]), {**self.env, **(env or {})}))


def _sessions(noxfile: Path) -> dict[str, list[tuple[list[str], dict[str, str]]]]:
    import nox.registry

    nox.registry.reset()
    spec = importlib.util.spec_from_file_location("noxfile_under_test", noxfile)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    runs = {}
    for name in module.nox.options.sessions:  # the sessions `nox` runs by default (CI)
        session = _RecordingSession(name)
        nox.registry.get()[name](session)
        if session.runs:
            runs[name] = session.runs
    return runs


def _without_workers(args: list[str]) -> list[str]:
    """`args` without pytest-xdist's options (`-n N`, `--dist MODE`): collection runs in one process."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("-n", "--dist"):
            skip = True
        elif not arg.startswith(("-n=", "--dist=")):
            out.append(arg)
    return out


def _collect(args: list[str], env: dict[str, str | None]) -> list[str]:
    """The ids pytest collects with `args` in `env` (a None value removes the variable, as in nox)."""
    full_env = {name: value for name, value in {**os.environ, **env}.items() if value is not None}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *_without_workers(args), "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=900,
    )
    if proc.returncode not in (0, 5):
        sys.exit(f"collection failed ({proc.returncode}) for {args}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return [line for line in proc.stdout.splitlines() if "::" in line and not line.startswith(" ")]


def collect(noxfile: Path, out: Path) -> None:
    common = {"PYTHONHASHSEED", "OMP_NUM_THREADS", "HF_HUB_OFFLINE"}
    result = {}
    for name, runs in _sessions(noxfile).items():
        commands = []
        for args, env in runs:
            ids = _collect(args, env)
            variant = ",".join(f"{k}={v}" for k, v in sorted(env.items()) if k not in common and v is not None)
            commands.append({"args": args, "variant": variant, "count": len(ids), "ids": ids})
            print(f"{name:18} {len(ids):6d}  {' '.join(args)}  {variant}", flush=True)
        result[name] = commands
    out.write_text(json.dumps(result, indent=1))


def _keys(data: dict) -> set[tuple[str, str]]:
    return {(command["variant"], test_id) for commands in data.values() for command in commands
            for test_id in command["ids"]}


def check(before: Path, after: Path) -> int:
    old, new = json.loads(before.read_text()), json.loads(after.read_text())
    for label, data in (("before", old), ("after", new)):
        runs = sum(c["count"] for commands in data.values() for c in commands)
        print(f"{label}: {runs} test runs, {len(_keys(data))} distinct (configuration, id)")
        for name, commands in data.items():
            print(f"  {name:18} {sum(c['count'] for c in commands):6d}")
    # A test split into parametrized cases (the OpInfo sweep's shards) still runs: `X` is found as `X[...]`.
    split = {(variant, test_id.split("[")[0]) for variant, test_id in _keys(new) if test_id.endswith("]")}
    missing = sorted(key for key in _keys(old) - _keys(new) if key not in split)
    # An id that runs after, but no longer in every configuration it ran in before: listed for review (a test that
    # sets the configuration itself, e.g. the host code as a compile option, is the same run in either).
    anywhere = {test_id.split("[")[0] for _, test_id in _keys(new)} | {test_id for _, test_id in _keys(new)}
    moved = [(variant, test_id) for variant, test_id in missing if test_id in anywhere]
    lost = [(variant, test_id) for variant, test_id in missing if test_id not in anywhere]
    for variant, test_id in moved:
        print(f"NOT IN CONFIGURATION {variant or '(default)'}, RUNS IN ANOTHER: {test_id}")
    for variant, test_id in lost[:50]:
        print(f"MISSING {test_id} {variant}")
    print(f"{len(lost)} ids of before not run after" if lost else "after runs every id of before")
    return 1 if lost else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--noxfile", type=Path, default=ROOT / "noxfile.py")
    c.add_argument("out", type=Path)
    k = sub.add_parser("check")
    k.add_argument("before", type=Path)
    k.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "collect":
        collect(args.noxfile, args.out)
        return 0
    return check(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
