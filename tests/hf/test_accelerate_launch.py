"""`accelerate launch --num_processes 2` on `neuron`: accelerate's own MULTI_NEURON path with the c10d backend
`neuron` (neuron-distributed), each process on neuron:<local_rank>, matching a single-process CPU run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("accelerate")
pytestmark = [pytest.mark.optional, pytest.mark.multiprocess]

SCRIPT = Path(__file__).with_name("accelerate_train.py")


def _cpu_reference() -> torch.Tensor:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import accelerate_train as script
    finally:
        sys.path.pop(0)
    net = script.model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    inputs, targets = script.data()
    for _ in range(script.STEPS):  # equal shards: DDP's averaged gradient is the full-batch gradient
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(inputs), targets).backward()
        optimizer.step()
    return net.weight.detach()


def test_accelerate_launch_two_processes_trains_as_multi_neuron(tmp_path):
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", str(SCRIPT)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    reports = [json.loads((tmp_path / f"report-{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["rank"] for r in reports] == [0, 1]
    expected = _cpu_reference()
    for report in reports:
        assert report["distributed_type"] == "DistributedType.MULTI_NEURON"
        assert report["backend"] == "neuron"
        assert report["device"] == f"neuron:{report['rank']}"
        torch.testing.assert_close(torch.tensor(report["weight"]), expected, atol=1e-5, rtol=1e-5)
