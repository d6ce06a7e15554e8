"""Faults on backend `neuron`. Usage: faults.py <scenario> <timeout seconds>.

mismatch: ranks disagree on shape / dtype / collective, on all_to_all split sizes, or a send's size or dtype
          differs from its recv -> ValueError on every rank, the receive buffer keeps what it held (nothing read
          from memory nobody wrote), and the group stays usable; then destroy_process_group leaves no thread behind.
killed:   rank 1 is SIGKILLed between collectives -> rank 0's next collective raises within the timeout.
stalled:  rank 1 never calls the collective -> rank 0 raises within the timeout.
absent:   rank 1 never joins -> rank 0's init_process_group raises within the timeout.
"""

from __future__ import annotations

import datetime
import gc
import os
import signal
import sys
import threading
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


def expect_mismatch_raises(action, *, untouched: torch.Tensor | None = None) -> None:
    """`action` must raise ValueError naming the mismatch on this rank; `untouched` must keep its values."""
    before = None if untouched is None else untouched.cpu().clone()
    try:
        action()
    except ValueError as error:
        assert "mismatched" in str(error), error
    else:
        raise AssertionError("a mismatched transfer did not raise")
    if untouched is not None:
        assert torch.equal(untouched.cpu(), before), "the receive buffer was written"
    t = torch.ones(3, device="neuron")
    dist.all_reduce(t)  # the group still works afterwards
    assert t.cpu().tolist() == [2.0] * 3, t


def all_to_all_uneven() -> None:
    """Rank 0 sends [1, 3] rows, rank 1 expects [1, 1] from ranks 0 and 1: rank 0's 3 rows to rank 1 don't fit."""
    input = torch.ones(4, 2, device="neuron")
    output = torch.full((4 if RANK == 0 else 2, 2), -7.0, device="neuron")
    splits_in = [1, 3] if RANK == 0 else [1, 1]
    input = input[: sum(splits_in)]
    splits_out = [1, 1] if RANK == 1 else [1, 3]
    expect_mismatch_raises(
        lambda: dist.all_to_all_single(output, input, splits_out, splits_in), untouched=output
    )


def send_recv(sent: torch.Tensor, received: torch.Tensor) -> None:
    if RANK == 0:
        expect_mismatch_raises(lambda: dist.send(sent, dst=1))
    else:
        expect_mismatch_raises(lambda: dist.recv(received, src=0), untouched=received)


def ring_exchange_matches() -> None:
    """irecv; send; wait on both ranks (a ring): checked transfers must not deadlock, and deliver the data."""
    peer = 1 - RANK
    received = torch.zeros(5, device="neuron")
    request = dist.irecv(received, src=peer)
    dist.send(torch.full((5,), float(RANK), device="neuron"), dst=peer)
    request.wait()
    assert received.cpu().tolist() == [float(peer)] * 5, received


def destroy_leaves_nothing() -> None:
    dist.destroy_process_group()
    gc.collect()  # the checks that raised keep their frames (and the group's Works) in reference cycles
    # The device runtime's own thread (neuron-top's publisher, started at the device's first use) lives as long as
    # the process; it is not the group's.
    allowed = TASKS_BEFORE + sum(t.name == "neuron-livestats" for t in threading.enumerate())
    deadline = time.monotonic() + TIMEOUT
    while len(os.listdir("/proc/self/task")) > allowed and time.monotonic() < deadline:
        time.sleep(0.1)
    left = len(os.listdir("/proc/self/task"))
    assert left <= allowed, f"{left} threads after destroy_process_group, {allowed} before init (runtime's included)"
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
            "all_to_all_uneven": all_to_all_uneven,
            "send_bigger_than_recv": lambda: send_recv(
                torch.ones(8, device="neuron"), torch.full((4,), -7.0, device="neuron")
            ),
            "send_smaller_than_recv": lambda: send_recv(
                torch.ones(2, device="neuron"), torch.full((4,), -7.0, device="neuron")
            ),
            "send_other_dtype": lambda: send_recv(
                torch.ones(4, dtype=torch.int32, device="neuron"), torch.full((4,), -7.0, device="neuron")
            ),
            "ring_exchange_matches": ring_exchange_matches,
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
