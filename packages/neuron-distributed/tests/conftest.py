import sys
from pathlib import Path

import pytest
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, str(Path(__file__).parent))


def pytest_configure(config):
    config.addinivalue_line("markers", "multiprocess: launches several ranks on localhost")


@pytest.fixture
def mesh():
    """A one-process world on `neuron` (backend "neuron") and its one-device mesh."""
    dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("neuron", (1,))
    finally:
        dist.destroy_process_group()
