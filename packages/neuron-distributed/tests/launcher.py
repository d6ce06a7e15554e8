"""Launch a worker script on N local ranks (torchrun's environment, a free port) and collect per-rank markers.

Each worker prints `CHECK <name> OK` or `CHECK <name> FAIL <reason>` per check; a rank that crashes, hangs past
the deadline or exits without its markers shows up as a missing marker, never as a pass.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

WORKERS = Path(__file__).parent / "workers"
_MARKER = re.compile(r"^CHECK (\S+) (OK|FAIL)(?: (.*))?$")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    script: str,
    world_size: int,
    *args: str,
    timeout: float = 180.0,
    env: dict[str, str] | None = None,
):
    """Run `workers/<script>` on `world_size` ranks; return ({rank: {check: (status, reason)}}, {rank: output})."""
    port = free_port()
    procs = []
    for rank in range(world_size):
        rank_env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "PYTHONWARNINGS": "ignore",
            **(env or {}),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKERS / script), *args],
                env=rank_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    results: dict[int, dict[str, tuple[str, str]]] = {}
    outputs: dict[int, str] = {}
    for rank, proc in enumerate(procs):
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            out += f"\n[rank {rank} killed after {timeout}s]"
        outputs[rank] = out
        results[rank] = {}
        for line in out.splitlines():
            match = _MARKER.match(line.strip())
            if match:
                results[rank][match.group(1)] = (match.group(2), match.group(3) or "")
    return results, outputs


def assert_check(results, outputs, check: str) -> None:
    """Every rank reported `check` as OK."""
    for rank, checks in results.items():
        status, reason = checks.get(check, ("MISSING", ""))
        assert status == "OK", (
            f"rank {rank}: check {check} {status} {reason}\n--- output ---\n{outputs[rank][-4000:]}"
        )
