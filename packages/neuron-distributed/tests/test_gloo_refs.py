"""No Python object a Gloo work holds is released on Gloo's worker (`neuron_distributed.gloo_refs`): there the
release takes the GIL, and a group destroyed by a thread holding the GIL joins that worker (the exit hang of about
one real 2-rank DDP run in 20). Each check orders the ranks through the store, so the worker finishes the work after
the caller let go of it: without `gloo_refs` the tensor dies on the worker, every run."""

import pytest
from launcher import assert_check, launch


@pytest.fixture(scope="module")
def release_run():
    return launch("gloo_release.py", 2, timeout=180)


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "check", ["all_to_all_unpacks_on_the_waiting_thread", "tensors_die_on_a_python_thread"]
)
def test_released_on_a_python_thread(check, release_run):
    assert_check(*release_run, check)
