"""Direct `neuron` kernels for the hot functional ops: the boxed fallback's work, minus what these ops never need.

The boxed fallback (`fallback.run_on_host`) handles every op: `out=`, in-place results, generators, views of
inputs, mixed devices, 64-bit downcasting. Structured ops also reach it as their `.out` overload, after a separate
`empty` kernel call for the output. For the ops a model runs on every step (pointwise, reductions, softmax,
copies, embedding and indexing) the common call needs none of that: all tensor arguments are `neuron` tensors of
one device, and the result is a fresh tensor (or, in place, `self`). A kernel on the overload itself does exactly
that call, with the overload's record (`ops.call`) computed at registration:

* the CPU kernel runs on zero-copy host aliases of the inputs (`storage.kernel_input`: the storage's host twin itself
  for an input laid out as it, as op results are), and its fresh result is adopted as device storage (an in-place op
  writes device memory through the alias and returns `self`);
* it is charged by the op ledger (`simulation.ledger`) as the fallback is, in the cache of its record (one dict
  lookup per call);
* anything outside the common call (a CPU tensor, two devices, 64-bit downcasting, a Python number where the
  schema has a Tensor) goes to `run_on_host` unchanged, so results and errors are the fallback's.

The kernels are installed last (after plugins) and only on overloads that have no direct kernel yet, so a plugin's
kernel (e.g. neuron-nki's softmax) keeps precedence.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import allocator
from .. import numerics as _numerics
from ..barrier import flush_barrier
from ..fallback import run_on_host
from ..simulation import ledger as _ledger
from ..storage import adopt, kernel_input
from . import registry
from .call import OverloadRecord, overload_record, records, walk

__all__ = ["HOT_OPS", "Record", "install", "run_direct", "run_record", "set_recorder"]

_Tensor = torch.Tensor

# Op packets of the hot path (issue 4): every functional overload of each gets a direct kernel.
HOT_OPS: tuple[str, ...] = (
    # pointwise
    "add", "sub", "rsub", "mul", "div", "pow", "neg", "exp", "log", "sqrt", "rsqrt", "reciprocal", "abs", "sigmoid",
    "tanh", "silu", "gelu", "relu", "erf", "sin", "cos", "maximum", "minimum", "clamp", "clamp_min", "clamp_max",
    "where", "masked_fill", "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "lerp", "addcmul", "addcdiv",
    "threshold_backward", "gelu_backward", "sigmoid_backward", "tanh_backward", "fill_", "zero_", "add_", "sub_",
    "mul_", "div_", "addcmul_", "addcdiv_", "lerp_", "sqrt_", "clamp_", "masked_fill_",
    # reductions
    "sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "prod", "var", "std", "var_mean",
    "linalg_vector_norm", "logsumexp", "cumsum", "all", "any",
    # softmax, norms, losses
    "_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data", "native_layer_norm_backward",
    "_fused_rms_norm", "nll_loss_forward", "nll_loss_backward", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    # copies, gather, embedding
    "clone", "cat", "index", "index_select", "gather", "embedding", "embedding_dense_backward", "tril", "triu",
)


def _adopt(result, host: list, args: tuple, positions: tuple[int, ...], index: int):
    """The `neuron` form of a host result: an input's own tensor if the kernel returned its alias (in-place ops
    return `self`), else the fresh result adopted as device storage."""
    if type(result) is tuple or type(result) is list:
        return type(result)(_adopt(r, host, args, positions, index) for r in result)
    if not isinstance(result, torch.Tensor):
        return result  # an optional output left undefined (None), or a number
    for position in positions:
        if position < len(host) and result is host[position]:
            return args[position]
    return allocator.adopt_tracked(result, index)


def _direct(overload: OverloadRecord, args: tuple, kwargs: dict):
    """Run the common call of `overload`'s op on host aliases; None if the call is not the common one."""
    if _numerics.downcast_64bit:
        return None
    dropout = overload.dropout_position
    if dropout is not None and (args[dropout] if dropout < len(args) else kwargs.get("dropout_p", 0.0)) != 0.0:
        return None  # draws random numbers: the fallback runs it on the device's generator
    if kwargs:
        for value in kwargs.values():
            if isinstance(value, _Tensor):
                return None
    walked = walk(overload, args, kernel_input)  # host aliases in place of the `neuron` tensors
    if walked is None:
        return None
    host, index, call = walked
    _ledger.count_call(overload.name)
    result = call(*host, **kwargs)
    if type(result) is _Tensor and not overload.in_place:  # a functional op's one result is fresh: the common case
        tensor = adopt(result, index)
        _ledger.charge(overload, index, host, kwargs, result)
        return allocator.track(tensor, index)
    _ledger.charge(overload, index, host, kwargs, result)
    return _adopt(result, host, args, overload.tensor_positions, index)


Record = Callable[[OverloadRecord, tuple, dict], Any]
_record: Record | None = None


def _recorded(overload: OverloadRecord, args: tuple, kwargs: dict):
    """`_direct` behind adaptive eager's recorder: the op is queued, or run now when the recorder returns None (after
    the ops queued before it: only adaptive eager queues ops, so plain eager's `_direct` has no barrier to pass)."""
    result = _record(overload, args, kwargs)
    if result is not None:
        return result
    flush_barrier()
    return _direct(overload, args, kwargs)


_call = _direct  # what every fast kernel calls: `_direct`, or `_recorded` while adaptive eager is on


def set_recorder(record: Record | None) -> None:
    """Adaptive eager installs its `record` in front of the direct call of every fast kernel (None removes it), so
    plain eager's calls pay nothing for the feature."""
    global _call, _record
    _record = record
    _call = _direct if record is None else _recorded


def run_direct(op: torch._ops.OpOverload, *args, **kwargs):
    """`op` on `neuron` tensors: the direct call when it applies, else the boxed fallback."""
    overload = records.get(op._op) or overload_record(op)
    if overload.direct:
        result = _call(overload, args, kwargs)
        if result is not None:
            return result
    return run_on_host(op, *args, **kwargs)


def run_record(overload: OverloadRecord, args: tuple, kwargs: dict):
    """`run_direct` of a direct overload (`OverloadRecord.direct`) by its record, for a kernel that holds it."""
    result = _call(overload, args, kwargs)
    return run_on_host(overload.op, *args, **kwargs) if result is None else result


def _kernel(op: torch._ops.OpOverload) -> Callable:
    overload = overload_record(op)

    def run(*args, **kwargs):
        result = _call(overload, args, kwargs)
        return run_on_host(op, *args, **kwargs) if result is None else result

    run.__name__ = f"{op._schema.name.partition('::')[2]}_fast"
    return run


def _differentiable_only_by_decomposition(op: torch._ops.OpOverload) -> bool:
    """A CompositeImplicitAutograd overload with no autograd formula (`min.other`, `where.ScalarOther`, `var.dim`):
    a backend kernel would replace the decomposition autograd differentiates, and silently cut the graph."""
    keys = torch._C.DispatchKey
    try:
        composite = op.has_kernel_for_dispatch_key(keys.CompositeImplicitAutograd)
    except RuntimeError:  # an overload only TorchScript knows (`index.Tensor_hacked_twin`)
        return False
    return composite and not op.has_kernel_for_dispatch_key(keys.Autograd)


def install() -> None:
    """Register the fast kernels on every eligible overload of `HOT_OPS` that has no direct kernel yet."""
    aten = torch.ops.aten
    for packet_name in HOT_OPS:
        packet = getattr(aten, packet_name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            overload = overload_record(op)
            if overload.name in registry.kernels or overload.info.engine is None or not overload.direct:
                continue
            if _differentiable_only_by_decomposition(op):
                continue
            registry.register(overload.name, _kernel(op))
            registry.builtin.add(overload.name)
