"""Point-to-point transfers, timed as the hardware moves them and checked at both ends.

Time. A transfer is a DMA from the sender's HBM to the receiver's, on the sender's transfer stream
(`costs.TRANSFER_STREAM`, apart from its compute streams): it starts once its data is produced (the work the sender's
current stream queued before the send) and the transfers queued before it are done, and takes the cost model's
point-to-point time for the two ranks' placement (`costs.charge_transfer`). Its completion time, in the sender's
clock (the ranks' clocks share their origin: the job's start), travels with the data as a first message. `wait`
makes the caller's current stream wait for that completion on either end, as a CUDA stream waits for NCCL's: the
receiver cannot use data before it arrived, the sender cannot reuse its buffer before it left. The receiver's
streams are charged nothing: its DMA is the sender's.

Checks. Gloo aborts the receiving process when a message's size differs from the posted buffer, and a receiver whose
buffer is larger would be left with bytes nobody wrote. So a checked transfer (`matching.enabled()`) sends a header
(dtype code, element count, bytes: fixed size, so it always matches) before the data, and the receiver answers with
its verdict (on a tag of its own, `_VERDICT_TAG`, so it never meets data flowing the other way). The receiver reads
the header first and receives the data into its own buffers only if they match, else into scratch buffers of the
sender's size (so the stream stays in step) and raises; the sender's `wait` raises on a negative verdict.

The receiver does this on a thread of its own: a `recv` must make progress without its caller waiting on it, or
`irecv(); send(); wait()` on two ranks (a ring exchange) would deadlock on each other's verdicts.
"""

from __future__ import annotations

import datetime
import math
import threading
from collections.abc import Callable

import torch
from torch._C._distributed_c10d import ProcessGroupGloo, Work

from neuron_device import services

from . import costs, matching

__all__ = ["ResultWork", "recv", "send"]

_VERDICT_TAG = 1 << 30  # added to the user's tag for the verdict messages
_MATCH, _MISMATCH = 0, 1


def _header(tensors: list[torch.Tensor]) -> torch.Tensor:
    (tensor,) = tensors  # Gloo's send and recv take exactly one tensor
    return torch.tensor([matching.dtype_code(tensor.dtype), tensor.numel(), tensor.nbytes], dtype=torch.int64)


def _describe(header: list[int]) -> str:
    code, numel, _ = header
    return f"{numel} elements of {matching.dtype_name(code)}"


def _mismatch(role: str, peer: int, mine: list[int], theirs: list[int]) -> ValueError:
    sender, receiver = (mine, theirs) if role == "send" else (theirs, mine)
    return ValueError(
        f"mismatched send/recv with rank {peer}: the sender sends {_describe(sender)}, the receiver expects "
        f"{_describe(receiver)} (both ranks raise; nothing was received)"
    )


class ResultWork(Work):
    """A Work whose result tensors are known when it is made: `get_future` waits, then returns a completed future
    (the parts it waits for have no futures to chain)."""

    def __init__(self, result: list[torch.Tensor]) -> None:
        super().__init__()
        self._result = result

    def result(self) -> list[torch.Tensor]:
        return self._result

    def get_future(self) -> torch.futures.Future:
        self.wait()
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self._result)
        return future


class _Transfer(ResultWork):
    """A transfer's Work: `wait` finishes the transfer's messages once (raising if the other end disagreed), then
    makes the current stream of device `index` (None: CPU tensors, no timeline) wait for the transfer's completion."""

    def __init__(self, finish: Callable[[], float], index: int | None, result: list[torch.Tensor]) -> None:
        super().__init__(result)
        self._finish, self._index, self._done = finish, index, False
        self._completes = -math.inf
        self._lock = threading.Lock()
        self.source: int | None = None  # the sender's rank, once a receive has heard from it

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        with self._lock:
            if not self._done:
                self._done = True
                self._completes = self._finish()
        if self._index is not None:
            services.timeline(self._index).wait_until(services.current_stream_id(self._index), self._completes)
        return True

    def is_completed(self) -> bool:
        return self._done

    def _source_rank(self) -> int:
        """The rank a receive from any source heard from (`dist.recv(src=None)` asks after `wait`)."""
        if self.source is None:
            raise RuntimeError("_source_rank: this Work is not a completed receive")
        return self.source


def send(gloo: ProcessGroupGloo, tensors: list[torch.Tensor], host: list[torch.Tensor], dst: int, tag: int,
         ranks: tuple[int, int] | None) -> Work:
    """Send `tensors` (their host aliases `host`) to `dst`: timed on the sender's transfer stream between global
    `ranks` (sender, receiver), checked when `matching.enabled()`."""
    timed = costs.charge_transfer(tensors, ranks)
    index, completes = timed if timed is not None else (None, -math.inf)
    parts = [gloo.send([torch.tensor([completes], dtype=torch.float64)], dst, tag)]
    checked = matching.enabled()
    header = _header(host)
    verdict = torch.empty(4, dtype=torch.int64)  # the verdict, then the receiver's header
    if checked:
        parts.append(gloo.send([header], dst, tag))
    parts.append(gloo.send(host, dst, tag))
    if checked:
        parts.append(gloo.recv([verdict], dst, tag + _VERDICT_TAG))

    def finish() -> float:
        for part in parts:
            part.wait()
        if checked and int(verdict[0]) != _MATCH:
            raise _mismatch("send", dst, header.tolist(), verdict[1:].tolist())
        return completes

    return _Transfer(finish, index, host)


def recv(gloo: ProcessGroupGloo, tensors: list[torch.Tensor], host: list[torch.Tensor], src: int | None,
         tag: int) -> Work:
    """Receive into `tensors` (their host aliases `host`) from `src` (None: from any source, `recv_anysource`);
    `wait` makes the current stream wait for the sender's transfer to complete. Checked when `matching.enabled()`."""
    mine = _header(host)
    checked = matching.enabled()
    completes = [-math.inf]
    outcome: list[BaseException | None] = [None]
    devices = {t.device.index or 0 for t in tensors if t.device.type == "neuron"}

    def receive() -> None:
        try:
            clock = torch.empty(1, dtype=torch.float64)
            if src is None:
                first = gloo.recv_anysource([clock], tag)
                first.wait()
                source = first._source_rank()
            else:
                source = src
                gloo.recv([clock], source, tag).wait()
            work.source, completes[0] = source, float(clock)
            if not checked:
                gloo.recv(host, source, tag).wait()
                return
            header = torch.empty(3, dtype=torch.int64)
            gloo.recv([header], source, tag).wait()
            matches = bool((header == mine).all())
            if matches:
                gloo.recv(host, source, tag).wait()
            else:  # take the sender's data off the wire into a buffer of its size, so the stream stays in step
                gloo.recv([torch.empty(int(header[2]), dtype=torch.uint8)], source, tag).wait()
            verdict = torch.tensor([_MATCH if matches else _MISMATCH, *mine.tolist()], dtype=torch.int64)
            gloo.send([verdict], source, tag + _VERDICT_TAG).wait()
            if not matches:
                raise _mismatch("recv", source, mine.tolist(), header.tolist())
        except BaseException as error:  # re-raised by `wait`, in the caller's thread
            outcome[0] = error

    def finish() -> float:
        thread.join()
        if outcome[0] is not None:
            raise outcome[0]
        return completes[0]

    work = _Transfer(finish, devices.pop() if devices else None, host)
    thread = threading.Thread(target=receive, name="neuron-p2p-recv", daemon=True)
    thread.start()
    return work
