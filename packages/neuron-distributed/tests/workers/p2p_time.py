"""Point-to-point transfers on simulated time (2 ranks): rank 0 computes, then sends; rank 1 receives at once. The
transfer runs on the sender's transfer stream, and the receiver's stream waits for it to complete."""

import os

import torch
import torch.distributed as dist
from common import finish, run_checks

from neuron_device import services
from neuron_distributed import costs

dist.init_process_group("neuron")
RANK, INDEX = dist.get_rank(), int(os.environ["LOCAL_RANK"])
device = torch.device("neuron", INDEX)
line = services.timeline(INDEX)
x = torch.randn(256, 256, device=device)
if RANK == 0:
    for _ in range(20):
        x = x @ x
before, busy = line.clocks[0], line.busy.get(0, 0.0)
if RANK == 0:
    dist.send(x, dst=1)
else:
    dist.recv(x, src=0)
after = line.clocks[0]
seen = [None, None]
dist.all_gather_object(seen, (before, after, busy, line.busy.get(0, 0.0), line.busy.get(costs.TRANSFER_STREAM, 0.0)))
transfer = costs.transfer_seconds(x.nbytes, (0, 1))


def transfer_is_off_the_compute_stream() -> None:
    """Neither end's compute stream is charged the transfer: the sender's transfer stream is."""
    _, _, busy_before, busy_after, sending = seen[RANK]
    assert busy_after == busy_before, (busy_before, busy_after)
    assert sending == (transfer if RANK == 0 else 0.0), (sending, transfer)


def stream_waits_for_the_transfer() -> None:
    """On both ends, `wait` leaves the current stream at the transfer's completion: when rank 0's data was
    produced, plus the transfer (rank 1, idle, waits for rank 0's compute too)."""
    produced = seen[0][0]
    assert seen[1][0] < produced  # the receiver's own clock was earlier
    assert seen[RANK][1] == produced + transfer, (seen, transfer)


def recv_from_any_source() -> None:
    """`dist.recv` without a source names the sender (it asks the Work for `_source_rank`)."""
    if RANK == 0:
        dist.send(torch.full((4,), 7.0, device=device), dst=1)
        return
    got = torch.empty(4, device=device)
    assert dist.recv(got) == 0
    assert got.tolist() == [7.0] * 4


run_checks({"transfer_is_off_the_compute_stream": transfer_is_off_the_compute_stream,
            "stream_waits_for_the_transfer": stream_waits_for_the_transfer,
            "recv_from_any_source": recv_from_any_source})
finish()
