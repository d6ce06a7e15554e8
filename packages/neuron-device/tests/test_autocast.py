"""`torch.autocast("neuron")` and `torch.amp.GradScaler("neuron")`.

The op lists are upstream's (`AutocastTestLists`, built for CUDA) instantiated on `neuron`, checked the way upstream
`test_cuda.py` does (`TestAutocast._run_autocast_outofplace`): the output dtype is the policy's, the `torch.*` and
`Tensor.*` variants agree, and the result equals the same op run without autocast on inputs cast by hand.
"""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
from torch.testing._internal import autocast_test_lists as upstream

from neuron_device import autocast

DEVICE = "neuron"
LOW = (torch.bfloat16, torch.float16)

# Entries of upstream's lists that cannot apply to `neuron`, with the reason.
NOT_APPLICABLE = {
    "cudnn_convolution": "cuDNN-only op",
    "cudnn_convolution_transpose": "cuDNN-only op",
    "einsum": "upstream's entry passes the equation as the op's arguments; einsum is tested below instead",
}


def _lists() -> upstream.AutocastTestLists:
    torch.manual_seed(0)
    return upstream.AutocastTestLists(torch.device(DEVICE))


LISTS = _lists()


# Upstream's checker. torch's TestCase wraps the method it is constructed for, so name one the tests never call.
RUNNER = upstream.TestAutocast(methodName="countTestCases")


def _entries(list_name: str):
    params = []
    for index, entry in enumerate(getattr(LISTS, list_name)):
        name = entry[0]
        if name in NOT_APPLICABLE:
            continue
        params.append(pytest.param(entry, id=f"{name}-{index}"))
    return params


def _run(entry, run_as_type, module, amp_dtype, out_type=None):
    op, args, kwargs = RUNNER.args_maybe_kwargs(entry)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation warnings of chain_matmul, cross without dim
        RUNNER._run_autocast_outofplace(
            op, args, run_as_type, DEVICE, out_type=out_type, module=module, add_kwargs=kwargs, amp_dtype=amp_dtype
        )


# --- upstream lists ----------------------------------------------------------------------------------------------


# Each list's namespace of ops (None: `Tensor` methods). Lower-precision lists run in the autocast dtype under
# either amp dtype; fp32 lists run in float32 under bfloat16 autocast.
LOWER_PRECISION_LISTS = {"torch_fp16": torch, "nn_fp16": torch._C._nn, "linalg_fp16": torch._C._linalg,
                         "methods_fp16": None}
FP32_LISTS = {"torch_fp32": torch, "nn_fp32": torch._C._nn, "methods_fp32": None}
EXPECT_BUILTIN_PROMOTE_LISTS = {"torch_expect_builtin_promote": torch, "methods_expect_builtin_promote": None}


def _entries_of(lists: dict) -> list:
    """`(module, entry)` parameters over several lists, each id prefixed with its list's name."""
    return [pytest.param(module, *p.values, id=f"{list_name}-{p.id}")
            for list_name, module in lists.items() for p in _entries(list_name)]


@pytest.mark.parametrize("amp_dtype", LOW)
@pytest.mark.parametrize(("module", "entry"), _entries_of(LOWER_PRECISION_LISTS))
def test_lower_precision(module, entry, amp_dtype):
    _run(entry, amp_dtype, module, amp_dtype)


@pytest.mark.parametrize(("module", "entry"), _entries_of(FP32_LISTS))
def test_fp32(module, entry):
    _run(entry, torch.float32, module, torch.bfloat16)


@pytest.mark.parametrize("amp_dtype", LOW)
@pytest.mark.parametrize("entry", _entries("torch_need_autocast_promote"))
def test_torch_need_autocast_promote(entry, amp_dtype):
    _run(entry, torch.float32, torch, amp_dtype)


@pytest.mark.parametrize(("module", "entry"), _entries_of(EXPECT_BUILTIN_PROMOTE_LISTS))
def test_expect_builtin_promote(module, entry):
    op, args, out_type = entry
    _run((op, args), torch.float32, module, torch.bfloat16, out_type=out_type)


@pytest.mark.parametrize("entry", LISTS.banned, ids=[e[0] for e in LISTS.banned])
def test_banned(entry):
    op, args, module = entry
    with torch.autocast(DEVICE), pytest.raises(RuntimeError, match="unsafe to autocast"):
        getattr(module, op)(*args)


# --- the policy table and defaults -------------------------------------------------------------------------------


def test_policies_are_cudas():
    """Every op torch registers a CUDA autocast policy for has the same kind of policy on neuron (cuDNN ops aside)."""
    cuda = {
        name
        for name in torch._C._dispatch_get_all_op_names()
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, "AutocastCUDA") and "cudnn" not in name
    }
    assert set(autocast.policies()) == cuda
    neuron = {
        name
        for name in torch._C._dispatch_get_all_op_names()
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, "AutocastPrivateUse1")
    }
    assert neuron == cuda


def test_default_dtype_is_bfloat16():
    assert torch.get_autocast_dtype(DEVICE) is torch.bfloat16
    a = torch.randn(4, 4, device=DEVICE)
    with torch.autocast(DEVICE):
        assert torch.is_autocast_enabled(DEVICE)
        assert (a @ a).dtype is torch.bfloat16
    assert not torch.is_autocast_enabled(DEVICE)


def test_float16_allowed():
    a = torch.randn(4, 4, device=DEVICE)
    with torch.autocast(DEVICE, dtype=torch.float16):
        assert (a @ a).dtype is torch.float16


def test_unsupported_dtype_warns_and_disables():
    a = torch.randn(4, 4, device=DEVICE)
    with pytest.warns(UserWarning, match="neuron Autocast only supports"), torch.autocast(DEVICE, dtype=torch.float64):
        assert (a @ a).dtype is torch.float32


def test_ops_without_policy_pass_through():
    """The fallthrough: ops outside the lists keep their input dtypes, views work, CPU tensors are untouched."""
    a = torch.randn(4, 4, device=DEVICE)
    h = torch.randn(4, device=DEVICE, dtype=torch.float16)
    with torch.autocast(DEVICE):
        assert torch.relu(a).dtype is torch.float32
        assert (h + h).dtype is torch.float16
        assert a.view(16).t().dtype is torch.float32
        assert torch.mm(a.cpu(), a.cpu()).dtype is torch.float32


def test_float64_is_not_cast():
    d = torch.randn(4, 4, device=DEVICE, dtype=torch.float64)
    with torch.autocast(DEVICE):
        assert (d @ d).dtype is torch.float64
        assert torch.exp(d).dtype is torch.float64


@pytest.mark.all_wheels  # SDPA, norms and softmax run neuron-nki's kernels when it is installed
def test_explicit_dtype_is_respected():
    h = torch.randn(8, device=DEVICE, dtype=torch.float16)
    with torch.autocast(DEVICE):
        assert torch.softmax(h, 0).dtype is torch.float32
        assert torch.softmax(h, 0, dtype=torch.float16).dtype is torch.float16
        assert h.sum(dtype=torch.float16).dtype is torch.float16
        assert torch.norm(h).dtype is torch.float32


def test_einsum():
    x, y = torch.randn(2, 3, 4, device=DEVICE), torch.randn(2, 4, 5, device=DEVICE)
    with torch.autocast(DEVICE):
        out = torch.einsum("bij,bjk->bik", x, y)
    assert out.dtype is torch.bfloat16
    assert torch.equal(out, torch.einsum("bij,bjk->bik", x.bfloat16(), y.bfloat16()))


@pytest.mark.all_wheels  # SDPA, norms and softmax run neuron-nki's kernels when it is installed
@pytest.mark.parametrize("amp_dtype", LOW)
def test_scaled_dot_product_attention(amp_dtype):
    """Not in upstream's lists, but in CUDA's lower-precision policy: attention runs in the autocast dtype."""
    q, k, v = (torch.randn(2, 3, 5, 8, device=DEVICE) for _ in range(3))
    with torch.autocast(DEVICE, dtype=amp_dtype):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.dtype is amp_dtype
    control = torch.nn.functional.scaled_dot_product_attention(q.to(amp_dtype), k.to(amp_dtype), v.to(amp_dtype),
                                                               is_causal=True)
    assert torch.equal(out, control)


def test_nested_regions_and_disable():
    a = torch.randn(4, 4, device=DEVICE)
    with torch.autocast(DEVICE):
        with torch.autocast(DEVICE, enabled=False):
            assert (a @ a).dtype is torch.float32
        with torch.autocast(DEVICE, dtype=torch.float16):
            assert (a @ a).dtype is torch.float16
        assert (a @ a).dtype is torch.bfloat16


def test_cpu_autocast_does_not_touch_neuron():
    a = torch.randn(4, 4, device=DEVICE)
    with torch.autocast("cpu"):
        assert (a @ a).dtype is torch.float32


def test_other_threads_need_their_own_region():
    a = torch.randn(4, 4, device=DEVICE)
    seen = []

    def work():
        seen.append((a @ a).dtype)

    with torch.autocast(DEVICE):
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    assert seen == [torch.float32]


# --- gradients and the weight cache ------------------------------------------------------------------------------


def test_gradients_flow_through_casts():
    torch.manual_seed(0)
    x = torch.randn(4, 8, device=DEVICE)
    w = torch.randn(8, 3, device=DEVICE, requires_grad=True)
    with torch.autocast(DEVICE):
        loss = torch.log_softmax(x @ w, 1).sum()
    loss.backward()
    assert w.grad.dtype is torch.float32

    control = w.detach().clone().requires_grad_()
    torch.log_softmax((x.bfloat16() @ control.bfloat16()).float(), 1).sum().backward()
    assert torch.equal(w.grad, control.grad)


def _weight_cast_node(out: torch.Tensor):
    """The autograd node of the cast of `out`'s second mm operand."""
    return out.grad_fn.next_functions[1][0]


def test_weight_cast_is_cached_within_a_region():
    x = torch.randn(4, 4, device=DEVICE)
    w = torch.randn(4, 4, device=DEVICE, requires_grad=True)
    with torch.autocast(DEVICE):
        first, second = torch.mm(x, w), torch.mm(x, w)
    assert _weight_cast_node(first) is _weight_cast_node(second)
    with torch.autocast(DEVICE):
        third = torch.mm(x, w)
    assert _weight_cast_node(third) is not _weight_cast_node(first)  # cleared on leaving the outermost region


def test_weight_cache_can_be_disabled():
    x = torch.randn(4, 4, device=DEVICE)
    w = torch.randn(4, 4, device=DEVICE, requires_grad=True)
    with torch.autocast(DEVICE, cache_enabled=False):
        first, second = torch.mm(x, w), torch.mm(x, w)
    assert _weight_cast_node(first) is not _weight_cast_node(second)


def test_activations_are_not_cached():
    x = torch.randn(4, 4, device=DEVICE, requires_grad=True)
    h = x * 2  # not a leaf
    with torch.autocast(DEVICE):
        first, second = torch.mm(h, h), torch.mm(h, h)
    assert _weight_cast_node(first) is not _weight_cast_node(second)


# --- GradScaler --------------------------------------------------------------------------------------------------


def _train(device: str, dtype: torch.dtype, steps: int = 6):
    """A small MLP trained with autocast + GradScaler; step 2 sees an inf input, so it must be skipped."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**8, growth_interval=2)
    data = torch.Generator().manual_seed(1)
    scales, losses = [], []
    for step in range(steps):
        x, y = torch.randn(32, 8, generator=data), torch.randn(32, 4, generator=data)
        if step == 2:
            x[0, 0] = float("inf")
        x, y = x.to(device), y.to(device)
        with torch.autocast(device, dtype=dtype):
            out = model(x)
            loss = torch.nn.functional.mse_loss(out, y)
        assert out.dtype is dtype and loss.dtype is torch.float32
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
        losses.append(loss.item())
    return [p.detach().cpu() for p in model.parameters()], scales, losses


@pytest.mark.parametrize("dtype", LOW)
def test_grad_scaler_training_matches_cpu(dtype):
    params, scales, losses = _train(DEVICE, dtype)
    cpu_params, cpu_scales, cpu_losses = _train("cpu", dtype)
    assert scales == cpu_scales == [256.0, 512.0, 256.0, 256.0, 512.0, 512.0]  # growth, inf skip, growth
    torch.testing.assert_close(losses, cpu_losses, equal_nan=True)
    for param, cpu_param in zip(params, cpu_params, strict=True):
        assert param.isfinite().all()
        torch.testing.assert_close(param, cpu_param)


def test_torch_neuron_amp_is_torch_cuda_amp_for_neuron():
    """`torch.neuron.amp` (what `torch.cuda.amp` code becomes after s/cuda/neuron/): deprecated like its twin, and
    the same regions and scaler as `torch.amp` with device "neuron"."""
    from torch.neuron.amp import GradScaler, custom_bwd, custom_fwd

    a, b = (torch.randn(4, 4, device="neuron") for _ in range(2))
    with pytest.warns(FutureWarning, match=r"torch\.amp\.autocast\('neuron', args\.\.\.\)"):
        region = torch.neuron.amp.autocast()
    with region:
        assert (a @ b).dtype is torch.bfloat16  # the device's autocast dtype, as torch.cuda.amp takes CUDA's
    with pytest.warns(FutureWarning), torch.neuron.amp.autocast(dtype=torch.float16):
        assert (a @ b).dtype is torch.float16

    class Square(torch.autograd.Function):
        @staticmethod
        @custom_fwd(cast_inputs=torch.float32)
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        @custom_bwd
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return 2 * x * grad

    x = torch.ones(3, device="neuron", dtype=torch.bfloat16, requires_grad=True)
    with torch.amp.autocast("neuron"):
        y = Square.apply(x)
    assert y.dtype is torch.float32
    y.sum().backward()
    assert x.grad.dtype is torch.bfloat16 and x.grad.cpu().eq(2).all()

    with pytest.warns(FutureWarning, match=r"torch\.amp\.GradScaler\('neuron'"):
        scaler = GradScaler(init_scale=4.0)
    weight = torch.nn.Parameter(torch.ones(2, device="neuron"))
    optimizer = torch.optim.SGD([weight], lr=0.5)
    scaler.scale((weight * 3).sum()).backward()
    scaler.step(optimizer)
    scaler.update()
    assert weight.grad.cpu().eq(3).all() and weight.detach().cpu().eq(-0.5).all()  # scaled by 4, unscaled for the step
