"""Which thread releases what a Gloo work of backend `neuron` held (2 ranks; the collective checks off, so a
collective returns before the peer joins it).

Rank 0 issues a collective and drops every reference to it and to its tensors before rank 1 joins (a store key
orders them), so Gloo's worker finishes the work after Python let go: in torch 2.13 the worker's release of a
tensor's last C++ reference decrefs its Python object, under the GIL, there (the exit hang, see `gloo_refs`). The
checks watch the tensor's storage (its Python object dies with the last tensor on it) and, for the list all-to-all,
the thread its result is unpacked on.
"""

from __future__ import annotations

import os
import threading
import weakref

import torch
import torch.distributed as dist
from common import finish, run_checks

os.environ["NEURON_DISTRIBUTED_CHECK_COLLECTIVES"] = (
    "0"  # else the collective waits for rank 1 to agree on it
)
RANK = int(os.environ["RANK"])
MAIN = threading.get_ident()


def tensors_die_on_a_python_thread() -> None:
    """Rank 0 hands a CPU tensor (the group passes CPU tensors to Gloo as they are) to an all-reduce and drops the
    Work and the tensor before rank 1 joins; the tensor's storage must die on the main thread, not on Gloo's worker
    when it finishes the work. Rank 0 then issues collectives on a group of its own until the storage dies (each
    issue releases the works Gloo let go of); no barrier: Gloo's barrier holds the works issued before it."""
    store = dist.distributed_c10d._get_default_store()
    solo = dist.new_group([0])
    if RANK == 1:
        store.wait(["dropped"])
        dist.all_reduce(torch.ones(4))
        return
    freed, released = [], threading.Event()

    def record(_: weakref.ref) -> None:
        freed.append(threading.get_ident())
        released.set()

    tensor = torch.ones(4)
    watch = weakref.ref(
        tensor.untyped_storage(), record
    )  # its Python object dies with the storage's last tensor
    dist.all_reduce(tensor, async_op=True)  # the Work goes at once; the all-reduce waits for rank 1
    del tensor
    store.set("dropped", "1")
    for _ in range(6000):
        if released.wait(0.01):
            break
        dist.all_reduce(torch.zeros(1), group=solo)
    assert watch() is None, "the storage was never released"
    assert freed == [MAIN], (
        f"the all-reduce's tensor was released on thread {freed} (a Gloo worker), main {MAIN}"
    )


class _Copies(torch.overrides.TorchFunctionMode):
    """Records the thread of every `Tensor.copy_` (a future callback runs with its issuer's TLS: its modes too)."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.copy_:
            self.threads.append(threading.get_ident())
        return func(*args, **(kwargs or {}))


def all_to_all_unpacks_on_the_waiting_thread() -> None:
    """The list all-to-all's result is copied out on the thread that waits, not by a callback on Gloo's worker."""
    store = dist.distributed_c10d._get_default_store()
    outputs = [torch.zeros(2, device="neuron") for _ in range(2)]
    inputs = [torch.full((2,), float(RANK * 2 + peer), device="neuron") for peer in range(2)]
    if RANK == 1:
        store.wait(["alltoall-issued"])
        dist.all_to_all(outputs, inputs)
        dist.barrier()
    else:
        copies = _Copies()
        with copies:
            work = dist.all_to_all(outputs, inputs, async_op=True)
        store.set("alltoall-issued", "1")
        dist.barrier()  # the all-to-all is done on Gloo's side
        with copies:
            work.wait()
        assert copies.threads and set(copies.threads) == {MAIN}, (
            f"unpacked on {copies.threads}, main is {MAIN}"
        )
    assert [t.cpu().tolist() for t in outputs] == [[float(RANK)] * 2, [float(2 + RANK)] * 2], outputs


dist.init_process_group("neuron")
run_checks(
    {
        "all_to_all_unpacks_on_the_waiting_thread": all_to_all_unpacks_on_the_waiting_thread,
        "tensors_die_on_a_python_thread": tensors_die_on_a_python_thread,
    }
)
dist.destroy_process_group()
finish()
