"""DDP, FSDP2, TP/SP, PP, DCP (2 ranks) and 2-D FSDP2+TP, DTensor (4 ranks) on backend `neuron`: 10 training steps
match one CPU process training on the whole batch (1e-5 in fp32). One launch per world size serves every check.

As under torchrun, every process sees all cores and trains on `neuron:<LOCAL_RANK>`.
"""

import functools

import pytest
from launcher import assert_check, launch

TWO_RANKS = [
    "ddp",
    "ddp_fp16_compress_hook",
    "fsdp2",
    "fsdp2_no_reshard",
    "fsdp2_bf16",
    "fsdp2_cpu_offload",
    "tp",
    "dtensor_random",
    "sp",
    "pp_gpipe",
    "pp_1f1b",
    "dcp",
]
# Checks of optional dependencies: each launched on its own, in the session that installs it (hf), so the others'
# launch never runs a check that can only fail for a missing library.
OPTIONAL_TWO_RANKS = ["accelerate"]
FOUR_RANKS = ["fsdp_tp_2d", "dtensor_2d"]


@functools.cache
def _run(world_size: int, checkpoint_dir: str, checks: tuple[str, ...]):
    return launch("training.py", world_size, checkpoint_dir, *checks, timeout=420)


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("dcp"))


@pytest.mark.all_wheels  # the models' LayerNorm runs neuron-nki's kernel when installed (sharded by DTensor, SP)
@pytest.mark.multiprocess
@pytest.mark.parametrize("check", [*TWO_RANKS, "destroy",
                                   *(pytest.param(check, marks=pytest.mark.optional) for check in OPTIONAL_TWO_RANKS)])
def test_two_ranks(check, checkpoint_dir):
    if check in OPTIONAL_TWO_RANKS:
        pytest.importorskip(check)
        assert_check(*_run(2, checkpoint_dir, (check,)), check)
    else:
        assert_check(*_run(2, checkpoint_dir, tuple(TWO_RANKS)), check)


@pytest.mark.all_wheels
@pytest.mark.multiprocess
@pytest.mark.parametrize("check", [*FOUR_RANKS, "destroy"])
def test_four_ranks(check, checkpoint_dir):
    assert_check(*_run(4, checkpoint_dir, tuple(FOUR_RANKS)), check)
