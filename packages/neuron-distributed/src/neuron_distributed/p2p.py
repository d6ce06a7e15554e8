"""Point-to-point transfers that both ends check: a mismatched `send` / `recv` raises on both ranks.

Gloo aborts the receiving process when a message's size differs from the posted buffer, and a receiver whose
buffer is larger would be left with bytes nobody wrote. So every transfer is three messages: the sender's header
(dtype code, element count, bytes: fixed size, so it always matches), the data, and the receiver's verdict
back (on a tag of its own, `_VERDICT_TAG`, so it never meets data flowing the other way). The receiver reads the
header first and receives the data into its own buffers only if they match, else into scratch buffers of the
sender's size (so the stream stays in step) and raises; the sender's `wait` raises on a negative verdict.

The receiver does this on a thread of its own: a `recv` must make progress without its caller waiting on it, or
`irecv(); send(); wait()` on two ranks (a ring exchange) would deadlock on each other's verdicts.
"""

from __future__ import annotations

import datetime
import threading

import torch
from torch._C._distributed_c10d import ProcessGroupGloo, Work

from . import matching

__all__ = ["checked_recv", "checked_send"]

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


class _Checked(ResultWork):
    """A transfer's Work: `wait` finishes the transfer's parts, then raises if the other end disagreed."""

    def __init__(self, finish, result: list[torch.Tensor]) -> None:
        super().__init__(result)
        self._finish, self._done = finish, False
        self._lock = threading.Lock()

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        with self._lock:
            if not self._done:
                self._done = True
                self._finish()
        return True

    def is_completed(self) -> bool:
        return self._done


def checked_send(gloo: ProcessGroupGloo, tensors: list[torch.Tensor], dst: int, tag: int) -> Work:
    header = _header(tensors)
    verdict = torch.empty(4, dtype=torch.int64)  # the verdict, then the receiver's header
    parts = [gloo.send([header], dst, tag), gloo.send(tensors, dst, tag), gloo.recv([verdict], dst, tag + _VERDICT_TAG)]

    def finish() -> None:
        for part in parts:
            part.wait()
        if int(verdict[0]) != _MATCH:
            raise _mismatch("send", dst, header.tolist(), verdict[1:].tolist())

    return _Checked(finish, tensors)


def checked_recv(gloo: ProcessGroupGloo, tensors: list[torch.Tensor], src: int | None, tag: int) -> Work:
    """`src=None`: from any source (`recv_anysource`)."""
    mine = _header(tensors)
    outcome: list[BaseException | None] = [None]

    def receive() -> None:
        try:
            header = torch.empty(3, dtype=torch.int64)
            if src is None:
                work = gloo.recv_anysource([header], tag)
                work.wait()
                source = work._source_rank()
            else:
                source = src
                gloo.recv([header], source, tag).wait()
            matches = bool((header == mine).all())
            if matches:
                gloo.recv(tensors, source, tag).wait()
            else:  # take the sender's data off the wire into a buffer of its size, so the stream stays in step
                gloo.recv([torch.empty(int(header[2]), dtype=torch.uint8)], source, tag).wait()
            verdict = torch.tensor([_MATCH if matches else _MISMATCH, *mine.tolist()], dtype=torch.int64)
            gloo.send([verdict], source, tag + _VERDICT_TAG).wait()
            if not matches:
                raise _mismatch("recv", source, mine.tolist(), header.tolist())
        except BaseException as error:  # re-raised by `wait`, in the caller's thread
            outcome[0] = error

    thread = threading.Thread(target=receive, name="neuron-p2p-recv", daemon=True)
    thread.start()

    def finish() -> None:
        thread.join()
        if outcome[0] is not None:
            raise outcome[0]

    return _Checked(finish, tensors)
