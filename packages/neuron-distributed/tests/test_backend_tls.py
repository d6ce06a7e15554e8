"""A Gloo work issued by backend `neuron` keeps no Python object of autograd's: a work holds a snapshot of its
issuing thread's TLS until Gloo's worker drops it, and a Python object there is released on that worker under the
GIL, which deadlocks a process group destroyed by a thread holding the GIL (DDP's Reducer at a script's end)."""

import weakref

import torch
import torch.distributed as dist


class _Stashed:
    """Stands for the `contextvars` context `torch.autograd.graph._engine_run_backward` stashes during a backward."""


def test_a_collective_issued_in_a_backward_holds_no_autograd_context(mesh) -> None:
    stashed = _Stashed()
    alive = weakref.ref(stashed)
    tensor = torch.ones(4, device="neuron")
    torch._C._stash_obj_in_tls("context", stashed)  # TLS holds the only reference
    del stashed
    try:
        works = [dist.all_reduce(tensor, async_op=True), dist.barrier(async_op=True)]
        assert torch._C._get_obj_in_tls("context") is alive()  # put back for the rest of the backward
        for work in works:
            work.wait()
    finally:
        torch._C._remove_obj_from_tls("context")  # as the backward's end does
    assert alive() is None, "a Gloo work still holds autograd's context"  # the works are alive here
    assert len(works) == 2 and tensor.cpu().tolist() == [1.0] * 4
