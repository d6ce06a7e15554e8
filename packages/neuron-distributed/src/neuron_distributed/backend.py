"""The c10d backend `neuron`: a Python `ProcessGroup` whose collectives run on Gloo over zero-copy host aliases.

torch 2.13 lets Python define a backend only as a `ProcessGroup` subclass (the `PyProcessGroup` trampoline); such a
group replaces the whole process group, so it serves CPU tensors too (object collectives, `"cpu:gloo,neuron:neuron"`).
An inner `ProcessGroupGloo` on the same store does the transport, so multi-host works through the same rendezvous;
it is also registered as the group's backend for `cpu` and `neuron`, which gives the group its name and gives C++
callers that bypass these methods a backend (they reach it through `kernels`). Each method here charges the
interconnect time (`costs`) and emulates what Gloo lacks: `PREMUL_SUM`, list `alltoall`.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ProcessGroupGloo,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
    Work,
)

from . import costs, gloo_refs, matching, p2p
from .catalogue import group_ranks
from .hostmap import flat_tensors, to_host

__all__ = ["BACKEND_NAME", "NeuronProcessGroup", "create_process_group", "register_backend"]

BACKEND_NAME = "neuron"


def _premul_factor(op: ReduceOp) -> float | None:
    """The factor of a `PREMUL_SUM` reduce op (Gloo has no such op: we scale, then SUM), else None."""
    if op.op != ReduceOp.RedOpType.PREMUL_SUM:
        return None
    factor = op.factor
    return float(factor.item()) if isinstance(factor, torch.Tensor) else float(factor)


def _with_sum(opts: Any, factory: Callable[[], Any]) -> Any:
    """A copy of reduce options `opts` with the op replaced by SUM."""
    copy = factory()
    copy.reduceOp = ReduceOp.SUM
    copy.timeout = opts.timeout
    if hasattr(opts, "rootRank"):
        copy.rootRank, copy.rootTensor = opts.rootRank, opts.rootTensor
    return copy


def _premul_as_sum(opts: Any, factory: Callable[[], Any], host: list[torch.Tensor], in_place: bool) -> tuple:
    """Gloo has no PREMUL_SUM: scale the (host) inputs by its factor, then SUM. In place only where the inputs are
    the result (all-reduce, reduce); otherwise on copies, as the caller's inputs must not change.
    Returns the options and inputs to hand to Gloo."""
    factor = _premul_factor(opts.reduceOp)
    if factor is None:
        return opts, host
    scaled = [t.mul_(factor) if in_place else t * factor for t in host]
    return _with_sum(opts, factory), scaled


class NeuronProcessGroup(dist.ProcessGroup):
    """Process group of backend `neuron`. One process per NeuronCore; tensors may be on `neuron` or `cpu`."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> None:
        super().__init__(rank, size)
        self._gloo = ProcessGroupGloo(store, rank, size, timeout)
        for device in ("cpu", "neuron"):
            self._register_backend(torch.device(device), dist.ProcessGroup.BackendType.GLOO, self._gloo)

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def _issue(self, kind: str, inputs: Any, outputs: Any, method: Callable[..., Work], *args: Any,
               same: Any = None) -> Work:
        """Check that the ranks agree on `same` (tensors that must match everywhere), charge the time, then run
        Gloo's `method(*args)` (args: host tensors), recorded by `gloo_refs`."""
        if same is not None:
            matching.verify_same(self._gloo, kind, flat_tensors(same))
        costs.charge(kind, flat_tensors(inputs), flat_tensors(outputs), self.size())
        return gloo_refs.issue(self, method, *args)

    def _outputs_inputs(
        self, kind: str, gloo_method: Callable[..., Work], outputs: Any, inputs: Any, *rest: Any, same: str | None = None
    ) -> Work:
        """Issue `gloo_method(host outputs, host inputs, *rest)`, Gloo's argument order for every collective that
        writes outputs from separate inputs; `same` names the side the ranks must agree on ("inputs", "outputs")."""
        host_out, host_in = to_host(outputs), to_host(inputs)
        agreed = {None: None, "inputs": host_in, "outputs": host_out}[same]
        return self._issue(kind, inputs, outputs, gloo_method, host_out, host_in, *rest, same=agreed)

    # Reductions ---------------------------------------------------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: AllreduceOptions = AllreduceOptions()) -> Work:  # noqa: B008
        opts, host = _premul_as_sum(opts, AllreduceOptions, to_host(tensors), in_place=True)
        return self._issue("allreduce", tensors, tensors, self._gloo.allreduce, host, opts, same=host)

    def allreduce_coalesced(
        self,
        tensors: list[torch.Tensor],
        opts: AllreduceCoalescedOptions = AllreduceCoalescedOptions(),  # noqa: B008
    ) -> Work:
        opts, host = _premul_as_sum(opts, AllreduceCoalescedOptions, to_host(tensors), in_place=True)
        return self._issue(
            "allreduce_coalesced", tensors, tensors, self._gloo.allreduce_coalesced, host, opts, same=host
        )

    def reduce(self, tensors: list[torch.Tensor], opts: ReduceOptions = ReduceOptions()) -> Work:  # noqa: B008
        opts, host = _premul_as_sum(opts, ReduceOptions, to_host(tensors), in_place=True)
        return self._issue("reduce", tensors, tensors, self._gloo.reduce, host, opts, same=host)

    def reduce_scatter(
        self,
        outputs: list[torch.Tensor],
        inputs: list[list[torch.Tensor]],
        opts: ReduceScatterOptions = ReduceScatterOptions(),  # noqa: B008
    ) -> Work:
        given, host_in = opts, []
        for chunk in to_host(inputs):
            opts, chunk = _premul_as_sum(given, ReduceScatterOptions, chunk, in_place=False)
            host_in.append(chunk)
        host_out = to_host(outputs)
        return self._issue(
            "reduce_scatter", inputs, outputs, self._gloo.reduce_scatter, host_out, host_in, opts, same=host_out
        )

    def reduce_scatter_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        opts: ReduceScatterOptions = ReduceScatterOptions(),  # noqa: B008
    ) -> Work:
        opts, (host_in,) = _premul_as_sum(opts, ReduceScatterOptions, [to_host(input)], in_place=False)
        host_out = to_host(output)
        return self._issue(
            "reduce_scatter_single", input, output, self._gloo._reduce_scatter_base, host_out, host_in, opts,
            same=host_in,
        )

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(
        self,
        outputs: list[torch.Tensor],
        inputs: list[torch.Tensor],
        opts: ReduceScatterOptions = ReduceScatterOptions(),  # noqa: B008
    ) -> Work:
        """Gloo has no coalesced reduce-scatter: one reduce-scatter per pair, completed together."""
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return _AllOf(works, outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # Gathers, broadcast, scatter -----------------------------------------------------------------------------------

    def broadcast(self, tensors: list[torch.Tensor], opts: BroadcastOptions = BroadcastOptions()) -> Work:  # noqa: B008
        host = to_host(tensors)
        return self._issue("broadcast", tensors, tensors, self._gloo.broadcast, host, opts, same=host)

    def allgather(
        self,
        outputs: list[list[torch.Tensor]],
        inputs: list[torch.Tensor],
        opts: AllgatherOptions = AllgatherOptions(),  # noqa: B008
    ) -> Work:
        return self._outputs_inputs("allgather", self._gloo.allgather, outputs, inputs, opts, same="inputs")

    def allgather_coalesced(
        self,
        outputs: list[list[torch.Tensor]],
        inputs: list[torch.Tensor],
        opts: AllgatherOptions = AllgatherOptions(),  # noqa: B008
    ) -> Work:
        return self._outputs_inputs("allgather_coalesced", self._gloo.allgather_coalesced, outputs, inputs, opts)

    def all_gather_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        opts: AllgatherOptions = AllgatherOptions(),  # noqa: B008
    ) -> Work:
        return self._outputs_inputs(
            "all_gather_single", self._gloo._allgather_base, output, input, opts, same="inputs"
        )

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(
        self,
        outputs: list[torch.Tensor],
        inputs: list[torch.Tensor],
        opts: AllgatherOptions = AllgatherOptions(),  # noqa: B008
    ) -> Work:
        """Gloo has no coalesced all-gather into tensors: one all-gather per pair, completed together."""
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return _AllOf(works, outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(
        self,
        outputs: list[list[torch.Tensor]],
        inputs: list[torch.Tensor],
        opts: GatherOptions = GatherOptions(),  # noqa: B008
    ) -> Work:
        return self._outputs_inputs("gather", self._gloo.gather, outputs, inputs, opts, same="inputs")

    def scatter(
        self,
        outputs: list[torch.Tensor],
        inputs: list[list[torch.Tensor]],
        opts: ScatterOptions = ScatterOptions(),  # noqa: B008
    ) -> Work:
        return self._outputs_inputs("scatter", self._gloo.scatter, outputs, inputs, opts, same="outputs")

    # All-to-all -----------------------------------------------------------------------------------------------------

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        opts: AllToAllOptions = AllToAllOptions(),  # noqa: B008
    ) -> Work:
        size = self.size()
        same_dtype = output.dtype == input.dtype  # if not, no count can match: every rank raises
        matching.verify_exchange(
            self._gloo,
            "alltoall_base",
            input.dtype,
            _split_counts(input, input_split_sizes, size) if same_dtype else [-1] * size,
            _split_counts(output, output_split_sizes, size) if same_dtype else [-1] * size,
        )
        return self._outputs_inputs(
            "alltoall_base", self._gloo.alltoall_base, output, input, output_split_sizes, input_split_sizes, opts
        )

    alltoall_base = all_to_all_single

    def alltoall(
        self,
        outputs: list[torch.Tensor],
        inputs: list[torch.Tensor],
        opts: AllToAllOptions = AllToAllOptions(),  # noqa: B008
    ) -> Work:
        """List all-to-all as one `alltoall_base` on flat buffers (Gloo has no list form), then unpacked."""
        dtypes = {t.dtype for t in (*inputs, *outputs)}
        if len(dtypes) != 1:
            raise ValueError(
                f"all_to_all: every input and output tensor must have the same dtype, got {dtypes}"
            )
        matching.verify_exchange(
            self._gloo, "alltoall", dtypes.pop(), [t.numel() for t in inputs], [t.numel() for t in outputs]
        )
        host_out = to_host(outputs)
        flat_in = torch.cat([t.reshape(-1) for t in to_host(inputs)])
        flat_out = torch.empty(sum(t.numel() for t in host_out), dtype=flat_in.dtype)
        counts = [t.numel() for t in host_out]
        work = self._issue(
            "alltoall", inputs, outputs, self._gloo.alltoall_base, flat_out, flat_in, counts,
            [t.numel() for t in inputs], opts,
        )

        def unpack() -> None:
            for out, chunk in zip(host_out, flat_out.split(counts), strict=True):
                out.copy_(chunk.view(out.shape))

        return _Unpacked(work, unpack, outputs)

    # Point to point and synchronisation ----------------------------------------------------------------------------

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Work:
        with gloo_refs.without_autograd_context():  # not worker-run (Gloo's device thread completes them)
            return p2p.send(self._gloo, tensors, to_host(tensors), dst, tag, self._pair(dst))

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Work:
        with gloo_refs.without_autograd_context():  # not worker-run (Gloo's device thread completes them)
            return p2p.recv(self._gloo, tensors, to_host(tensors), src, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Work:
        with gloo_refs.without_autograd_context():  # not worker-run (Gloo's device thread completes them)
            return p2p.recv(self._gloo, tensors, to_host(tensors), None, tag)

    def _pair(self, peer: int) -> tuple[int, int] | None:
        """The global ranks of this rank and group rank `peer` (None for a group this process did not register)."""
        ranks = group_ranks(self)
        return (ranks[self.rank()], ranks[peer]) if ranks is not None else None

    def barrier(self, opts: BarrierOptions = BarrierOptions()) -> Work:  # noqa: B008
        return gloo_refs.issue(self, self._gloo.barrier, opts, barrier=True)

    def abort(self) -> None:
        """Gloo's abort does nothing; release what Gloo let go of, without waiting for the rest."""
        self._gloo.abort()
        gloo_refs.drain(self, self._gloo, wait=False)

    def shutdown(self) -> None:
        """Wait for the group's works and release them here: after this, no Gloo worker of the group releases a
        Python object (destroying the group joins its workers, maybe under the GIL)."""
        gloo_refs.drain(self, self._gloo)
        self._gloo.shutdown()


def _split_counts(tensor: torch.Tensor, split_sizes: list[int], size: int) -> list[int]:
    """Elements `all_to_all_single` moves to (or from) each rank: rows of dim 0 per split, or equal parts."""
    if tensor.dim() == 0:
        return [-1] * size
    row = tensor[0].numel() if tensor.shape[0] else 0
    if not split_sizes:
        return [tensor.shape[0] // size * row] * size if tensor.shape[0] % size == 0 else [-1] * size
    if len(split_sizes) != size or sum(split_sizes) != tensor.shape[0] or min(split_sizes) < 0:
        return [-1] * size
    return [split * row for split in split_sizes]


class _AllOf(p2p.ResultWork):
    """One Work for several: done when each is (Gloo's `_allgather_base` / `_reduce_scatter_base` Works have no
    future, so the futures cannot simply be combined)."""

    def __init__(self, works: list[Work], result: list[torch.Tensor]) -> None:
        super().__init__(result)
        self._works = works

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        for work in self._works:
            work.wait(timeout) if timeout else work.wait()
        return True

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self._works)


class _Unpacked(p2p.ResultWork):
    """List all-to-all's Work: done when Gloo's is, then `unpack` copies the flat result into the outputs, once, on
    the thread that waits or asks (a future callback would run Python on Gloo's worker, under the GIL)."""

    def __init__(self, work: Work, unpack: Callable[[], None], result: list[torch.Tensor]) -> None:
        super().__init__(result)
        self._work, self._unpack, self._unpacked = work, unpack, False
        self._lock = threading.Lock()

    def _finish(self) -> None:
        with self._lock:
            if not self._unpacked:
                self._unpacked = True
                self._unpack()

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        self._work.wait(timeout) if timeout else self._work.wait()  # raises if the all-to-all failed
        self._finish()
        return True

    def is_completed(self) -> bool:
        if not self._work.is_completed():
            return False
        if self._work.is_success():
            self._finish()
        return True


def create_process_group(
    store: dist.Store, rank: int, size: int, timeout: datetime.timedelta
) -> NeuronProcessGroup:
    """The creator torch calls for backend `neuron` (`init_process_group`, `new_group`, `DeviceMesh`)."""
    return NeuronProcessGroup(store, rank, size, timeout)


def register_backend() -> None:
    """Make `neuron` a c10d backend for `neuron` devices (idempotent)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, create_process_group, devices=["neuron"])
