"""What `neuron` knows about one ATen overload, and the argument walk of the common call.

Every path an op can take on `neuron` reads the same facts of its schema: the fast path (`ops.fastpath`) its direct
callable and where its tensors are, the boxed fallback (`fallback`) its `out=` arguments and device rules, the
random forms (`ops.seeded`) its generator arguments, the 64-bit numerics (`ops.host_numerics.run_downcast`) what it
writes, adaptive eager (`adaptive_eager.queue`) its Scalar overload, and the charge (`simulation.ledger`) its engine
and work (`ops.catalogue`). `overload_record(op)` computes them once per overload, in one `OverloadRecord`, cached
here.

`walk` is the argument walk of the common call, the one the fast path runs and adaptive eager queues: every tensor
argument a `neuron` tensor of one device, each converted by the caller (a host alias to run now, a reference into the
queue to run later). The boxed fallback walks arguments its own way (`fallback._Call.to_host`): it takes every call,
so it accepts CPU tensors where CUDA does, raises CUDA's errors on mixed devices and maps a tensor passed twice to
one alias, where this walk only says "not the common call" (None) and leaves the call to it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .catalogue import OpInfo, op_info

__all__ = ["OverloadRecord", "joined_device", "overload_record", "records", "tensor_list", "walk"]

_Tensor = torch.Tensor
_NUMBERS = (bool, int, float, complex)
_TENSOR_TYPES = ("Tensor", "Optional[Tensor]", "List[Tensor]", "List[Optional[Tensor]]")

# The argument that CUDA's kernels accept on the CPU next to device tensors: indexing's `indices` (moved to the
# device). Any other CPU tensor with dimensions (`index_put_`'s values too) is an error, as on CUDA.
_CPU_OK_ARGUMENT = "indices"
_INDEXING = frozenset({"aten::index.Tensor", "aten::index.Tensor_out", "aten::index_put_", "aten::index_put",
                       "aten::_index_put_impl_", "aten::index_put.out", "aten::_index_put_impl"})


def _position(arguments: list, name: str) -> int | None:
    return next((i for i, a in enumerate(arguments) if a.name == name), None)


def _direct_call_applies(op: torch._ops.OpOverload, seeded: bool, dropout_position: int | None) -> bool:
    """A functional overload (returns fresh tensors) or an in-place one (writes and returns only `self`), taking no
    generator or device and drawing no random numbers (or only through a `dropout_p` checked per call)."""
    schema = op._schema
    arguments, returns = schema.arguments, schema.returns
    if not returns or any(str(r.type) != "Tensor" for r in returns):
        return False
    in_place = arguments[0].alias_info is not None and arguments[0].alias_info.is_write
    if in_place:
        if len(returns) != 1 or returns[0].alias_info is None or any(a.alias_info is not None for a in arguments[1:]):
            return False
    elif any(a.alias_info is not None for a in arguments) or any(r.alias_info is not None for r in returns):
        return False
    if any(str(a.type) in ("Optional[Generator]", "Optional[Device]", "Device") for a in arguments):
        return False
    if seeded and dropout_position is None:
        return False
    return any(str(a.type) in _TENSOR_TYPES for a in arguments if not a.kwarg_only)


def _host_call(op: torch._ops.OpOverload, name: str) -> Callable:
    """`op`, unless the CPU cannot run it (no kernel, not even a composite one) and torch has a decomposition."""
    try:
        if torch._C._dispatch_has_computed_kernel_for_dispatch_key(name, "CPU"):
            return op
    except RuntimeError:  # an overload only TorchScript knows (`add.t`): calling it raises torch's own error
        return op
    from torch._decomp import decomposition_table

    return decomposition_table.get(op, op)  # no decomposition either: torch's own error names the op


def _scalar_overload(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """For a `.Tensor` overload, its `.Scalar` sibling taking a number as argument 1 (else None): `x + 0.5` reaches
    `add.Tensor` with a Python number as `other`, and the `.Scalar` overload is what the CPU runs for it (a
    wrapped-number tensor)."""
    schema = op._schema
    if schema.overload_name != "Tensor" or op.namespace != "aten":
        return None
    scalar = getattr(getattr(torch.ops.aten, schema.name.partition("::")[2]), "Scalar", None)
    if scalar is None:
        return None
    ours, theirs = schema.arguments, scalar._schema.arguments
    same = [a.name for a in ours] == [a.name for a in theirs] and len(theirs) > 1
    return scalar if same and str(theirs[1].type) in ("Scalar", "number") else None


def _generator_argument(op: torch._ops.OpOverload) -> str | None:
    return next((a.name for a in op._schema.arguments if str(a.type) == "Optional[Generator]"), None)


def _generator_form(op: torch._ops.OpOverload) -> tuple[torch._ops.OpOverload, str, int] | None:
    """The overload that runs `op` on an explicit generator, with the name and position of its generator argument:
    `op` itself if it takes one, else the overload of its packet that adds one (`rand.default` -> `rand.generator`,
    `randint.low` -> `randint.low_generator`); None if there is none."""
    name = _generator_argument(op)
    if name is not None:
        return op, name, _position(op._schema.arguments, name)
    ours = [a.name for a in op._schema.arguments]
    packet = getattr(torch.ops.aten, op._schema.name.partition("::")[2], None) if op.namespace == "aten" else None
    for overload_name in packet.overloads() if packet is not None else ():
        overload = getattr(packet, overload_name)
        name = _generator_argument(overload)
        if name is not None and [a.name for a in overload._schema.arguments if a.name != name] == ours:
            return overload, name, _position(overload._schema.arguments, name)
    return None


class OverloadRecord:
    """What every path of a call of one overload needs from its schema and the catalogue, computed once."""

    __slots__ = (
        "call",
        "charges",
        "cpu_ok_position",
        "direct",
        "dropout_position",
        "dtype_position",
        "generator",
        "generator_form",
        "host_call",
        "in_place",
        "info",
        "keyed_by_arguments",
        "keyed_by_precision",
        "name",
        "op",
        "out_names",
        "returns_view",
        "scalar_call",
        "scalar_op",
        "seeded",
        "tensor_positions",
        "wrapped_number_positions",
        "written_names",
        "written_positions",
    )

    op: torch._ops.OpOverload
    name: str  # "aten::add.Tensor", as TorchNeuron names ops
    info: OpInfo  # the catalogue's engine and work: what the charge and the fallback policy read
    call: Callable  # the C++ callable `OpOverload.__call__` forwards to, minus that Python frame
    host_call: Callable  # what runs it on the host: the op, or its decomposition when the CPU has no kernel
    scalar_op: torch._ops.OpOverload | None  # the `.Scalar` overload run for a number in position 1
    scalar_call: Callable | None
    direct: bool  # the fast path's direct call applies (fresh results or `self`, no generator, no device)
    in_place: bool  # writes its first (positional) argument
    tensor_positions: tuple[int, ...]  # positional arguments of a tensor type (Tensor, Tensor?, lists of them)
    wrapped_number_positions: tuple[int, ...]  # positional `Tensor` arguments (a composite passes numbers there)
    out_names: tuple[str, ...]  # keyword-only arguments written to (out=)
    written_names: frozenset[str]  # arguments written (in-place self, out=)
    written_positions: frozenset[int]
    returns_view: bool  # returns a view of an input: moves no data
    dtype_position: int | None  # a `dtype` argument, which decides the output type when given
    seeded: bool  # may draw random numbers
    generator: tuple[int, str] | None  # (position, name) of its Generator? argument
    dropout_position: int | None  # a seeded op's `dropout_p`: with `dropout_p == 0` it draws no random numbers
    generator_form: tuple[torch._ops.OpOverload, str, int] | None  # a seeded op's form on an explicit generator:
    # (the overload, its generator argument's name and position), how `ops.seeded.seeded_call` runs it
    cpu_ok_position: int | None  # the argument that may be a CPU tensor with dimensions (indexing's indices)
    charges: dict[tuple, tuple]  # the op ledger's cache of this overload's calls, by shapes (`ledger.charge`)
    keyed_by_arguments: bool  # its charge depends on its arguments' shapes alone (not a view, matmul or scatter)
    keyed_by_precision: bool  # a Tensor engine op: on its arguments' shapes and the float32 matmul precision

    def __init__(self, op: torch._ops.OpOverload) -> None:
        schema = op._schema
        arguments = schema.arguments
        self.op = op
        self.info = op_info(op)
        self.name = name = self.info.name
        self.call = op._op
        self.host_call = _host_call(op, name)
        self.scalar_op = _scalar_overload(op)
        self.scalar_call = None if self.scalar_op is None else self.scalar_op._op
        first = arguments[0] if arguments else None
        self.in_place = (first is not None and first.alias_info is not None and first.alias_info.is_write
                         and not first.kwarg_only)
        self.tensor_positions = tuple(
            i for i, a in enumerate(arguments) if not a.kwarg_only and str(a.type) in _TENSOR_TYPES)
        self.wrapped_number_positions = tuple(
            i for i, a in enumerate(arguments) if not a.kwarg_only and str(a.type) == "Tensor")
        written = [(i, a) for i, a in enumerate(arguments) if a.alias_info is not None and a.alias_info.is_write]
        self.out_names = tuple(a.name for _, a in written if a.kwarg_only)
        self.written_names = frozenset(a.name for _, a in written)
        self.written_positions = frozenset(i for i, _ in written)
        self.returns_view = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
        self.dtype_position = _position(arguments, "dtype")
        self.seeded = torch.Tag.nondeterministic_seeded in op.tags
        self.generator = next(
            ((i, a.name) for i, a in enumerate(arguments) if str(a.type) == "Optional[Generator]"), None)
        self.dropout_position = _position(arguments, "dropout_p") if self.seeded else None
        self.generator_form = _generator_form(op) if self.seeded else None
        self.cpu_ok_position = _position(arguments, _CPU_OK_ARGUMENT) if name in _INDEXING else None
        self.direct = _direct_call_applies(op, self.seeded, self.dropout_position)
        self.charges = {}
        info = self.info
        self.keyed_by_arguments = info.engine not in ("view", "tensor") and info.scatter_base is None
        self.keyed_by_precision = info.engine == "tensor" and info.scatter_base is None

    def __repr__(self) -> str:
        return f"OverloadRecord({self.name})"


# Read directly by the hot paths, `records.get(op._op)`: keyed by the overload's C callable, which hashes in C (an
# `OpOverload` hashes in Python, a frame per lookup)
records: dict[Callable, OverloadRecord] = {}


def overload_record(op: torch._ops.OpOverload) -> OverloadRecord:
    """The record of `op` (computed on first use, then cached)."""
    record = records.get(op._op)
    if record is None:
        record = records[op._op] = OverloadRecord(op)
    return record


def joined_device(tensor: torch.Tensor, index: int) -> int:
    """The device index of a common call whose tensor arguments so far were on device `index` (-1: none yet) and
    which also takes `tensor`; -2 if `tensor` is not a `neuron` tensor of that device."""
    device = tensor.get_device()  # -1 for CPU and meta tensors
    return device if device >= 0 and (index < 0 or device == index) else -2


def tensor_list(value: list | tuple, index: int, convert: Callable[[torch.Tensor], Any]) -> tuple[list, int] | None:
    """A tensor-list argument of the common call: each item through `convert` (None items stay None) and the device
    index joined over them (`joined_device`); None when an item is not a tensor or not on that device."""
    items = []
    for item in value:
        if item is None:
            items.append(None)
            continue
        if not isinstance(item, torch.Tensor):
            return None
        index = joined_device(item, index)
        if index < 0:
            return None
        items.append(convert(item))
    return items, index


def walk(record: OverloadRecord, args: tuple,
         convert: Callable[[torch.Tensor], Any]) -> tuple[list, int, Callable] | None:
    """The positional arguments of a common call of `record`'s op, each tensor (also in lists) through `convert`,
    with the device index and the callable to run (`record.call`, or `record.scalar_call` for a number in position
    1); None if the call is not the common one (a tensor not on `neuron`, two devices, no tensor at all, a number
    where the schema wants a tensor and no Scalar overload takes it)."""
    index = -1
    converted = list(args)
    call = record.call
    count = len(args)
    for position in record.tensor_positions:
        if position >= count:
            break
        value = args[position]
        if isinstance(value, _Tensor):
            device = value.get_device()  # `joined_device`, inline: -1 for CPU and meta tensors
            if device < 0 or (index >= 0 and device != index):
                return None
            index = device
            converted[position] = convert(value)
        elif type(value) is list or type(value) is tuple:
            walked = tensor_list(value, index, convert)
            if walked is None:
                return None
            converted[position], index = walked
        elif value is not None:
            if position != 1 or record.scalar_call is None or not isinstance(value, _NUMBERS):
                return None
            call = record.scalar_call
    if index < 0:
        return None
    return converted, index, call
