"""Semantics that must match CPU/CUDA (issue 19, items 5-8): device rules, out= resizing, odd corners, clear errors
for unsupported tensors."""

from __future__ import annotations

import pytest
import torch

# -- item 5: device rules as CUDA's ----------------------------------------------------------------------------------


def test_a_0dim_cpu_tensor_may_be_an_input_scalar():
    a = torch.ones(3, device="neuron")
    assert torch.equal((torch.tensor(2.0) + a).cpu(), torch.full((3,), 3.0))
    assert torch.equal(torch.mul(a, torch.tensor(4.0)).cpu(), torch.full((3,), 4.0))


def test_a_0dim_cpu_tensor_is_never_the_out_destination():
    a = torch.ones(3, device="neuron")
    out = torch.empty((), dtype=torch.bool)
    with pytest.raises(RuntimeError, match="Expected out tensor to have device neuron:0, but got cpu"):
        torch.lt(a, a, out=out)


def test_a_cpu_tensor_is_never_the_in_place_destination():
    cpu = torch.tensor(1.0)
    with pytest.raises(RuntimeError, match="found at least two devices, neuron:0 and cpu"):
        cpu += torch.ones((), device="neuron")
    assert cpu.item() == 1.0


def test_index_put_takes_cpu_indices_but_not_cpu_values():
    a = torch.zeros(4, device="neuron")
    a.index_put_((torch.tensor([1]),), torch.tensor([5.0], device="neuron"))
    a[torch.tensor([2])] = 7.0
    a.index_put_((torch.tensor([3]),), torch.tensor(9.0))  # a 0-dim value is a scalar
    assert a.cpu().tolist() == [0.0, 5.0, 7.0, 9.0]
    with pytest.raises(RuntimeError, match="found at least two devices, neuron:0 and cpu"):
        a.index_put_((torch.tensor([0]),), torch.tensor([1.0]))


# -- item 6: out= resizing as on CPU ---------------------------------------------------------------------------------

_OUT_CASES = {
    "shrink to zero": lambda d: torch.neg(torch.empty(0, device=d), out=torch.ones(1, device=d)),
    "randperm(0)": lambda d: torch.randperm(0, out=torch.ones(3, dtype=torch.int64, device=d)),
    "zero-size, right size": lambda d: torch.add(torch.empty(0, 3, device=d), 1, out=torch.empty(3, 0, device=d).t()),
    "zero-size, transposed": lambda d: torch.neg(torch.empty(0, 2, device=d), out=torch.empty(2, 0, device=d).t()),
    "right size keeps strides": lambda d: torch.add(torch.ones(2, 3, device=d), 1, out=torch.empty(3, 2, device=d).t()),
    "shrink": lambda d: torch.neg(torch.ones(2, device=d), out=torch.ones(5, device=d)),
    "grow": lambda d: torch.neg(torch.ones(6, device=d), out=torch.ones(2, device=d)),
}


@pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")
@pytest.mark.parametrize("case", sorted(_OUT_CASES))
def test_out_is_resized_as_on_cpu(case):
    expected, actual = _OUT_CASES[case]("cpu"), _OUT_CASES[case]("neuron")
    assert (actual.shape, actual.stride(), actual.storage_offset()) == (
        expected.shape, expected.stride(), expected.storage_offset()
    )
    assert torch.equal(actual.cpu(), expected)
