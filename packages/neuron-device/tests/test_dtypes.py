"""Every torch dtype on `neuron`: moves both ways bit for bit, casts like the CPU, and fp8 (float8_e4m3fn,
float8_e5m2, the Trainium formats) supports the data movement ops; ops the CPU lacks for a dtype fail the same way."""

from __future__ import annotations

import pytest
import torch

DEVICE = "neuron"
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu)
CASTABLE = (
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
    torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex32, torch.complex64,
    torch.complex128, *FP8,
)
# Values that exercise rounding, saturation, NaN/inf handling and underflow of the narrow formats.
VALUES = torch.tensor([0.0, -1.5, 3.25, 0.1, 500.0, -1e5, float("nan"), float("inf"), -float("inf"), 1e-8, 448.0, 57344.0])


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a CPU tensor, so NaNs and dtypes without `==` compare too."""
    return tensor.contiguous().view(torch.uint8)


def _same(neuron: torch.Tensor, cpu: torch.Tensor) -> None:
    assert neuron.device.type == DEVICE
    assert neuron.dtype is cpu.dtype and neuron.shape == cpu.shape
    assert torch.equal(_bits(neuron.cpu()), _bits(cpu))


@pytest.mark.parametrize("dtype", CASTABLE, ids=str)
def test_round_trip_is_bitwise(dtype):
    cpu = VALUES.to(dtype)
    moved = cpu.to(DEVICE)
    _same(moved, cpu)
    _same(cpu.to(f"{DEVICE}:0", non_blocking=True), cpu)


@pytest.mark.parametrize("dtype", CASTABLE, ids=str)
def test_casts_match_cpu(dtype):
    source = VALUES.to(DEVICE)
    _same(source.to(dtype), VALUES.to(dtype))
    _same(source.to(dtype).to(torch.float32), VALUES.to(dtype).to(torch.float32))
    _same(source.to(dtype).to(torch.bfloat16), VALUES.to(dtype).to(torch.bfloat16))


def test_packed_fp4_moves_bitwise():
    raw = torch.arange(256, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    _same(raw.to(DEVICE), raw)


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_fp8_factories(dtype):
    _same(torch.zeros(2, 3, dtype=dtype, device=DEVICE), torch.zeros(2, 3, dtype=dtype))
    _same(torch.full((4,), 1.5, dtype=dtype, device=DEVICE), torch.full((4,), 1.5, dtype=dtype))
    assert torch.empty(5, dtype=dtype, device=DEVICE).dtype is dtype


@pytest.mark.parametrize("dtype", (torch.float8_e4m3fn, torch.float8_e5m2), ids=str)
def test_fp8_ops_match_cpu(dtype):
    cpu = torch.randn(4, 6, generator=torch.Generator().manual_seed(0)).to(dtype)
    neuron = cpu.to(DEVICE)
    for fn in (
        lambda t: t.clone(),
        lambda t: t[1:, ::2],
        lambda t: t.t().contiguous(),
        lambda t: t.reshape(6, 4),
        lambda t: t.unsqueeze(0).expand(2, 4, 6).contiguous(),
        lambda t: torch.cat([t, t]),
        lambda t: torch.stack([t, t], 1),
        lambda t: t.view(torch.uint8),
        lambda t: t.abs(),
        lambda t: t == t,
        lambda t: torch.where(t == t, t, t),
        lambda t: t @ t.t(),  # the CPU has an fp8 matmul; neuron runs it (no fp8 numerics policy of its own yet)
    ):
        _same(fn(neuron), fn(cpu))
    target = torch.empty(4, 6, dtype=dtype, device=DEVICE)
    target.copy_(neuron)
    _same(target, cpu)


@pytest.mark.parametrize("fn", [lambda t: t + t, lambda t: t.sum(), torch.exp], ids=["add", "sum", "exp"])
def test_fp8_ops_the_cpu_lacks_fail_the_same_way(fn):
    cpu = torch.ones(3, 3, dtype=torch.float8_e4m3fn)
    with pytest.raises((RuntimeError, NotImplementedError)) as on_cpu:
        fn(cpu)
    with pytest.raises(type(on_cpu.value)) as on_neuron:
        fn(cpu.to(DEVICE))
    assert str(on_neuron.value).splitlines()[0] == str(on_cpu.value).splitlines()[0]


def test_fp8_cast_inside_autograd():
    """Casting through fp8 (as fp8 training recipes do) on neuron: forward values and gradients match the CPU."""
    x = torch.randn(8, generator=torch.Generator().manual_seed(0))
    results = []
    for device in ("cpu", DEVICE):
        leaf = x.to(device, copy=True).requires_grad_()
        y = leaf.to(torch.float8_e4m3fn).to(torch.float32) * 2
        y.sum().backward()
        results.append((y.detach().cpu(), leaf.grad.cpu()))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_supported_amp_dtypes():
    assert torch.neuron.get_amp_supported_dtype() == [torch.bfloat16, torch.float16, torch.float32]
    assert torch.neuron.is_bf16_supported()


def test_accelerator_capability_names_exactly_the_dtypes_tested_here():
    """`torch.accelerator.get_device_capability()` promises allocation and conversion for its dtypes: the ones this
    file moves and casts."""
    for device in (None, "neuron:1", 1):
        assert torch.accelerator.get_device_capability(device)["supported_dtypes"] == set(CASTABLE)
    with pytest.raises(RuntimeError, match="Invalid device index 9"):
        torch.accelerator.get_device_capability(9)
