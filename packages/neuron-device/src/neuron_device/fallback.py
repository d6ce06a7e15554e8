"""The CPU fallback: run any ATen op on `neuron` tensors by executing the CPU kernel on zero-copy host aliases, and
the policy that says which ops are fallbacks on the real device (`admit`).

This is the generic path every op without a direct kernel takes (the boxed PrivateUse1 fallback). Because device
memory is host memory, inputs are never copied: in-place ops write straight into device memory, and fresh results
are adopted as device storage without a copy. The semantics follow PyTorch's own `cpu_fallback` and CUDA:

* in-place ops return `self`; `out=` ops write into `out`, resizing it only when its shape must change;
* a result that aliases an input becomes a `neuron` view of that input's storage;
* tensors of one op must share one device (0-dim CPU tensors are allowed as scalars, as on CUDA);
* random ops draw from the device's generator (`torch.neuron.random`, in the forms of `ops.seeded`), so they are
  reproducible per device;
* an op the catalogue (`ops.catalogue`) gives no engine is a CPU fallback on the real device too: `admit` warns
  once per op with TorchNeuron's text ``Operator 'aten::X' fell back to CPU``, records it, and raises instead with
  ``NEURON_FALLBACK_ENABLED=0``; its host copies are charged by the op ledger (`simulation.ledger`);
* an op with no CPU kernel but a decomposition in `torch._decomp` (GPU-only backward kernels such as
  `_fused_rms_norm_backward`, which `nn.RMSNorm` training reaches on `neuron`) runs that decomposition on the host.

What it knows about an op (its `out=` and generator arguments, which argument may be a CPU tensor, its
decomposition) is the op's record (`ops.call.overload_record`), which the fast path and numerics read too.
"""

from __future__ import annotations

import os
import sys
import traceback
import warnings
from collections.abc import Callable

import torch

from . import allocator, envvars
from . import compile_time as _compile_time
from . import numerics as _numerics
from .ops import host_numerics as _host_numerics
from .ops.call import OverloadRecord, overload_record, records
from .ops.seeded import on_device_generator
from .simulation import ledger as _ledger
from .storage import host_alias

__all__ = ["FALLBACK_ENV", "admit", "run_on_host"]

FALLBACK_ENV = envvars.FALLBACK.name


def _fallback_enabled() -> bool:
    return envvars.FALLBACK.read()


_LIBRARY_PACKAGES = frozenset({"torch", "neuron_device", "torch_neuronx"})


def _user_stacklevel() -> int:
    """The `stacklevel` that points a warning raised in `admit` at the first frame outside torch and this package."""
    frame, level = sys._getframe(2), 2  # level 1 is admit, level 2 its caller
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] in _LIBRARY_PACKAGES:
        frame, level = frame.f_back, level + 1
    return level


def _stack_trace() -> str:
    """With `TORCH_NEURONX_ENABLE_STACK_TRACE=1`, the Python stack of the op's caller (library frames left out),
    for the fallback's warning or error; else nothing."""
    if not envvars.STACK_TRACE.read():
        return ""
    frames = [frame for frame in traceback.extract_stack(sys._getframe(2))
              if frame.filename and not any(f"{os.sep}{package}{os.sep}" in frame.filename
                                            for package in _LIBRARY_PACKAGES)]
    return "\nPython stack of the call (TORCH_NEURONX_ENABLE_STACK_TRACE=1):\n" + "".join(traceback.format_list(frames))


def admit(op: torch._ops.OpOverload) -> None:
    """Classify `op` before it runs: a fallback warns once per op, is recorded, and raises in strict mode. At compile
    time (`compile_time`) it is none of these: the compiler's ops run on the host, as neuronx-cc does."""
    _admit(records.get(op._op) or overload_record(op))


def _admit(overload: OverloadRecord) -> None:
    info = overload.info
    if info.engine is None and not _compile_time.now():
        name = info.name
        if _ledger.record_fallback(name):
            if _fallback_enabled():
                warnings.warn(f"Operator '{name}' fell back to CPU{_stack_trace()}", stacklevel=_user_stacklevel())
        if not _fallback_enabled():
            raise RuntimeError(
                f"Operator '{name}' has no Neuron kernel and CPU fallback is disabled ({FALLBACK_ENV}=0); unset "
                f"{FALLBACK_ENV} to let it fall back to CPU{_stack_trace()}"
            )



_NEURON = "neuron"

# A CPU `out=` of a `neuron` op: the message of CUDA's structured kernels (their generated device check), or that of a
# CUDA kernel that checks the device of `out` itself (PyTorch's tests match these texts).
_STRUCTURED_OUT_DEVICE = "Expected out tensor to have device {device}, but got cpu instead (in {op})"
_OUT_DEVICE_MESSAGES = {
    "aten::nonzero.out": "expected self and out to be on the same device, but got out on cpu and self on {device}",
}


class _Call:
    """State of one fallback call: the device, the host aliases made, and the inputs' storages."""

    __slots__ = ("aliases", "hosts", "index", "overload", "storages")

    def __init__(self, overload: OverloadRecord) -> None:
        self.overload = overload
        self.index: int | None = None
        self.aliases: dict[int, torch.Tensor] = {}  # id(host alias) -> neuron tensor
        # id(neuron tensor) -> its host alias: a tensor passed twice (`mul.out(x, y, out=x)`, which `x.ldexp_(y)`
        # becomes) is one tensor to the CPU kernel too, so its "output is also an input" rules apply.
        self.hosts: dict[int, torch.Tensor] = {}
        self.storages: list[torch.Tensor] = []  # neuron inputs, to map results that alias them

    def _see_device(self, index: int) -> None:
        if self.index is None:
            self.index = index
        elif index != self.index:
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two devices, "
                f"neuron:{self.index} and neuron:{index}!"
            )

    def to_host(self, value):
        if isinstance(value, torch.Tensor):
            if value.device.type == _NEURON:
                alias = self.hosts.get(id(value))
                if alias is not None:
                    return alias
                self._see_device(value.device.index)
                alias = self.hosts[id(value)] = host_alias(value)
                self.aliases[id(alias)] = value
                self.storages.append(value)
                return alias
            return value
        if isinstance(value, (list, tuple)):
            return type(value)(self.to_host(v) for v in value)
        if isinstance(value, torch.device) and value.type == _NEURON:
            self._see_device(torch.neuron._get_device_index(value))
            return torch.device("cpu")
        return value

    def refresh_aliases(self) -> None:
        """Point every host alias made so far at its tensor's memory again (after a device storage moved)."""
        for alias in self.hosts.values():
            alias.set_(host_alias(self.aliases[id(alias)]))

    def check_devices(self, args: tuple, kwargs: dict) -> None:
        """CUDA's device rules for CPU tensors in a `neuron` op: a 0-dim CPU tensor may be an input scalar, never
        the tensor written (in-place `self`, `out=`); a CPU tensor with dimensions only as indexing's indices."""
        if self.index is None:
            return
        overload = self.overload
        for position, value in enumerate(args):
            for tensor in _cpu_tensors(value):
                written = position == 0 and overload.in_place
                if written or (tensor.dim() > 0 and position != overload.cpu_ok_position):
                    self._mixed(overload.name)
        for key, value in kwargs.items():
            for tensor in _cpu_tensors(value):
                if key in overload.out_names:
                    message = _OUT_DEVICE_MESSAGES.get(overload.name, _STRUCTURED_OUT_DEVICE)
                    raise RuntimeError(message.format(device=f"neuron:{self.index}", op=overload.name))
                if tensor.dim() > 0:
                    self._mixed(overload.name)

    def _mixed(self, name: str) -> None:
        raise RuntimeError(
            "Expected all tensors to be on the same device, but found at least two devices, "
            f"neuron:{self.index} and cpu! (in {name})"
        )

    def to_device(self, value):
        if isinstance(value, torch.Tensor):
            original = self.aliases.get(id(value))
            if original is not None:
                return original
            if value.device.type != "cpu":
                return value
            if value.layout is not torch.strided:
                raise NotImplementedError(f"{self.overload.name} would make a {value.layout} tensor on neuron, but {_DENSE_ONLY}")
            return self._view_of_input(value) or allocator.adopt_tracked(value, self.device_index())
        if isinstance(value, (list, tuple)):
            return type(value)(self.to_device(v) for v in value)
        return value

    def device_index(self) -> int:
        return torch.neuron.current_device() if self.index is None else self.index

    def _view_of_input(self, result: torch.Tensor) -> torch.Tensor | None:
        """If `result` lies in the memory of a neuron input, return the same view of that input's storage."""
        if result.numel() == 0:
            return None
        pointer = result.data_ptr()
        for tensor in self.storages:
            storage = tensor.untyped_storage()
            start = storage.data_ptr()
            if start <= pointer < start + storage.nbytes():
                offset, remainder = divmod(pointer - start, result.element_size())
                if remainder:
                    return None
                view = torch.empty(0, dtype=result.dtype, device=tensor.device)
                return view.set_(storage, offset, result.size(), result.stride())
        return None


def _cpu_tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value] if value.device.type == "cpu" else []
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _cpu_tensors(item)]
    return []


_FULL_PRECISION = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}


def _wrap_numbers(args: tuple, positions: tuple[int, ...]) -> tuple:
    """Turn Python numbers back into the scalar tensors the schema asks for.

    A composite kernel passes a Python scalar to a `Tensor` argument as a "wrapped number" tensor, which reaches a
    Python kernel as a plain number that `op(...)` then refuses. The replacement 0-dim tensor gets the dtype the
    wrapped number would have promoted to, so the CPU kernel computes in the same dtype. When the number does not
    promote a dimensioned tensor, it keeps full precision (a 0-dim float64 does not promote a bfloat16 tensor
    either), as the CPU kernel reads a wrapped number: `x.div_(1.3)` on bfloat16 must not divide by bfloat16(1.3).
    """
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    reference = next((t for t in tensors if t.dim() > 0), tensors[0] if tensors else None)
    wrapped = list(args)
    for position in positions:
        if position < len(args) and isinstance(args[position], (bool, int, float, complex)):
            value = args[position]
            dtype = None if reference is None else torch.result_type(reference, value)
            if reference is not None and reference.dim() > 0 and dtype == reference.dtype:
                dtype = _FULL_PRECISION[type(value)]
            wrapped[position] = torch.tensor(value, dtype=dtype)
    return tuple(wrapped)


def _shares_storage_with_input(call: _Call, outs: list[tuple[str, torch.Tensor]]) -> bool:
    inputs = {t.untyped_storage()._cdata for t in call.storages if all(t is not out for _, out in outs)}
    return any(out.untyped_storage()._cdata in inputs for _, out in outs)


def _write_back(out: torch.Tensor, result: torch.Tensor) -> None:
    """Give the neuron `out` the result computed into a fresh CPU tensor (resizing `out` only if needed)."""
    if out.numel() == 0 and out.shape == result.shape:
        return  # already the right size: nothing to copy, and its strides stay (as on CPU)
    if out.untyped_storage().nbytes() == 0 and result.is_contiguous():
        # Nothing can share an empty storage: adopt the result's memory instead of copying it.
        adopted = allocator.adopt_tracked(result, out.device.index)
        out.set_(adopted.untyped_storage(), 0, result.size(), result.stride())
        return
    if out.shape != result.shape:
        out.resize_(result.shape)
    host_alias(out).copy_(result)


def _sync_resized_alias(out: torch.Tensor, alias: torch.Tensor) -> None:
    """The CPU kernel resized the host alias of `out` in place (within its storage): mirror that on `out`."""
    if alias.size() != out.size() or alias.stride() != out.stride():
        if alias.untyped_storage().data_ptr() == out.untyped_storage().data_ptr():
            offset = alias.storage_offset()  # a view of the storage's host twin: the same offsets
        elif alias.numel() and out.numel():
            offset = out.storage_offset() + (alias.data_ptr() - out.data_ptr()) // max(out.element_size(), 1)
        else:
            offset = out.storage_offset()  # an empty tensor's data pointer says nothing
        out.set_(out.untyped_storage(), offset, alias.size(), alias.stride())


_DENSE_ONLY = "neuron supports only strided (dense) tensors; keep sparse tensors on the CPU"


def refuse_sparse(op: torch._ops.OpOverload, *args, **kwargs):
    """The fallback of neuron's sparse dispatch keys, in place of torch's "Could not run ... 'Sparseneuron' backend".
    (`nn.Embedding(sparse=True)` reaches it in backward.)"""
    raise NotImplementedError(
        f"{op.name()} involves a sparse neuron tensor, but {_DENSE_ONLY} (for nn.Embedding and nn.EmbeddingBag: "
        "sparse=False)"
    )


_UNSUPPORTED = {
    "quantized": "quantized tensors (torch.quint8, qint8, qint32) are not supported on neuron; quantize on the CPU, "
                 "or use a float8 / integer dtype on neuron",
    "nested": "nested tensors are not supported on neuron; pad to a dense tensor (torch.nested.to_padded_tensor) "
              "or keep them on the CPU",
}


def refusing(kind: str) -> Callable:
    """The fallback of a dispatch key of tensors `neuron` cannot hold (`_UNSUPPORTED`): a clear error naming the op,
    in place of torch's "Could not run ... 'Quantizedneuron' backend" or an internal NestedTensorImpl error."""
    def refuse(op: torch._ops.OpOverload, *args, **kwargs):
        raise NotImplementedError(f"{op.name()}: {_UNSUPPORTED[kind]}")

    refuse.__name__ = f"refuse_{kind}"
    return refuse


def run_on_host(op: torch._ops.OpOverload, *args, **kwargs):
    """The boxed fallback: execute `op` with its CPU kernel on host aliases of the `neuron` arguments."""
    overload = records.get(op._op) or overload_record(op)
    if _numerics.downcast_64bit:  # opt-in: 64-bit types computed in 32 bits (numerics.py)
        return _host_numerics.run_downcast(_run_on_host, overload, args, kwargs)
    return _run_on_host(overload, *args, **kwargs)


def _run_on_host(overload: OverloadRecord, /, *args, **kwargs):
    _ledger.count_call(overload.name)
    _admit(overload)  # native kernel or CPU fallback (warns once; raises in strict mode)
    call = _Call(overload)
    host_args = call.to_host(args)
    positions = overload.wrapped_number_positions
    for position in positions:
        if position < len(host_args) and not isinstance(host_args[position], torch.Tensor):
            host_args = _wrap_numbers(host_args, positions)
            break
    host_kwargs = {}
    outs: list[tuple[str, torch.Tensor]] = []
    for key, value in kwargs.items():
        if key in overload.out_names and isinstance(value, torch.Tensor) and value.device.type == _NEURON:
            outs.append((key, value))
        host_kwargs[key] = call.to_host(value)
    call.check_devices(args, kwargs)
    index = call.device_index()

    run, host_args, host_kwargs = on_device_generator(overload, index, host_args, host_kwargs)

    fresh = {key: out for key, out in outs if out.numel() == 0}
    for key, out in fresh.items():
        host_kwargs[key] = torch.empty(0, dtype=out.dtype)
    try:
        result = run(*host_args, **host_kwargs)
    except RuntimeError as error:
        # An out= alias that must grow cannot: its memory belongs to the device. Compute into fresh tensors.
        if not outs or "not resizable" not in str(error):
            raise
        fresh = dict(outs)
        for key, out in fresh.items():
            host_kwargs[key] = torch.empty(0, dtype=out.dtype)
        result = run(*host_args, **host_kwargs)
        if _shares_storage_with_input(call, outs):
            # The CPU checks overlap, grows that storage, then runs the kernel on inputs that may now overlap the
            # output: to give the same values, grow the device storage as the CPU's resize would, then run the
            # kernel on the device memory (it resizes the out= alias itself, within the storage).
            for key, out in outs:
                needed = (out.storage_offset() + host_kwargs[key].numel()) * out.element_size()
                if needed > out.untyped_storage().nbytes():
                    allocator.resize(out.untyped_storage(), needed)
            call.refresh_aliases()
            for key, out in outs:
                host_kwargs[key] = call.hosts[id(out)]
            fresh = {}
            result = run(*host_args, **host_kwargs)

    for key, out in outs:
        if key in fresh:
            _write_back(out, host_kwargs[key])
            call.aliases[id(host_kwargs[key])] = out
        else:
            _sync_resized_alias(out, host_kwargs[key])
    _ledger.charge(overload, index, host_args, host_kwargs, result)
    return call.to_device(result)
