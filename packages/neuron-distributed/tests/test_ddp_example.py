"""The torch-neuronx repository's DDP example pattern trains under torchrun on 2 ranks: the device is
`torch_neuronx.current_device()` (neuron:<LOCAL_RANK>), DDP keeps the replicas equal and the loss goes down."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from launcher import WORKERS, free_port


@pytest.mark.multiprocess
def test_ddp_example_with_torch_neuronx_current_device_trains_on_two_ranks(tmp_path) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
               str(WORKERS / "ddp_current_device.py"), str(tmp_path)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    for rank, result in enumerate(results):
        assert result["world_size"] == 2
        assert result["device"] == result["local_rank"] == rank  # torch_neuronx.current_device() is neuron:<LOCAL_RANK>
        assert result["losses"][-1] < 0.5 * result["losses"][0], result["losses"]
    assert results[0]["checksum"] == pytest.approx(results[1]["checksum"], rel=1e-6)  # replicas stayed equal
    assert results[0]["losses"] != results[1]["losses"]  # each rank trained on its own data

