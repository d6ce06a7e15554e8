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


def test_nonzero_refuses_a_cpu_out_with_cudas_message():
    """CUDA's nonzero kernel checks the device of `out` itself, with its own message (PyTorch's tests match it)."""
    with pytest.raises(RuntimeError, match="^expected self and out to be on the same device, but got out on cpu and "
                                           r"self on neuron:1$"):
        torch.nonzero(torch.ones(3, device="neuron:1"), out=torch.empty(0, dtype=torch.long))


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


# -- item 7: corners that differed ------------------------------------------------------------------------------------


def test_copy_from_a_python_number():
    """GradScaler's inf/nan path does `tensor.copy_(number)`; it raised AttributeError."""
    t = torch.zeros(2, device="neuron")
    torch.Tensor.copy_(t, 3.0)
    assert t.cpu().tolist() == [3.0, 3.0]


def test_ldexp_float16_matches_cpu():
    args = (torch.tensor([1.0, 1.0], dtype=torch.float16), torch.tensor([-24, 10]))
    expected = torch.ldexp(*args)
    assert torch.equal(torch.ldexp(*(a.to("neuron") for a in args)).cpu(), expected)


def test_ldexp_float16_forms_the_power_of_two_as_the_cpu_does():
    """2**-25 and 2**20 are not float16 numbers; the CPU's result is exact (issue 40)."""
    args = (torch.tensor([-2, 2**-10], dtype=torch.half), torch.tensor([-25, 20]))
    expected = torch.ldexp(*args)
    assert expected.tolist() == [-2**-24, 1024.0]
    on_neuron = [a.to("neuron") for a in args]
    assert torch.equal(torch.ldexp(*on_neuron).cpu(), expected)
    out = torch.empty(2, dtype=torch.half, device="neuron")
    assert torch.equal(torch.ldexp(*on_neuron, out=out).cpu(), expected)


def test_ldexp_in_place_refuses_to_resize_self_as_the_cpu_does():
    for device in ("cpu", "neuron"):
        with pytest.raises(RuntimeError, match=r"output with shape \[0, 1, 3\] doesn't match the broadcast shape"):
            torch.randn(0, 1, 3, device=device).ldexp_(torch.randn(0, 3, 3, device=device))


def test_conj_physical_in_place():
    t = torch.tensor([1 + 2j, -3j], device="neuron")
    t.conj_physical_()
    assert t.cpu().tolist() == [1 - 2j, 3j]


def test_set_to_another_tensor_shares_its_storage():
    a, b = torch.ones(3, device="neuron"), torch.empty(0, device="neuron")
    b.set_(a)
    assert b.is_set_to(a) and b.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()


def test_lazy_clone_gives_an_independent_copy():
    a = torch.arange(3.0, device="neuron")
    clone = torch._lazy_clone(a)
    a.add_(1)
    assert clone.cpu().tolist() == [0.0, 1.0, 2.0]


def test_fill_uninitialized_memory_as_on_cpu():
    torch.use_deterministic_algorithms(True)
    try:
        assert torch.empty(2, dtype=torch.int32, device="neuron").cpu().tolist() == [2**31 - 1] * 2
        assert torch.empty(2, device="neuron").isnan().all()
    finally:
        torch.use_deterministic_algorithms(False)


def test_empty_strided_with_mismatched_ranks_is_a_runtime_error():
    with pytest.raises(RuntimeError, match=r"dimensionality of sizes \(2\) must match dimensionality of strides"):
        torch.empty_strided((2, 3), (1,), device="neuron")


def test_a_stream_may_wait_for_a_stream_of_another_device():
    first, second = torch.neuron.Stream(device=0), torch.neuron.Stream(device=1)
    with torch.neuron.stream(second):
        torch.ones(256, 256, device="neuron:1").sum()
    first.wait_stream(second)  # CUDA allows it; it raised
    assert torch.neuron.Event().query()


@pytest.mark.parametrize("make", [lambda: torch.Generator("neuron"), lambda: torch.Generator(device="neuron:1"),
                                  lambda: torch.Generator(torch.device("neuron", 0))])
def test_a_neuron_generator_names_what_to_use_instead(make):
    """torch 2.13 lets a Python backend implement none of the hooks that make `torch.Generator("neuron")`: the error
    a user sees names the device's generator (torch's own asks to register C++ hooks)."""
    with pytest.raises(NotImplementedError, match=r"torch\.neuron\.random\.default_generator\([01]\)") as raised:
        make()
    assert "getNewGenerator" in str(raised.value) and "torch.Generator()" in str(raised.value)
    assert torch.Generator().device.type == "cpu" and isinstance(torch.default_generator, torch.Generator)
    generator = torch.neuron.random.default_generator(0)
    torch.neuron.manual_seed(3)
    expected = torch.rand(4, generator=torch.Generator().manual_seed(3))
    assert torch.equal(torch.rand(4, generator=generator), expected)


def test_rand_like_takes_a_cpu_generator_on_neuron():
    """`rand_like(t, generator=)` with the generator the error above suggests: the CPU's numbers, on `neuron`."""
    t = torch.empty(3, 5, device="neuron:1")
    for draw in (torch.rand_like, torch.randn_like):
        result = draw(t, generator=torch.Generator().manual_seed(11))
        assert result.device == t.device
        assert torch.equal(result.cpu(), draw(t.cpu(), generator=torch.Generator().manual_seed(11)))
    device_generator = torch.neuron.random.default_generator(1)
    torch.neuron.manual_seed_all(4)
    assert torch.equal(torch.rand_like(t, generator=device_generator).cpu(),
                       torch.rand(3, 5, generator=torch.Generator().manual_seed(4)))


# -- item 8: unsupported tensors give clear errors --------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_quantized_tensors_are_refused_by_name():
    quantized = torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8)
    with pytest.raises(NotImplementedError, match=r"quantized tensors .* are not supported on neuron"):
        quantized.to("neuron")


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_nested_tensors_are_refused_by_name():
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    with pytest.raises(NotImplementedError, match="nested tensors are not supported on neuron"):
        nested.to("neuron")
    with pytest.raises(NotImplementedError, match="nested tensors are not supported on neuron"):
        torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], device="neuron") + 1


def test_a_numel_overflow_is_cpus_error_not_an_oom():
    with pytest.raises(RuntimeError, match=r"Storage size calculation overflowed with sizes=\[4611686018427387904"):
        torch.empty(2**62, 2**62, device="neuron")
    with pytest.raises(torch.OutOfMemoryError):  # a size that merely does not fit is still an OOM
        torch.empty(2**40, device="neuron")


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64, torch.uint8, torch.bool, torch.float16,
                                   torch.float32, torch.complex64])
def test_deterministic_resize_fills_new_memory_as_the_cpu_does(dtype):
    """`fill_uninitialized_memory`: the grown part is the dtype's maximum for integers (it was -1), NaN for floats."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        expected, actual = (torch.zeros(2, dtype=dtype, device=device).resize_(5) for device in ("cpu", "neuron"))
    finally:
        torch.use_deterministic_algorithms(before)
    torch.testing.assert_close(actual.cpu(), expected, equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("args", [(5,), (6, False), (7, True, 3.0), (1,), (0,)])
def test_kaiser_window_runs_as_on_the_cpu(args):
    """Its composite calls a CPU DispatchStub with the tensor's device type: "INTERNAL ASSERT FAILED ... DispatchStub:
    missing kernel for neuron" (issue 40). It runs on the host alias, as a CPU fallback (no Neuron kernel)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the fallback warning
        window = torch.kaiser_window(*args, device="neuron", dtype=torch.float64)
        out = torch.ops.aten.kaiser_window.out(args[0], out=torch.empty(0, device="neuron"))
    assert window.device.type == "neuron"
    assert torch.equal(window.cpu(), torch.kaiser_window(*args, dtype=torch.float64))
    assert torch.equal(out.cpu(), torch.kaiser_window(args[0]))
