"""The NKI kernel library as the native ``neuron`` implementation of aten ops (registered by ``plugin``).

Direct ``neuron`` kernels (PrivateUse1), each running its NKI kernel when the inputs are inside the kernel's
supported shapes/dtypes and otherwise the ordinary implementation (the CPU kernel on host aliases, or the op's own
decomposition), so an unsupported input is never computed wrongly:

* ``_scaled_dot_product_flash_attention_for_cpu`` (+ ``_backward``): flash attention, causal/GQA, no mask/dropout;
* ``_fused_rms_norm`` (+ ``_backward``, which has no CPU kernel at all), ``native_layer_norm`` (+ ``_backward``),
  ``_softmax`` (+ ``_softmax_backward_data``) over the last dim.

Composite ops reach those fused ops above autograd (AutogradPrivateUse1), so autograd uses the fused ops'
derivative formulas: neuron-device already sends ``scaled_dot_product_attention`` to the fused op
(``_scaled_dot_product_fused_attention_overrideable``, whose kernels run the flash op) wherever CPU's
``use_flash_attention_cpp`` would (``neuron_device.ops.attention``), and here ``rms_norm`` takes
``_fused_rms_norm`` when the NKI kernel supports the input. ``aten::mm`` is left to neuron-device: its matmul kernel is already a native
Tensor-engine kernel with the numerics policy, so an NKI replacement would not change the estimate (``nki.library.
matmul`` is available to ``nki_op`` users and compiled graphs).

How the kernels execute is set by ``NEURON_NKI_NATIVE_KERNELS``:

* ``1`` (default), *estimate*: the instruction simulator runs each kernel once per call signature (shapes, strides,
  dtypes, scalars), on that call's real inputs, to learn its simulated latency and to check its outputs against the
  host computation (a disagreement warns). Every call's values come from the host computation (torch's CPU kernel of
  the same op), and its device time is the kernel's simulated latency. Simulating every call would make eager and
  compiled models tens of times slower than the CPU (the simulator interprets each NKI instruction in NumPy), and
  the latency of these kernels depends only on the signature. Plan mode (``neuron-plan``), which runs eager ops on
  fake tensors, charges the same latency through the flash kernels' ``estimate_seconds``, which reuses eager's
  launches or simulates the signature once on sample data (``_estimate``; a long sequence from small samples,
  exactly: ``attention_estimate``). Compiled graphs keep Inductor's code for
  these ops and price attention as a compiler lowers it (neuron-compile's ``passes.attention_work``).
* ``simulate``: every call runs the kernel in the instruction simulator and returns its outputs (the kernel's own
  numerics; use it to test kernels).
* ``0``: the kernels are not registered; the ops run as neuron-device's CPU-fallback ops.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from typing import Any

import torch

from neuron_device import services
from neuron_device.services import host_alias, run_on_host
from neuron_spec.env import parse_bool

from .. import envvars
from .adapter import dry_run, launch, record_launch, record_launches, signature

__all__ = ["ENV", "MAX_HEAD_DIM", "MAX_ROW", "register"]

ENV = envvars.NATIVE_KERNELS.name
MAX_HEAD_DIM = 128  # one partition tile of the head dim
MAX_ROW = 8192  # elements per row the norm/softmax kernels keep in SBUF per tile (fp32 working copies)
_FLOATS = (torch.float32, torch.bfloat16)
_aten = torch.ops.aten


def _run(module: str, kernel: str, grid: Any, *args: Any) -> Any:
    """Launch ``nki.library.<module>.<kernel>`` on neuron tensors (imported on first use)."""
    import importlib

    k = getattr(importlib.import_module(f"nki.library.{module}"), kernel)
    return launch(k, grid, args, {}, name=f"nki::{kernel}")


SIMULATE = "simulate"
_estimates: dict[tuple, list[Any]] = {}  # (host function, call signature) -> the kernel launches one call made
_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2}


_modes: dict[str | None, str] = {}  # the variable's text as set (None: unset) -> its mode


def _mode() -> str:
    """``simulate``, ``1`` (on) or ``0`` (off); on and off in any spelling of a boolean. Read at every call (tests
    and users switch it at run time), parsed once per text: each native kernel call asks."""
    raw = envvars.NATIVE_KERNELS.raw()
    mode = _modes.get(raw)
    if mode is None:
        text = envvars.NATIVE_KERNELS.read().lower()
        mode = _modes[raw] = SIMULATE if text == SIMULATE else "1" if parse_bool(ENV, text) else "0"
    return mode


def _native(nki_call: Callable[[], Any], host_fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """One call of a native kernel: ``nki_call()`` runs the NKI kernel; ``host_fn(*args, **kwargs)`` on CPU tensors
    computes the same outputs. Which one's values are returned, and when the simulator runs: see the module doc."""
    if _mode() == SIMULATE:
        return nki_call()
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    result = _on_host(host_fn, device, args, kwargs)
    key = (host_fn, signature(args, kwargs))
    known = _estimates.get(key)
    if known is None:
        with record_launches() as launches:
            simulated = nki_call()
        _check_agreement(launches, simulated, result)
        _estimates[key] = list(launches)
    else:
        for launch in known:
            record_launch(launch, device)
    return result


# Seconds estimated without eager, by (op name, call signature, `_machine()`): a memo of neuron-device's, which a
# planned rank hands back to neuron-plan's zygote, so the ranks forked after it (a search's other configurations)
# do not simulate the signature again (0.2 to 1.8 s each at a 70B model's sizes).
DRY_ESTIMATES = "nki.torch.native.dry_estimates"


def _machine() -> tuple:
    """What a dry run's latency depends on beyond the call: the target and logical-core size the environment
    selects (the samples are CPU tensors, `_targets`), and neuron-nki's variables."""
    from .._targets import current_lnc, current_target

    target = current_target()
    return target.name, current_lnc(target), tuple(variable.read() for variable in envvars.VARIABLES)


def _estimate(launch: Callable, host_fn: Callable, args: tuple, kwargs: dict,
              dry_seconds: Callable[[Callable, tuple, dict], float] | None = None) -> float | None:
    """Simulated seconds of one call of a native kernel on arguments like ``args`` (fake tensors will do), for plan
    mode to charge what eager charges for the same call (``estimate_seconds``).

    The launches eager mode recorded for the signature are reused. Otherwise ``dry_seconds(launch, args, kwargs)``
    (default `_dry_seconds`: the kernel on sample data of the call's shapes) estimates it once per signature.
    ``None`` in simulate mode, where compiled graphs substitute the kernel itself and it charges its own time."""
    if _mode() == SIMULATE:
        return None
    call = signature(args, kwargs)
    launches = _estimates.get((host_fn, call))
    if launches is not None:
        return sum(record.latency_ns for record in launches) * 1e-9
    estimates = services.memo(DRY_ESTIMATES)
    key = (host_fn.name(), call, _machine())
    seconds = estimates.get(key)
    if seconds is None:
        seconds = estimates[key] = (dry_seconds or _dry_seconds)(launch, args, kwargs)
    return seconds


def _dry_seconds(launch: Callable, args: tuple, kwargs: dict) -> float:
    """``launch`` run once on CPU sample tensors of the arguments' shapes, strides and dtypes, as a dry run: logged
    nowhere, charged to no device, allocating no device memory (the latency depends only on the signature)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), dry_run() as launches:  # real data, even while a graph compiles
        samples = _sample_arguments((args, kwargs))
        launch(*samples[0], **samples[1])
    return sum(record.latency_ns for record in launches) * 1e-9


def _sample_arguments(values: Any) -> Any:
    """``values`` with each tensor replaced by a CPU tensor of its shape, strides and dtype, of standard normal
    values."""
    generator = torch.Generator().manual_seed(0)

    def sample(v: Any) -> Any:
        if isinstance(v, torch.Tensor):  # filled through its whole storage: an expanded view overlaps itself
            t = torch.empty_strided(tuple(v.shape), v.stride(), dtype=v.dtype)
            torch.empty(0, dtype=v.dtype).set_(t.untyped_storage()).normal_(generator=generator)
            return t
        if isinstance(v, (tuple, list)):
            return type(v)(sample(x) for x in v)
        if isinstance(v, dict):
            return {k: sample(x) for k, x in v.items()}
        return v

    return sample(values)


def _host_form(value: Any) -> Any:
    return host_alias(value) if isinstance(value, torch.Tensor) and value.device.type == "neuron" else value


def _on_host(fn: Callable, device: torch.device, args: tuple, kwargs: dict) -> Any:
    """``fn`` on host aliases of the ``neuron`` arguments, its tensor results adopted by ``device`` (not charged:
    the caller charges the kernel's latency instead)."""
    result = fn(*[_host_form(a) for a in args], **{k: _host_form(v) for k, v in kwargs.items()})
    if isinstance(result, torch.Tensor):
        return services.adopt_tracked(result, device.index)
    return tuple(services.adopt_tracked(r, device.index) if isinstance(r, torch.Tensor) else r for r in result)


def _check_agreement(launches: list[Any], simulated: Any, result: Any) -> None:
    """Warn when the simulated kernel's outputs differ from the host computation returned in its place.

    Compared with `torch.allclose`, not `torch.testing.assert_close`: the latter imports torch.distributed.tensor
    (and sympy with it), about 40 MB of modules a model that never uses them would carry from its first NKI call.
    """
    pairs = [(simulated, result)] if isinstance(result, torch.Tensor) else list(zip(simulated, result, strict=True))
    for got, expected in pairs:
        if got is None and expected is None:
            continue
        rtol = _TOLERANCE.get(expected.dtype, 1e-4)
        got, expected = host_alias(got).float(), host_alias(expected).float()
        atol = rtol * max(1.0, expected.abs().nan_to_num().max().item()) if expected.numel() else rtol
        if got.shape != expected.shape:
            detail = f"shape {tuple(got.shape)} != {tuple(expected.shape)}"
        elif torch.allclose(got, expected, rtol=rtol, atol=atol, equal_nan=True):
            continue
        else:
            detail = f"greatest absolute difference {(got - expected).abs().nan_to_num(nan=float('inf')).max().item():.3g}"
        names = ", ".join(sorted({launch.name for launch in launches}))
        warnings.warn(f"NKI kernel {names} disagrees with torch's CPU kernel of the same op on this input; the CPU "
                      f"result is used ({ENV}={SIMULATE} uses the kernel's): {detail} (allowed {atol:.3g} + "
                      f"{rtol:.3g} x |expected|)", RuntimeWarning, stacklevel=4)
        return


def _host(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    return run_on_host(op, *args, **kwargs)


_ANY_DEVICE = None  # what a compiled graph's tensors are checked with: host copies of the neuron graph's


def _uniform(*tensors: torch.Tensor | None, device_type: str | None = "neuron") -> bool:
    """Non-empty tensors of one device (of `device_type`, if not `_ANY_DEVICE`) and one supported float dtype (None
    entries ignored). The first tensor's device and dtype read once: every native kernel call checks its tensors
    here, right after a kernel that evicted the host's caches."""
    present = [t for t in tensors if t is not None]
    first = present[0]
    device, dtype = first.device, first.dtype
    if device_type not in (None, device.type) or dtype not in _FLOATS:
        return False
    for t in present:
        if t.device != device or t.dtype != dtype or t.numel() <= 0:
            return False
    return True


# -- attention ------------------------------------------------------------------------------------------------------
def _attention_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, attn_mask: Any,
                         device_type: str | None = "neuron") -> bool:
    if attn_mask is not None or dropout_p != 0.0 or not _uniform(q, k, v, device_type=device_type):
        return False
    qs, ks, vs = q.shape, k.shape, v.shape
    return (len(qs) == len(ks) == len(vs) == 4 and qs[3] == ks[3] == vs[3] <= MAX_HEAD_DIM
            and qs[0] == ks[0] == vs[0] and ks[:3] == vs[:3] and qs[1] % ks[1] == 0)


def _attention_seconds(launch: Callable, args: tuple, kwargs: dict, **layout: Any) -> float:
    """A flash kernel's latency at the call's size from small simulations (`attention_estimate`)."""
    from .attention_estimate import attention_seconds

    return attention_seconds(launch, args, kwargs, _dry_seconds, **layout)


_FLASH_FWD = _aten._scaled_dot_product_flash_attention_for_cpu.default
_FLASH_BWD = _aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _flash_fwd_launch(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    """The NKI flash-attention forward on tensors the kernel supports (``_attention_supported``)."""
    B, H = query.shape[:2]
    s = scale if scale is not None else 1.0 / math.sqrt(query.size(-1))
    # torch's CPU kernel (and its meta function) lays out: out like the query ([B, S, H, d] memory for a transposed
    # query, else contiguous), logsumexp always [B, S, H] memory. Same layouts here, so compiled graphs' stride
    # checks hold.
    bshd = query.transpose(1, 2).is_contiguous() and not query.is_contiguous()
    out, lse = _run("attention", "flash_attention_fwd", (B, H), query.transpose(-1, -2), key.transpose(-1, -2),
                    value, s, bool(is_causal), 0, bshd)
    return (out.transpose(1, 2) if bshd else out), lse.view(lse.shape[:3]).permute(0, 2, 1)


def _flash_fwd(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    if not _attention_supported(query, key, value, dropout_p, attn_mask):
        return _host(_FLASH_FWD, query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
    nki = functools.partial(_flash_fwd_launch, query, key, value, dropout_p, is_causal, scale=scale)
    return _native(nki, _FLASH_FWD, query, key, value, dropout_p, is_causal, scale=scale)


def _flash_fwd_seconds(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    if not _attention_supported(query, key, value, dropout_p, attn_mask, _ANY_DEVICE):
        return None
    return _estimate(_flash_fwd_launch, _FLASH_FWD, (query, key, value, dropout_p, is_causal), {"scale": scale},
                     functools.partial(_attention_seconds, query_at=0, grid_over_kv_heads=False))


def _flash_bwd_supported(grad_out, query, key, value, out, logsumexp, dropout_p, attn_mask,
                         device_type: str | None = "neuron") -> bool:
    return (_attention_supported(query, key, value, dropout_p, attn_mask, device_type)
            and _uniform(grad_out, out, query, device_type=device_type) and logsumexp.dtype == torch.float32)


def _flash_bwd_launch(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask=None,
                      scale=None):
    """The NKI flash-attention backward on tensors the kernel supports (``_flash_bwd_supported``)."""
    B, Hkv = key.shape[:2]
    s = scale if scale is not None else 1.0 / math.sqrt(query.size(-1))
    grads = _run("attention", "flash_attention_bwd", (B, Hkv), query, query.transpose(-1, -2), key,
                 key.transpose(-1, -2), value.transpose(-1, -2), out, grad_out, grad_out.transpose(-1, -2),
                 logsumexp.unsqueeze(-1), s, bool(is_causal), 0, True)
    return tuple(g.transpose(1, 2) for g in grads)  # [B, S, heads, d] memory, as torch's CPU kernel


def _flash_bwd(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask=None, scale=None):
    args = (grad_out, query, key, value, out, logsumexp, dropout_p, is_causal)
    if not _flash_bwd_supported(*args[:7], attn_mask):
        return _host(_FLASH_BWD, *args, attn_mask=attn_mask, scale=scale)
    return _native(functools.partial(_flash_bwd_launch, *args, scale=scale), _FLASH_BWD, *args, scale=scale)


def _flash_bwd_seconds(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask=None,
                       scale=None):
    args = (grad_out, query, key, value, out, logsumexp, dropout_p, is_causal)
    if not _flash_bwd_supported(*args[:7], attn_mask, _ANY_DEVICE):
        return None
    return _estimate(_flash_bwd_launch, _FLASH_BWD, args, {"scale": scale},
                     functools.partial(_attention_seconds, query_at=1, grid_over_kv_heads=True))


_flash_fwd.estimate_seconds = _flash_fwd_seconds
_flash_bwd.estimate_seconds = _flash_bwd_seconds


# -- normalisation and softmax ---------------------------------------------------------------------------------------
def _rows(x: torch.Tensor, normalized_shape) -> tuple[int, int]:
    d = math.prod(normalized_shape)
    return x.numel() // d, d


def _norm_supported(x: torch.Tensor, normalized_shape, *params: torch.Tensor | None) -> bool:
    n = len(normalized_shape)
    return (_uniform(x, *params) and 0 < n <= x.dim() and tuple(x.shape[x.dim() - n:]) == tuple(normalized_shape)
            and 0 < math.prod(normalized_shape) <= MAX_ROW
            and all(p is None or tuple(p.shape) == tuple(normalized_shape) for p in params))


def _stat_shape(x: torch.Tensor, normalized_shape) -> tuple[int, ...]:
    return tuple(x.shape[:x.dim() - len(normalized_shape)]) + (1,) * len(normalized_shape)


def _ones(n: int, like: torch.Tensor) -> torch.Tensor:
    return torch.ones(n, dtype=like.dtype, device=like.device)


def _rms_eps(x: torch.Tensor, eps: float | None) -> float:
    return torch.finfo(x.dtype).eps if eps is None else float(eps)


_RMS_NORM = _aten._fused_rms_norm.default.decompose  # no CPU kernel: its decomposition is what CPU runs


def _fused_rms_norm(input, normalized_shape, weight=None, eps=None):
    if not _norm_supported(input, normalized_shape, weight):
        return _RMS_NORM(input, normalized_shape, weight, eps)

    def nki() -> tuple[torch.Tensor, torch.Tensor]:
        n, d = _rows(input, normalized_shape)
        w = weight.reshape(d) if weight is not None else _ones(d, input)
        out, rstd = _run("norms", "rmsnorm_fwd", (), input.reshape(n, d), w, _rms_eps(input, eps))
        return out.view(input.shape), rstd.view(_stat_shape(input, normalized_shape))

    return _native(nki, _RMS_NORM, input, normalized_shape, weight, eps)


def _fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight, output_mask):
    if not (_norm_supported(input, normalized_shape, weight) and _uniform(grad_out, input)
            and rstd.dtype == torch.float32):
        return _rms_norm_backward_formula(grad_out, input, normalized_shape, rstd, weight, output_mask)

    def nki() -> tuple[torch.Tensor | None, torch.Tensor | None]:
        n, d = _rows(input, normalized_shape)
        w = weight.reshape(d) if weight is not None else _ones(d, input)
        dx, dw = _run("norms", "rmsnorm_bwd", (), grad_out.reshape(n, d), input.reshape(n, d),
                      rstd.reshape(n, 1), w)
        return (dx.view(input.shape) if output_mask[0] else None,
                dw.view(weight.shape) if output_mask[1] and weight is not None else None)

    return _native(nki, _rms_norm_backward_formula, grad_out, input, normalized_shape, rstd, weight, output_mask)


def _rms_norm_backward_formula(grad_out, input, normalized_shape, rstd, weight, output_mask):
    """`_fused_rms_norm_backward` with ordinary ops: no CPU kernel exists for it."""
    dims = tuple(range(input.dim() - len(normalized_shape), input.dim()))
    x, g, r = input.float(), grad_out.float(), rstd.float()
    xhat = x * r
    gw = g * weight.float() if weight is not None else g
    dx = r * (gw - xhat * (gw * xhat).mean(dims, keepdim=True))
    dw = (g * xhat).sum(tuple(range(input.dim() - len(normalized_shape)))) if weight is not None else None
    return (dx.to(input.dtype) if output_mask[0] else None,
            dw.to(weight.dtype) if output_mask[1] and dw is not None else None)


def _rms_norm_route(input, normalized_shape, weight=None, eps=None):
    if _norm_supported(input, normalized_shape, weight):
        return _aten._fused_rms_norm(input, normalized_shape, weight, eps)[0]
    return _aten.rms_norm.default.decompose(input, normalized_shape, weight, eps)


_LAYER_NORM = _aten.native_layer_norm.default
_LAYER_NORM_BWD = _aten.native_layer_norm_backward.default


def _layer_norm(input, normalized_shape, weight, bias, eps):
    if not _norm_supported(input, normalized_shape, weight, bias):
        return _host(_LAYER_NORM, input, normalized_shape, weight, bias, eps)

    def nki() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n, d = _rows(input, normalized_shape)
        w = weight.reshape(d) if weight is not None else _ones(d, input)
        b = bias.reshape(d) if bias is not None else torch.zeros(d, dtype=input.dtype, device=input.device)
        out, mean, rstd = _run("norms", "layernorm_fwd", (), input.reshape(n, d), w, b, float(eps))
        stat = _stat_shape(input, normalized_shape)
        return out.view(input.shape), mean.to(input.dtype).view(stat), rstd.to(input.dtype).view(stat)

    return _native(nki, _LAYER_NORM, input, normalized_shape, weight, bias, eps)


def _layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    if not (_norm_supported(input, normalized_shape, weight, bias) and _uniform(grad_out, input)):
        return _host(_LAYER_NORM_BWD, grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask)

    def nki() -> tuple[torch.Tensor | None, ...]:
        n, d = _rows(input, normalized_shape)
        w = weight.reshape(d) if weight is not None else _ones(d, input)
        dx, dw, db = _run("norms", "layernorm_bwd", (), grad_out.reshape(n, d), input.reshape(n, d),
                          mean.reshape(n, 1), rstd.reshape(n, 1), w)
        return (dx.view(input.shape) if output_mask[0] else None,
                dw.view(weight.shape) if output_mask[1] and weight is not None else None,
                db.view(bias.shape) if output_mask[2] and bias is not None else None)

    return _native(nki, _LAYER_NORM_BWD, grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask)


def _last_dim(x: torch.Tensor, dim: int) -> bool:
    return x.dim() >= 1 and dim % x.dim() == x.dim() - 1 and 0 < x.size(-1) <= MAX_ROW


_SOFTMAX = _aten._softmax.default
_SOFTMAX_BWD = _aten._softmax_backward_data.default


def _softmax(self, dim, half_to_float):
    if half_to_float or not (_uniform(self) and _last_dim(self, dim)):
        return _host(_SOFTMAX, self, dim, half_to_float)

    def nki() -> torch.Tensor:
        return _run("softmax", "softmax_fwd", (), self.reshape(-1, self.size(-1))).view(self.shape)

    return _native(nki, _SOFTMAX, self, dim, half_to_float)


def _softmax_backward(grad_output, output, dim, input_dtype):
    if input_dtype != output.dtype or not (_uniform(grad_output, output) and _last_dim(output, dim)):
        return _host(_SOFTMAX_BWD, grad_output, output, dim, input_dtype)

    def nki() -> torch.Tensor:
        d = output.size(-1)
        return _run("softmax", "softmax_bwd", (), grad_output.reshape(-1, d), output.reshape(-1, d)).view(output.shape)

    return _native(nki, _SOFTMAX_BWD, grad_output, output, dim, input_dtype)


KERNELS: dict[str, Callable] = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": _flash_fwd,
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": _flash_bwd,
    "aten::_fused_rms_norm": _fused_rms_norm,
    "aten::_fused_rms_norm_backward": _fused_rms_norm_backward,
    "aten::native_layer_norm": _layer_norm,
    "aten::native_layer_norm_backward": _layer_norm_backward,
    "aten::_softmax": _softmax,
    "aten::_softmax_backward_data": _softmax_backward,
}
ROUTES: dict[str, Callable] = {
    "aten::rms_norm": _rms_norm_route,
}


def enabled() -> bool:
    return _mode() != "0"


def substitute_in_graphs() -> bool:
    """Asked by neuron-compile when it compiles a graph: replace the ops in compiled graphs with these kernels?

    Only in ``simulate`` mode. In the default mode a kernel's values are torch's CPU kernel's anyway, and Inductor's
    own code for the op is faster than a call into this Python kernel, which would also split Inductor's fusion
    around it (the tiny Llama's steady state measured 1.37x CPU Inductor with the kernels substituted, 1.05x
    without)."""
    return _mode() == SIMULATE


def register(registry: Any) -> None:
    """Register the kernels and routes with neuron-device's op registry (the ``neuron_register`` hook)."""
    if not enabled():
        return
    with warnings.catch_warnings():
        # torch 2.13 itself puts a kernel for native_layer_norm on the PrivateUse1 key; replacing it is the point
        warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered kernel", category=UserWarning)
        for name, fn in KERNELS.items():
            fn.substitute_in_graphs = substitute_in_graphs
            registry.register(name, fn)
    for name, fn in ROUTES.items():
        registry.register(name, fn, dispatch_key="AutogradPrivateUse1")
