"""Faults never hang and never crash a healthy rank: dead, stalled or absent peers make the others raise within the
process-group timeout; mismatched collectives raise a clear error; destroy_process_group leaves no thread behind."""

import pytest
from launcher import assert_check, launch

TIMEOUT = "10"


@pytest.mark.multiprocess
@pytest.mark.parametrize("scenario", ["killed", "stalled", "absent"])
def test_peer_failure_raises_within_timeout(scenario):
    results, outputs = launch("faults.py", 2, scenario, TIMEOUT, timeout=90)
    assert_check({0: results[0]}, outputs, "peer_raises")


@pytest.fixture(scope="module")
def mismatch_run():
    return launch("faults.py", 2, "mismatch", TIMEOUT, timeout=120)


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "check",
    [
        "wrong_shape",
        "wrong_dtype",
        "wrong_collective",
        "all_to_all_uneven",
        "send_bigger_than_recv",
        "send_smaller_than_recv",
        "send_other_dtype",
        "ring_exchange_matches",
        "destroy_leaves_nothing",
    ],
)
def test_mismatch(check, mismatch_run):
    assert_check(*mismatch_run, check)
