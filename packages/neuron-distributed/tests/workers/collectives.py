"""Every collective on `neuron` tensors through backend `neuron`, compared with the same call on CPU tensors and a
plain Gloo group. Usage: collectives.py <init form: neuron|mixed|default> [check ...]"""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from common import finish, run_checks
from torch.distributed.device_mesh import init_device_mesh

FORM = sys.argv[1]
BACKENDS = {"neuron": "neuron", "mixed": "cpu:gloo,neuron:neuron", "default": None, "device_id": "neuron"}
OPTIONS = {"device_id": {"device_id": torch.device("neuron", torch.neuron.current_device())}}
dist.init_process_group(BACKENDS[FORM], timeout=datetime.timedelta(seconds=60), **OPTIONS.get(FORM, {}))
RANK, WORLD = dist.get_rank(), dist.get_world_size()
NEURON = torch.device("neuron", torch.neuron.current_device())
CPU = torch.device("cpu")
REF = dist.new_group(backend="gloo")  # the reference: the same calls on CPU tensors and plain Gloo


def data(device: torch.device, n: int = 6, dtype: torch.dtype = torch.float32, salt: int = 0) -> torch.Tensor:
    return (torch.arange(n, dtype=torch.float64) * (RANK + 2) + RANK + salt + 1).to(dtype).to(device)


def same(got, want) -> None:
    if isinstance(got, (list, tuple)):
        assert len(got) == len(want), (len(got), len(want))
        for g, w in zip(got, want, strict=True):
            same(g, w)
        return
    assert got.device.type == "neuron", f"result on {got.device}, expected neuron"
    torch.testing.assert_close(
        got.cpu(), w := want, rtol=0, atol=0, msg=lambda m: f"{m}\ngot {got.cpu()}\nwant {w}"
    )


def compare(run: Callable[[torch.device, dist.ProcessGroup | None], object]) -> Callable[[], None]:
    """A check: `run` on neuron with the default (neuron) group equals `run` on CPU with the Gloo group."""
    return lambda: same(run(NEURON, None), run(CPU, REF))


def all_reduce(op: dist.ReduceOp) -> Callable[[], None]:
    def run(device, group):
        t = data(device)
        dist.all_reduce(t, op=op, group=group)
        return t

    return compare(run)


def all_reduce_premul_sum() -> None:
    t = data(NEURON)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
    ref = data(CPU)
    dist.all_reduce(ref, group=REF)
    same(t, ref * 0.5)


def all_reduce_async(device, group):
    tensors = [data(device, salt=i) for i in range(3)]
    works = [dist.all_reduce(t, async_op=True, group=group) for t in tensors]
    for work in works:
        work.wait()
        assert work.is_completed()
    return tensors


def all_gather(device, group):
    out = [torch.empty(6, device=device) for _ in range(WORLD)]
    dist.all_gather(out, data(device), group=group)
    return out


def all_gather_into_tensor(device, group):
    out = torch.empty(WORLD * 6, device=device)
    dist.all_gather_into_tensor(out, data(device), group=group)
    return out


def reduce_scatter(device, group):
    out = torch.empty(6, device=device)
    dist.reduce_scatter(out, [data(device, salt=i) for i in range(WORLD)], group=group)
    return out


def reduce_scatter_tensor(op: dist.ReduceOp):
    def run(device, group):
        out = torch.empty(3, device=device)
        dist.reduce_scatter_tensor(out, data(device, n=3 * WORLD), op=op, group=group)
        return out

    return compare(run)


def reduce_scatter_tensor_premul_sum() -> None:
    out = torch.empty(3, device=NEURON)
    source = data(NEURON, n=3 * WORLD)
    dist.reduce_scatter_tensor(out, source, op=dist._make_nccl_premul_sum(0.25))
    same(source, data(CPU, n=3 * WORLD))  # the input is untouched
    ref = torch.empty(3)
    dist.reduce_scatter_tensor(ref, data(CPU, n=3 * WORLD), group=REF)
    same(out, ref * 0.25)


def broadcast(device, group):
    t = data(device, dtype=torch.int64)
    dist.broadcast(t, src=WORLD - 1, group=group)
    return t


def reduce(device, group):
    t = data(device)
    dist.reduce(t, dst=0, op=dist.ReduceOp.MAX, group=group)
    return t if RANK == 0 else torch.zeros(0, device=device)


def gather(device, group):
    out = [torch.empty(6, device=device) for _ in range(WORLD)] if RANK == 0 else None
    dist.gather(data(device), out, dst=0, group=group)
    return out or []


def scatter(device, group):
    out = torch.empty(6, device=device)
    chunks = [data(device, salt=10 * i) for i in range(WORLD)] if RANK == 1 else None
    dist.scatter(out, chunks, src=1, group=group)
    return out


def all_to_all(device, group):
    outs = [torch.empty(3, device=device) for _ in range(WORLD)]
    ins = [data(device, n=3, salt=i) for i in range(WORLD)]
    dist.all_to_all(outs, ins, group=group)
    return outs


def all_to_all_single(device, group):
    # rank r sends r + j + 1 elements to rank j (uneven splits)
    in_splits = [RANK + j + 1 for j in range(WORLD)]
    out_splits = [j + RANK + 1 for j in range(WORLD)]
    out = torch.empty(sum(out_splits), device=device)
    dist.all_to_all_single(out, data(device, n=sum(in_splits)), out_splits, in_splits, group=group)
    return out


def barrier() -> None:
    dist.barrier()
    dist.barrier(async_op=True).wait()


def send_recv(device, group):
    peer = (RANK + 1) % WORLD if RANK % 2 == 0 else (RANK - 1) % WORLD
    t = data(device)
    if RANK % 2 == 0:
        dist.send(t, dst=peer, group=group)
        dist.recv(t, src=peer, group=group)
    else:
        got = torch.empty(6, device=device)
        dist.recv(got, src=peer, group=group)
        dist.send(got + 1, dst=peer, group=group)
        t = got
    return t


def batch_isend_irecv(device, group):
    right, left = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    got = torch.empty(6, device=device)
    ops = [dist.P2POp(dist.isend, data(device), right, group), dist.P2POp(dist.irecv, got, left, group)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return got


def object_collectives() -> None:
    gathered = [None] * WORLD
    dist.all_gather_object(gathered, {"rank": RANK})
    assert gathered == [{"rank": r} for r in range(WORLD)], gathered
    objects = [f"from {RANK}", RANK] if RANK == 0 else [None, None]
    dist.broadcast_object_list(objects, src=0)
    assert objects == ["from 0", 0], objects
    out = [None] if True else None
    dist.scatter_object_list(out, [r * 10 for r in range(WORLD)] if RANK == 0 else None, src=0)
    assert out == [RANK * 10], out
    got = [None] * WORLD if RANK == 0 else None
    dist.gather_object(("g", RANK), got, dst=0)
    assert RANK != 0 or got == [("g", r) for r in range(WORLD)], got
    # object broadcast with tensors placed on the neuron device
    objects = [torch.ones(2) * (RANK + 1)]
    dist.broadcast_object_list(objects, src=1, device=NEURON)
    assert torch.equal(objects[0].cpu(), torch.full((2,), 2.0)), objects


def coalesced(device, group):
    tensors = [data(device, n=4, salt=i) for i in range(3)]
    dist.all_reduce_coalesced(tensors, group=group)
    outs = [[torch.empty(4, device=device) for _ in range(2)] for _ in range(WORLD)]  # [rank][input]
    dist.all_gather_coalesced(outs, [data(device, n=4), data(device, n=4, salt=7)], group=group)
    return [*tensors, *[t for out in outs for t in out]]


def coalescing_manager(device, group):
    ins = [data(device, n=4, salt=i) for i in range(2)]
    gathered = [torch.empty(4 * WORLD, device=device) for _ in range(2)]
    with dist._coalescing_manager(group=group, async_ops=True) as cm:
        for o, i in zip(gathered, ins, strict=True):
            dist.all_gather_into_tensor(o, i, group=group)
    cm.wait()
    scattered = [torch.empty(2, device=device) for _ in range(2)]
    with dist._coalescing_manager(group=group):
        for o, i in zip(scattered, [data(device, n=2 * WORLD, salt=s) for s in range(2)], strict=True):
            dist.reduce_scatter_tensor(o, i, group=group)
    return [*gathered, *scattered]


def functional(device, group):
    group = group or dist.group.WORLD
    x = data(device, n=2 * WORLD)
    reduced = funcol.all_reduce(x, "sum", group)
    gathered = funcol.all_gather_tensor(x, 0, group)
    scattered = funcol.reduce_scatter_tensor(x, "sum", 0, group)
    exchanged = funcol.all_to_all_single(x, [2] * WORLD, [2] * WORLD, group)
    broadcasted = funcol.broadcast(x, 0, group)
    return [funcol.wait_tensor(t) for t in (reduced, gathered, scattered, exchanged, broadcasted)]


def bf16_and_int(device, group):
    a, b = data(device, dtype=torch.bfloat16), data(device, dtype=torch.int32)
    dist.all_reduce(a, group=group)
    dist.all_reduce(b, op=dist.ReduceOp.MAX, group=group)
    return [a, b]


def charges_simulated_time() -> None:
    from neuron_device import timeline

    index = NEURON.index
    before = timeline.timeline(index).clocks.get(0, 0.0)
    dist.all_reduce(torch.ones(1 << 20, device=NEURON))
    after = timeline.timeline(index).clocks.get(0, 0.0)
    assert after > before, (before, after)
    stream = torch.neuron.Stream()
    with torch.neuron.stream(stream):
        dist.all_gather_into_tensor(
            torch.empty(WORLD << 20, device=NEURON), torch.ones(1 << 20, device=NEURON)
        )
    assert timeline.timeline(index).clocks[stream.stream_id] > 0.0


def dtensor_1d() -> None:
    """DTensor on a 1-D neuron mesh (this rank's device is neuron:LOCAL_RANK): shard, reshard, replicate."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("neuron", (WORLD,))
    source = torch.arange(32.0).view(4, 8)
    tensor = distribute_tensor(source.to(NEURON), mesh, [Shard(0)])
    assert tensor.to_local().device == NEURON and tensor.to_local().shape == (4 // WORLD, 8)
    columns = tensor.redistribute(mesh, [Shard(1)])  # all-to-all between shard dimensions
    torch.testing.assert_close(columns.to_local().cpu(), source.chunk(WORLD, dim=1)[RANK], rtol=0, atol=0)
    torch.testing.assert_close(columns.full_tensor().cpu(), source, rtol=0, atol=0)
    summed = (tensor @ tensor.redistribute(mesh, [Replicate()]).T).redistribute(mesh, [Replicate()])
    torch.testing.assert_close(summed.to_local().cpu(), source @ source.T, rtol=0, atol=0)


def cpp_callers(device, group):
    """The C++ base methods (what the DDP reducer, DTensor's C++ ops, ... call) dispatch `c10d::*` ops: on neuron
    tensors they reach neuron-distributed's kernels, on CPU tensors Gloo."""
    from torch._C._distributed_c10d import AllgatherOptions, ReduceOptions, ReduceScatterOptions

    from neuron_device import timeline

    pg, base = group or dist.group.WORLD, dist.ProcessGroup
    before = timeline.timeline(NEURON.index).clocks.get(0, 0.0)
    gathered = torch.empty(6 * WORLD, device=device)
    base._allgather_base(pg, gathered, data(device), AllgatherOptions()).wait()
    scattered = torch.empty(3, device=device)
    base._reduce_scatter_base(pg, scattered, data(device, n=3 * WORLD), ReduceScatterOptions()).wait()
    reduced = data(device)
    options = ReduceOptions()
    options.rootRank = 1
    base.reduce(pg, [reduced], options).wait()
    broadcasted = data(device)
    torch.ops.c10d.broadcast_.default([broadcasted], pg.boxed(), 0, 0, False, -1)[1].wait()
    exchanged = torch.empty(2 * WORLD, device=device)
    work = torch.ops.c10d.alltoall_base_.default(
        exchanged, data(device, n=2 * WORLD), pg.boxed(), [], [], False, -1
    )
    work.wait()
    torch.ops.c10d.barrier.default(torch.empty(0, device=device), pg.boxed(), [], False, -1).wait()
    if device.type == "neuron":
        assert timeline.timeline(NEURON.index).clocks.get(0, 0.0) > before, "no interconnect time was charged"
    return [
        gathered,
        scattered,
        reduced if RANK == 1 else torch.zeros(0, device=device),
        broadcasted,
        exchanged,
    ]


def backend_identity() -> None:
    """Each process sees every visible core and works on neuron:<LOCAL_RANK>; the group is backend `neuron`."""
    from neuron_device.topology import topology

    local_rank = int(os.environ["LOCAL_RANK"])
    assert NEURON.index == local_rank, NEURON
    visible = os.environ.get("NEURON_RT_VISIBLE_CORES")
    if visible == "2-3":  # the launch that restricts the process to cores 2 and 3
        assert torch.neuron.device_count() == 2, torch.neuron.device_count()
        assert topology().core_id(NEURON.index) == 2 + local_rank, topology()
    group = dist.group.WORLD
    assert group._get_backend(torch.device("neuron")) is not None
    name = dist.get_backend()
    # torch reports the backend string it was given, or "undefined" for a Python process group chosen by default
    assert name in ("neuron", "cpu:gloo,neuron:neuron", "undefined"), name
    assert group.getBackendName() == "neuron"


CHECKS = {
    "backend_identity": backend_identity,
    **{
        f"all_reduce_{op}": all_reduce(getattr(dist.ReduceOp, op))
        for op in ("SUM", "AVG", "MIN", "MAX", "PRODUCT")
    },
    "all_reduce_PREMUL_SUM": all_reduce_premul_sum,
    "all_reduce_async": compare(all_reduce_async),
    "all_reduce_dtypes": compare(bf16_and_int),
    "all_gather": compare(all_gather),
    "all_gather_into_tensor": compare(all_gather_into_tensor),
    "reduce_scatter": compare(reduce_scatter),
    "reduce_scatter_tensor_SUM": reduce_scatter_tensor(dist.ReduceOp.SUM),
    "reduce_scatter_tensor_AVG": reduce_scatter_tensor(dist.ReduceOp.AVG),
    "reduce_scatter_tensor_PREMUL_SUM": reduce_scatter_tensor_premul_sum,
    "broadcast": compare(broadcast),
    "reduce": compare(reduce),
    "gather": compare(gather),
    "scatter": compare(scatter),
    "all_to_all": compare(all_to_all),
    "all_to_all_single": compare(all_to_all_single),
    "barrier": barrier,
    "send_recv": compare(send_recv),
    "batch_isend_irecv": compare(batch_isend_irecv),
    "object_collectives": object_collectives,
    "coalesced": compare(coalesced),
    "coalescing_manager": compare(coalescing_manager),
    "functional": compare(functional),
    "simulated_time": charges_simulated_time,
    "dtensor_1d": dtensor_1d,
    "cpp_callers": compare(cpp_callers),
}

run_checks(CHECKS, sys.argv[2:])
dist.destroy_process_group()
print("CHECK destroy OK")
finish()
