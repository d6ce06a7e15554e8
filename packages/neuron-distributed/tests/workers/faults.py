"""Faults on backend `neuron`. Usage: faults.py <scenario> <timeout seconds>.

mismatch: ranks disagree on shape / dtype / collective -> ValueError on every rank, and the group stays usable;
          then destroy_process_group leaves no thread behind.
killed:   rank 1 is SIGKILLed between collectives -> rank 0's next collective raises within the timeout.
stalled:  rank 1 never calls the collective -> rank 0 raises within the timeout.
absent:   rank 1 never joins -> rank 0's init_process_group raises within the timeout.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from common import finish, run_checks

SCENARIO, TIMEOUT = sys.argv[1], float(sys.argv[2])
RANK = int(os.environ["RANK"])
TASKS_BEFORE = len(os.listdir("/proc/self/task"))


def init() -> None:
    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=TIMEOUT))


def raises_in_time(action, check: str) -> None:
    """Run `action`, which must raise; report the time it took against the configured timeout."""
    start = time.monotonic()
    try:
        action()
    except Exception as error:  # the fault surfaced as an exception, as it must
        elapsed = time.monotonic() - start
        status = "OK" if elapsed <= TIMEOUT * 2 else "FAIL"
        print(
            f"CHECK {check} {status} raised {type(error).__name__} after {elapsed:.1f}s (timeout {TIMEOUT:.0f}s)"
        )
        return
    print(f"CHECK {check} FAIL no error")


def expect_mismatch(
    first: torch.Tensor, second: torch.Tensor, call=dist.all_reduce, other=dist.all_reduce
) -> None:
    try:
        (call if RANK == 0 else other)(first if RANK == 0 else second)
    except ValueError as error:
        assert "mismatched collective" in str(error) and "rank 1" in str(error), error
    else:
        raise AssertionError("a mismatched collective did not raise")
    t = torch.ones(3, device="neuron")
    dist.all_reduce(t)  # the group still works afterwards
    assert t.cpu().tolist() == [2.0] * 3, t


def destroy_leaves_nothing() -> None:
    dist.destroy_process_group()
    deadline = time.monotonic() + TIMEOUT
    while len(os.listdir("/proc/self/task")) > TASKS_BEFORE and time.monotonic() < deadline:
        time.sleep(0.1)
    left = len(os.listdir("/proc/self/task"))
    assert left <= TASKS_BEFORE, f"{left} threads after destroy_process_group, {TASKS_BEFORE} before init"
    assert not dist.is_initialized()


if SCENARIO == "mismatch":
    init()
    run_checks(
        {
            "wrong_shape": lambda: expect_mismatch(
                torch.ones(4, device="neuron"), torch.ones(6, device="neuron")
            ),
            "wrong_dtype": lambda: expect_mismatch(
                torch.ones(4, device="neuron"), torch.ones(4, dtype=torch.int64, device="neuron")
            ),
            "wrong_collective": lambda: expect_mismatch(
                torch.ones(4, device="neuron"),
                torch.ones(4, device="neuron"),
                other=lambda t: dist.broadcast(t, src=0),
            ),
            "destroy_leaves_nothing": destroy_leaves_nothing,
        }
    )
elif SCENARIO == "killed":
    init()
    dist.all_reduce(torch.ones(2, device="neuron"))
    if RANK == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(1.0)
    raises_in_time(lambda: dist.all_reduce(torch.ones(2, device="neuron")), "peer_raises")
elif SCENARIO == "stalled":
    init()
    if RANK == 1:
        time.sleep(TIMEOUT * 1.5)  # outlives the peer's timeout: its error is the timeout, not our exit
    else:
        raises_in_time(lambda: dist.all_reduce(torch.ones(2, device="neuron")), "peer_raises")
elif SCENARIO == "absent":
    if RANK == 0:
        raises_in_time(init, "peer_raises")
else:
    raise SystemExit(f"unknown scenario {SCENARIO!r}")
finish()
