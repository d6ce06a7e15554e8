"""Single-process multi-device: `nn.DataParallel` over `neuron` devices and `torch.neuron.comm`, against the CPU."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

DEVICES = [0, 1, 2]


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


@pytest.fixture(autouse=True)
def _enough_devices():
    assert torch.neuron.device_count() >= len(DEVICES)


@pytest.mark.parametrize("input_on", ["cpu", "neuron"])
def test_forward_and_backward_match_one_cpu_module(input_on):
    cpu = _mlp()
    model = nn.DataParallel(copy.deepcopy(cpu).to("neuron"), device_ids=DEVICES)
    x = torch.randn(7, 8)  # 7 rows over 3 devices: chunks of 3, 3 and 1

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = model(x.to(input_on))
        out.square().sum().backward()
    assert not [w for w in caught if "NCCL" in str(w.message)]  # torch's comm warned on every backward
    expected = cpu(x)
    expected.square().sum().backward()

    assert out.device == torch.device("neuron", 0)
    torch.testing.assert_close(out.cpu(), expected)
    for ours, theirs in zip(model.module.parameters(), cpu.parameters()):
        assert ours.grad.device == torch.device("neuron", 0)
        torch.testing.assert_close(ours.grad.cpu(), theirs.grad)


def test_inference_without_autograd():
    """Under no_grad DataParallel replicates with detached copies (`broadcast_coalesced`), as on CUDA."""
    cpu = _mlp()
    model = nn.DataParallel(copy.deepcopy(cpu).to("neuron"), device_ids=DEVICES)
    x = torch.randn(7, 8)
    with torch.no_grad():
        out = model(x)
    assert not out.requires_grad
    torch.testing.assert_close(out.cpu(), cpu(x).detach())
    functional = nn.parallel.data_parallel(model.module, x.to("neuron"), device_ids=DEVICES[:2])
    torch.testing.assert_close(functional.detach().cpu(), cpu(x).detach())


def test_each_replica_runs_on_its_own_device():
    seen = []

    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(2))

        def forward(self, x):
            seen.append((x.device, self.weight.device, torch.neuron.current_device(), len(x)))
            return x * self.weight

    model = nn.DataParallel(Probe().to("neuron"), device_ids=DEVICES)
    model(torch.ones(3, 2))
    assert sorted(seen, key=lambda s: s[2]) == [(torch.device("neuron", i), torch.device("neuron", i), i, 1) for i in DEVICES]


def test_training_steps_match_one_cpu_module():
    cpu = _mlp()
    model = nn.DataParallel(copy.deepcopy(cpu).to("neuron"), device_ids=DEVICES)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, cpu)]
    torch.manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(9, 8), torch.randn(9, 4)
        losses = [nn.functional.mse_loss(model(x), y.to("neuron")), nn.functional.mse_loss(cpu(x), y)]
        for loss, optimizer in zip(losses, optimizers):
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        torch.testing.assert_close(losses[0].cpu(), losses[1])
    for ours, theirs in zip(model.module.parameters(), cpu.parameters()):
        torch.testing.assert_close(ours.cpu(), theirs)


def test_batch_norm_statistics_come_from_the_first_replica():
    """As on CUDA: every replica normalises its own chunk, and the module's running statistics are updated by the
    replica on the first device, from the first chunk."""
    torch.manual_seed(0)
    cpu = nn.BatchNorm1d(4)
    model = nn.DataParallel(copy.deepcopy(cpu).to("neuron"), device_ids=DEVICES[:2])
    x = torch.randn(6, 4) * 3 + 1

    out = model(x)
    torch.testing.assert_close(out.cpu(), torch.cat([cpu(x[:3]), copy.deepcopy(cpu)(x[3:])]))  # cpu saw x[:3]
    torch.testing.assert_close(model.module.running_mean.cpu(), cpu.running_mean)
    torch.testing.assert_close(model.module.running_var.cpu(), cpu.running_var)


def test_structured_inputs_outputs_and_another_output_device():
    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.tensor(2.0))

        def forward(self, x, *, offset):
            return {"y": x * self.scale + offset, "n": (x.sum(1),)}

    model = nn.DataParallel(Pair().to("neuron"), device_ids=DEVICES, output_device=2)
    x = torch.arange(12.0).reshape(6, 2)
    out = model(x, offset=torch.ones(6, 2))
    assert out["y"].device == torch.device("neuron", 2)
    torch.testing.assert_close(out["y"].cpu(), x * 2 + 1)
    torch.testing.assert_close(out["n"][0].cpu(), x.sum(1))


# --- torch.neuron.comm, the functions DataParallel is built on ----------------------------------------------------


def test_comm_is_what_torch_nn_parallel_comm_uses():
    from torch.nn.parallel import comm

    x = torch.arange(10.0, device="neuron:1")
    parts = comm.scatter(x, devices=[0, 1], chunk_sizes=[4, 6])
    assert [p.device.index for p in parts] == [0, 1]
    assert parts[1].data_ptr() == x[4:].data_ptr()  # a chunk already on its device is a view, as on CUDA
    torch.testing.assert_close(comm.gather(parts, destination="cpu"), x.cpu())
    torch.testing.assert_close(torch.neuron.comm.gather(parts, destination=1), x)


def test_broadcast_keeps_the_source_and_copies_elsewhere():
    from torch.nn.parallel import comm

    x = torch.randn(3, device="neuron:0")
    same, other = comm.broadcast(x, devices=[0, 2])
    assert same is x and other.device == torch.device("neuron", 2)
    torch.testing.assert_close(other.cpu(), x.cpu())

    w = torch.randn(2, 2, device="neuron:0", requires_grad=True)
    ids = torch.arange(4, device="neuron:0")
    originals, copies = comm.broadcast_coalesced([w, ids, x], devices=[0, 1])
    assert originals[0] is w and originals[1] is ids and originals[2] is x
    copy_w, _, copy_x = copies  # the caller's order, though buffers are packed per dtype
    assert [t.device.index for t in copies] == [1, 1, 1] and not copy_w.requires_grad
    assert copy_w.untyped_storage().data_ptr() == copy_x.untyped_storage().data_ptr()  # one float32 buffer, as CUDA
    torch.testing.assert_close([t.cpu() for t in copies], [w.detach().cpu(), ids.cpu(), x.cpu()])
    copy_w.add_(1)  # a copy with its own memory and version counter
    assert w._version == 0 and copy_x._version == 0
    torch.testing.assert_close(copy_w.cpu(), w.detach().cpu() + 1)
    torch.testing.assert_close(copy_x.cpu(), x.cpu())

    out = [torch.empty(3, device="neuron:1"), torch.empty(3, device="neuron:2")]
    assert comm.broadcast(x, out=out) == tuple(out)
    torch.testing.assert_close(out[1].cpu(), x.cpu())


def test_reduce_add_sums_on_the_destination():
    from torch.nn.parallel import comm

    inputs = [torch.full((4,), float(i + 1), device=f"neuron:{i}") for i in DEVICES]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        total = comm.reduce_add(inputs, destination=1)
        coalesced = comm.reduce_add_coalesced([[t, t * 2] for t in inputs], destination=0)
    assert not [w for w in caught if "NCCL" in str(w.message)]
    assert total.device == torch.device("neuron", 1)
    torch.testing.assert_close(total.cpu(), torch.full((4,), 6.0))
    torch.testing.assert_close([c.cpu() for c in coalesced], [torch.full((4,), 6.0), torch.full((4,), 12.0)])
    assert inputs[1].cpu().eq(2).all()  # the destination's input is not summed into


def test_scatter_and_gather_into_out_tensors():
    x = torch.arange(12.0).reshape(6, 2)
    out = [torch.empty(2, 2, device="neuron:0"), torch.empty(4, 2, device="neuron:2")]
    assert torch.neuron.comm.scatter(x, out=out) == tuple(out)
    torch.testing.assert_close(out[1].cpu(), x[2:])
    gathered = torch.empty(6, 2, device="neuron:1")
    assert torch.neuron.comm.gather(out, out=gathered) is gathered
    torch.testing.assert_close(gathered.cpu(), x)


def test_complex_tensors_travel_as_real_pairs():
    x = torch.randn(4, dtype=torch.complex64)
    parts = torch.neuron.comm.scatter(x, devices=[0, 1])
    torch.testing.assert_close(torch.view_as_complex(torch.neuron.comm.gather(parts, destination="cpu")), x)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: torch.neuron.comm.scatter(torch.ones(4), devices=[0, 1], chunk_sizes=[1, 2]), "sum to 4"),
        (lambda: torch.neuron.comm.scatter(torch.ones(4), devices=[0, 1], chunk_sizes=[4]), "same length"),
        (lambda: torch.neuron.comm.scatter(torch.ones(4), devices=[0, 1], chunk_sizes=[4, 0]), "positive chunk"),
        (lambda: torch.neuron.comm.scatter(torch.ones(4)), "Exactly one of 'devices' and 'out'"),
        (lambda: torch.neuron.comm.gather([]), "at least one tensor"),
        (lambda: torch.neuron.comm.gather([torch.ones(2)]), "input 0 is on cpu"),
        (
            lambda: torch.neuron.comm.gather([torch.ones(2, 3, device="neuron"), torch.ones(2, 2, device="neuron")]),
            r"index 1 has shape \[2, 2\]",
        ),
        (
            lambda: torch.neuron.comm.broadcast_coalesced([torch.ones(1, device="neuron:1")], devices=[0, 1]),
            r"must be on devices\[0\]: 0, but got 1",
        ),
        (
            lambda: torch.neuron.comm.reduce_add([torch.ones(1, device="neuron:1")], destination=0),
            "same device as one of the tensors",
        ),
    ],
)
def test_bad_arguments_are_named(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()
