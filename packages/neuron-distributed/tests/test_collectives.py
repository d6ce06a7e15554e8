"""Every collective on `neuron` tensors (2 and 4 ranks), compared with the same call on CPU tensors over plain Gloo.

One launch per init form serves all checks; each check is its own test item through the per-rank markers.
"""

import functools

import pytest
from launcher import assert_check, launch

CHECKS = [
    "backend_identity",
    *[f"all_reduce_{op}" for op in ("SUM", "AVG", "MIN", "MAX", "PRODUCT", "PREMUL_SUM")],
    "all_reduce_async",
    "all_reduce_dtypes",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor_SUM",
    "reduce_scatter_tensor_AVG",
    "reduce_scatter_tensor_PREMUL_SUM",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "send_recv",
    "batch_isend_irecv",
    "object_collectives",
    "coalesced",
    "coalescing_manager",
    "functional",
    "simulated_time",
    "dtensor_1d",
    "cpp_callers",
    "destroy",
]


ENVIRONMENTS = {"all cores": {}, "cores 2-3": {"NEURON_RT_VISIBLE_CORES": "2-3"}}


@functools.cache
def _run(form: str, *checks: str, cores: str = "all cores", world_size: int = 2):
    return launch("collectives.py", world_size, form, *checks, timeout=240, env=ENVIRONMENTS[cores])


@pytest.mark.multiprocess
@pytest.mark.parametrize("check", CHECKS)
def test_collective_on_backend_neuron(check):
    assert_check(*_run("neuron"), check)


@pytest.mark.multiprocess
@pytest.mark.parametrize("check", CHECKS)
def test_collective_on_four_ranks(check):
    assert_check(*_run("neuron", world_size=4), check)


SHORT = ("backend_identity", "all_reduce_SUM", "all_gather_into_tensor", "object_collectives", "dtensor_1d")


@pytest.mark.multiprocess
@pytest.mark.parametrize("form", ["mixed", "default", "device_id"])
@pytest.mark.parametrize("check", [*SHORT, "destroy"])
def test_other_init_forms(form, check):
    """`"cpu:gloo,neuron:neuron"`, no backend at all (the current accelerator is neuron) and
    `device_id=neuron:<LOCAL_RANK>` give the same group."""
    assert_check(*_run(form, *SHORT), check)


@pytest.mark.multiprocess
@pytest.mark.parametrize("check", [*SHORT, "destroy"])
def test_visible_cores_honoured(check):
    """With NEURON_RT_VISIBLE_CORES=2-3 each process sees two devices and rank r works on neuron:r (core 2 + r)."""
    assert_check(*_run("neuron", *SHORT, cores="cores 2-3"), check)


@pytest.mark.multiprocess
@pytest.mark.parametrize("check", ["transfer_is_off_the_compute_stream", "stream_waits_for_the_transfer",
                                   "recv_from_any_source"])
def test_point_to_point_transfer_is_timed_as_the_hardware_moves_it(check):
    """A send is a DMA on the sender's transfer stream, from when its data is produced; the receiver's stream waits
    for it to complete (the receiver was charged the transfer on its compute stream, and never waited for the
    sender: a pipeline's real run had no bubble); a receive from any source names its sender."""
    assert_check(*_p2p_run(), check)


@functools.cache
def _p2p_run():
    return launch("p2p_time.py", 2, timeout=240)
