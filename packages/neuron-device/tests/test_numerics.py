"""The numerics policy (`neuron_device/numerics.py`, `docs/numerics.md`): matmul precision, low-precision accumulation
and the 64-bit downcast switch, each compared with the exact computation it promises, done by hand on the CPU."""

from __future__ import annotations

import pytest
import torch

from neuron_device import numerics
from neuron_device.ops.matmul import OPERANDS

DEVICE = "neuron"
LOW = (torch.bfloat16, torch.float16)


@pytest.fixture
def precision():
    """Set `torch.set_float32_matmul_precision` for one test (the CPU reference always computes at "highest")."""
    saved = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(saved)


@pytest.fixture
def downcast():
    saved = numerics.is_downcast_64bit_enabled()
    torch.neuron.set_downcast_64bit(True)
    yield
    torch.neuron.set_downcast_64bit(saved)


def _highest(fn, *args, **kwargs):
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        return fn(*args, **kwargs)
    finally:
        torch.set_float32_matmul_precision(saved)


# Shapes where CPU's own low-precision kernels round differently from "fp32 accumulate, round once".
def _inputs(name: str, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    m, k, n, b = 17, 300, 9, 3
    return {
        "mm": (r(m, k), r(k, n)),
        "bmm": (r(b, m, k), r(b, k, n)),
        "mv": (r(m, k), r(k)),
        "dot": (r(k), r(k)),
        "vdot": (r(k), r(k)),
        "addmm": (r(m, n), r(m, k), r(k, n)),
        "baddbmm": (r(b, m, n), r(b, m, k), r(b, k, n)),
        "addbmm": (r(m, n), r(b, m, k), r(b, k, n)),
        "addmv": (r(m), r(m, k), r(k)),
        "_addmm_activation": (r(m, n), r(m, k), r(k, n)),
    }[name]


def _on(device, tensors):
    return [t.to(device) for t in tensors]


def _round_operands(name, tensors):
    rounded = list(tensors)
    for position in OPERANDS[name]:
        rounded[position] = tensors[position].bfloat16().float()
    return rounded


# --- bfloat16 / float16: float32 accumulation, one rounding --------------------------------------------------------


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("name", sorted(OPERANDS))
def test_low_precision_accumulates_in_fp32(name, dtype):
    op = getattr(torch.ops.aten, name).default
    inputs = _inputs(name, dtype)
    expected = _highest(op, *[t.float() for t in inputs]).to(dtype)
    result = op(*_on(DEVICE, inputs))
    assert result.dtype is dtype and result.device.type == DEVICE
    assert torch.equal(result.cpu(), expected)


@pytest.mark.parametrize("dtype", LOW)
def test_low_precision_differs_from_cpu_kernel_where_cpu_rounds_partials(dtype):
    """addbmm on CPU rounds each batch's product: the test above can tell the two apart."""
    inputs = _inputs("addbmm", dtype)
    assert not torch.equal(torch.addbmm(*_on(DEVICE, inputs)).cpu(), torch.addbmm(*inputs))


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("name", ["addmm", "baddbmm", "addbmm", "addmv"])
def test_low_precision_in_place(name, dtype):
    inputs = _inputs(name, dtype)
    expected = _highest(getattr(torch, name), *[t.float() for t in inputs], beta=0.5, alpha=2).to(dtype)
    self, *rest = _on(DEVICE, inputs)
    result = getattr(self, name + "_")(*rest, beta=0.5, alpha=2)
    assert result is self
    assert torch.equal(self.cpu(), expected)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("name", ["mm", "bmm", "addmm", "dot"])
def test_low_precision_out(name, dtype):
    inputs = _inputs(name, dtype)
    expected = _highest(getattr(torch, name), *[t.float() for t in inputs]).to(dtype)
    out = torch.empty(0, dtype=dtype, device=DEVICE)
    result = getattr(torch, name)(*_on(DEVICE, inputs), out=out)
    assert result is out
    assert torch.equal(out.cpu(), expected)


def test_low_precision_errors_are_torchs():
    a = torch.randn(3, 4, device=DEVICE, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.mm(a, torch.randn(4, 2, device=DEVICE))
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"):
        torch.mm(a, a)
    with pytest.raises(RuntimeError, match="Bad in-place call"):
        torch.randn(3, device=DEVICE, dtype=torch.bfloat16).addmm_(a, a.t())


def test_low_precision_matmul_gradients():
    x = torch.randn(5, 7, dtype=torch.bfloat16)
    w = torch.randn(7, 3, dtype=torch.bfloat16)
    xn, wn = x.to(DEVICE).requires_grad_(), w.to(DEVICE).requires_grad_()
    (xn @ wn).sum().backward()
    ones = torch.ones(5, 3)
    assert torch.equal(wn.grad.cpu(), _highest(torch.mm, x.float().t(), ones).bfloat16())
    assert torch.equal(xn.grad.cpu(), _highest(torch.mm, ones, w.float().t()).bfloat16())


# --- float32: set_float32_matmul_precision -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(OPERANDS))
def test_highest_is_exactly_cpu(name, precision):
    precision("highest")
    op = getattr(torch.ops.aten, name).default
    inputs = _inputs(name, torch.float32)
    assert torch.equal(op(*_on(DEVICE, inputs)).cpu(), op(*inputs))


@pytest.mark.parametrize("level", ["high", "medium"])
@pytest.mark.parametrize("name", sorted(OPERANDS))
def test_high_and_medium_round_operands_to_bf16(name, level, precision):
    op = getattr(torch.ops.aten, name).default
    inputs = _inputs(name, torch.float32)
    expected = _highest(op, *_round_operands(name, inputs))
    precision(level)
    result = op(*_on(DEVICE, inputs))
    assert result.dtype is torch.float32
    assert torch.equal(result.cpu(), expected)
    assert not torch.equal(result.cpu(), _highest(op, *inputs))


def test_medium_precision_composites(precision):
    """`linear`, `matmul` and `einsum` reach the same kernels; a bias is added unrounded."""
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(2, 6, 40, generator=g), torch.randn(5, 40, generator=g), torch.randn(5, generator=g)
    xr, wr = x.bfloat16().float(), w.bfloat16().float()
    expected = _highest(torch.nn.functional.linear, xr, wr, b)
    precision("medium")
    xn, wn, bn = _on(DEVICE, (x, w, b))
    assert torch.equal(torch.nn.functional.linear(xn, wn, bn).cpu(), expected)
    assert torch.equal((xn @ wn.t()).cpu(), _highest(torch.matmul, xr, wr.t()))
    assert torch.equal(torch.einsum("bik,jk->bij", xn, wn).cpu(), _highest(torch.einsum, "bik,jk->bij", xr, wr))


def test_medium_precision_in_place_and_out(precision):
    c, a, b = _inputs("addmm", torch.float32)
    expected = _highest(torch.addmm, c, a.bfloat16().float(), b.bfloat16().float())
    precision("medium")
    cn, an, bn = _on(DEVICE, (c, a, b))
    out = torch.empty(0, device=DEVICE)
    torch.addmm(cn, an, bn, out=out)
    assert torch.equal(out.cpu(), expected)
    cn.addmm_(an, bn)
    assert torch.equal(cn.cpu(), expected)


@pytest.fixture
def new_precision_api():
    """Lets the test set torch.backends flags (frozen once `torch.testing._internal.common_utils` is imported)."""
    with torch.backends.__allow_nonbracketed_mutation():
        saved = torch.backends.cuda.matmul.fp32_precision, torch.backends.fp32_precision
        yield
        torch.backends.cuda.matmul.fp32_precision, torch.backends.fp32_precision = saved


def test_cuda_style_precision_settings(precision, new_precision_api):
    """CUDA scripts enable TF32 with the legacy flag or the new API; neuron reads them as the fast-path request."""
    a, b = _inputs("mm", torch.float32)
    rounded = _highest(torch.mm, a.bfloat16().float(), b.bfloat16().float())
    exact = _highest(torch.mm, a, b)
    an, bn = _on(DEVICE, (a, b))
    torch.backends.cuda.matmul.allow_tf32 = True
    assert torch.equal(torch.mm(an, bn).cpu(), rounded)
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    assert torch.equal(torch.mm(an, bn).cpu(), exact)
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    assert torch.equal(torch.mm(an, bn).cpu(), rounded)
    torch.backends.cuda.matmul.fp32_precision = "none"  # unset: the generic setting decides
    torch.backends.fp32_precision = "tf32"
    assert torch.equal(torch.mm(an, bn).cpu(), rounded)
    torch.backends.fp32_precision = "ieee"
    assert torch.equal(torch.mm(an, bn).cpu(), exact)


def test_host_precision_setting_is_left_alone(precision):
    """Under "medium" the host's oneDNN runs in bf16: neuron forces IEEE only while it computes, then restores it."""
    precision("medium")
    assert torch.backends.mkldnn.matmul.fp32_precision == "bf16"
    a, b = _inputs("mm", torch.float32)
    torch.mm(*_on(DEVICE, (a, b)))
    assert torch.backends.mkldnn.matmul.fp32_precision == "bf16"


def test_other_dtypes_take_the_cpu_kernel(precision):
    precision("medium")
    a = torch.randint(-5, 5, (4, 6))
    b = torch.randint(-5, 5, (6, 3))
    assert torch.equal(torch.mm(*_on(DEVICE, (a, b))).cpu(), torch.mm(a, b))
    d = torch.randn(4, 6, dtype=torch.float64)
    assert torch.equal(torch.mm(*_on(DEVICE, (d, d.t()))).cpu(), torch.mm(d, d.t()))


# --- 64-bit types in 32 bits ---------------------------------------------------------------------------------------


def test_64bit_is_exact_by_default():
    assert not torch.neuron.is_downcast_64bit_enabled()
    a = torch.randn(100, dtype=torch.float64)
    assert torch.equal((a.to(DEVICE) * 3).sum().cpu(), (a * 3).sum())
    big = torch.tensor([2**40, 2**31], dtype=torch.int64)
    assert torch.equal((big.to(DEVICE) + 1).cpu(), big + 1)


@pytest.mark.all_wheels  # SDPA, norms and softmax run neuron-nki's kernels when it is installed
def test_float64_computes_as_float32(downcast):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(30, 40, dtype=torch.float64, generator=g), torch.randn(40, 20, dtype=torch.float64, generator=g)
    an, bn = _on(DEVICE, (a, b))
    for result, expected in [
        (an @ bn, _highest(torch.mm, a.float(), b.float())),
        ((an * 3 + 1).sum(), (a.float() * 3 + 1).sum()),
        (torch.exp(an), torch.exp(a.float())),
        (torch.softmax(an, 1), torch.softmax(a.float(), 1)),
    ]:
        assert result.dtype is torch.float64
        assert torch.equal(result.cpu(), expected.double())
    assert not torch.equal((an @ bn).cpu(), a @ b)


def test_int64_wraps_like_int32(downcast):
    x = torch.tensor([2**31 - 1, -(2**31), 2**40 + 5, 7], dtype=torch.int64)
    xn = x.to(DEVICE)
    wrapped = x.to(torch.int32)
    for result, expected in [
        (xn + 1, wrapped + 1),
        (xn * 3, wrapped * 3),
        (xn.sum(), wrapped.sum(dtype=torch.int32)),
        (xn > 0, wrapped > 0),
        (torch.arange(2**31 - 2, 2**31 + 2, device=DEVICE), torch.arange(2**31 - 2, 2**31 + 2).to(torch.int32)),
    ]:
        assert result.dtype is (torch.bool if expected.dtype is torch.bool else torch.int64)
        assert torch.equal(result.cpu(), expected.to(result.dtype))


def test_downcast_keeps_index_ops_working(downcast):
    src = torch.randn(5, 4, dtype=torch.float64)
    index = torch.tensor([[0, 1, 2, 3]] * 2)
    sn, ixn = _on(DEVICE, (src, index))
    assert torch.equal(torch.gather(sn, 0, ixn).cpu(), torch.gather(src.float(), 0, index).double())
    assert torch.equal(sn[torch.tensor([4, 0], device=DEVICE)].cpu(), src[[4, 0]].float().double())
    weights = torch.nn.functional.embedding(ixn, sn)
    assert weights.dtype is torch.float64 and torch.equal(weights.cpu(), src.float().double()[index])


def test_downcast_in_place_and_out_keep_identity_and_dtype(downcast):
    a = torch.randn(8, dtype=torch.float64)
    an = a.to(DEVICE)
    storage = an.untyped_storage().data_ptr()
    assert an.add_(1.0 / 3) is an
    assert an.dtype is torch.float64 and an.untyped_storage().data_ptr() == storage
    assert torch.equal(an.cpu(), (a.float() + 1.0 / 3).double())
    out = torch.empty(0, dtype=torch.float64, device=DEVICE)
    assert torch.mul(an, 3, out=out) is out
    assert out.shape == (8,) and torch.equal(out.cpu(), (an.cpu().float() * 3).double())


def test_downcast_updates_arguments_of_ops_that_return_nothing(downcast):
    """`_foreach_*_` ops (optimizers) write their list arguments and return None."""
    floats = [torch.randn(4, dtype=torch.float64) for _ in range(2)]
    ints = [torch.tensor([2**31 - 1, 5]), torch.tensor([-(2**31)])]
    on_device = [t.to(DEVICE) for t in floats]
    int_on_device = [t.to(DEVICE) for t in ints]
    torch._foreach_add_(on_device, 1.0 / 3)
    torch._foreach_add_(int_on_device, 1)
    for result, start in zip(on_device, floats, strict=True):
        assert result.dtype is torch.float64 and torch.equal(result.cpu(), (start.float() + 1.0 / 3).double())
    for result, start in zip(int_on_device, ints, strict=True):
        assert result.dtype is torch.int64 and torch.equal(result.cpu(), (start.to(torch.int32) + 1).long())


def test_downcast_views_share_memory(downcast):
    an = torch.randn(4, 6, dtype=torch.float64, device=DEVICE)
    view = an.t()[1:]
    view.mul_(2)
    assert view.dtype is torch.float64 and view.untyped_storage().data_ptr() == an.untyped_storage().data_ptr()


def test_downcast_respects_explicit_dtype(downcast):
    an = torch.randn(10, dtype=torch.float64, device=DEVICE)
    assert an.sum(dtype=torch.float32).dtype is torch.float32
    assert torch.randn(3, dtype=torch.float64, device=DEVICE).dtype is torch.float64


def test_set_downcast_64bit_rejects_non_bool():
    with pytest.raises(TypeError, match="expects a bool"):
        torch.neuron.set_downcast_64bit("yes")


def test_downcast_env_var(python):
    code = (
        "import torch; print(torch.neuron.is_downcast_64bit_enabled()); "
        "x = torch.tensor([2**31 - 1], device='neuron'); print((x + 1).item())"
    )
    result = python(code, env={numerics.DOWNCAST_64BIT_ENV: "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", str(-(2**31))]
    result = python(code, env={numerics.DOWNCAST_64BIT_ENV: "maybe"})
    assert result.returncode != 0
    assert "TORCH_NEURONX_DOWNCAST_64BIT='maybe'" in result.stderr
