"""`torch.neuron.comm`: copies between the `neuron` devices of one process, `torch.cuda.comm`'s twin.

`nn.DataParallel` scatters inputs, replicates the module, gathers outputs and sums gradients through
`torch.nn.parallel.comm`, whose CUDA implementations are C++ functions (`torch._C._scatter`, `_gather`,
`_broadcast_coalesced`, ...) that exist only in CUDA builds. These are the same operations as device-to-device copies
through the simulator, made as CUDA makes them: `streams` are honoured (`scatter` charges each chunk's copy to its
stream), and `broadcast_coalesced` packs tensors into buffers of up to `buffer_size` bytes, one transfer each, so the
simulated time counts the transfers DataParallel would make.

`_patches` routes `torch.nn.parallel.comm` here while neuron is the current accelerator; `reduce_add_coalesced` is
torch's own Python, which sums through `reduce_add`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from torch._utils import (
    _flatten_dense_tensors,
    _get_device_index,
    _handle_complex,
    _reorder_tensors_as,
    _take_tensors,
    _unflatten_dense_tensors,
)
from torch.nn.parallel.comm import reduce_add_coalesced

__all__ = ["broadcast", "broadcast_coalesced", "gather", "reduce_add", "reduce_add_coalesced", "scatter"]

_Devices = Sequence[int | str | torch.device]


def _neuron(index: int) -> torch.device:
    return torch.device("neuron", index)


def _check_on_neuron(tensors: Sequence[torch.Tensor], what: str) -> None:
    for i, tensor in enumerate(tensors):
        if tensor.device.type != "neuron":
            raise RuntimeError(f"{what} expects all inputs to be on neuron devices, but input {i} is on {tensor.device}")


def broadcast(
    tensor: torch.Tensor, devices: _Devices | None = None, *, out: Sequence[torch.Tensor] | None = None
) -> tuple[torch.Tensor, ...]:
    """Copies of `tensor` on `devices` (or into `out`); the copy for `tensor`'s own device is `tensor` itself."""
    tensor = _handle_complex(tensor)
    if (devices is None) == (out is None):
        raise RuntimeError(
            f"Exactly one of 'devices' and 'out' must be specified, but got devices={devices} and out={out}"
        )
    if out is not None:
        for i, destination in enumerate(out):
            if destination.shape != tensor.shape:
                raise RuntimeError(
                    f"Output {i} has shape {list(destination.shape)}, but the broadcast tensor has shape "
                    f"{list(tensor.shape)}"
                )
            destination.copy_(tensor)
        return tuple(out)
    return tuple(tensor.to(_neuron(_get_device_index(d))) for d in devices)


def broadcast_coalesced(
    tensors: Sequence[torch.Tensor], devices: _Devices, buffer_size: int = 10485760
) -> list[list[torch.Tensor]]:
    """`tensors` (all on `devices[0]`) on every device of `devices`: the originals for `devices[0]`, detached copies
    with their own version counters for the others, as CUDA's coalesced broadcast returns. The copies of one buffer
    (tensors of one dtype, up to `buffer_size` bytes) share its storage, as on CUDA."""
    indices = [_get_device_index(d) for d in devices]
    tensors = [_handle_complex(t) for t in tensors]
    _check_on_neuron(tensors, "broadcast_coalesced")
    for tensor in tensors:
        if tensor.get_device() != indices[0]:
            raise RuntimeError(f"All tensors must be on devices[0]: {indices[0]}, but got {tensor.get_device()}")
    copies: list[list[torch.Tensor]] = [[] for _ in indices[1:]]
    for chunk in _take_tensors(tensors, buffer_size) if copies else ():  # by dtype: reordered below
        flat = _flatten_dense_tensors([t.detach() for t in chunk])
        for copied, index in zip(copies, indices[1:]):
            copied.extend(t.data for t in _unflatten_dense_tensors(flat.to(_neuron(index)), chunk))
    return [list(tensors)] + [list(_reorder_tensors_as(copied, tensors)) for copied in copies]


def reduce_add(inputs: Sequence[torch.Tensor], destination: int | str | torch.device | None = None) -> torch.Tensor:
    """The elementwise sum of `inputs`, one per device, on `destination` (default: the current device)."""
    destination = _get_device_index(destination, optional=True)
    _check_on_neuron(inputs, "reduce_add")
    roots = [t for t in inputs if t.get_device() == destination]
    if not roots:
        raise RuntimeError("reduce_add expects destination to be on the same device as one of the tensors")
    for i, tensor in enumerate(inputs):
        if tensor.shape != inputs[0].shape:
            raise ValueError(
                f"input {i} has invalid size: got {'x'.join(map(str, tensor.shape))}, "
                f"but expected {'x'.join(map(str, inputs[0].shape))}"
            )
    if len(inputs) == 1:
        return inputs[0]
    result = roots[0].clone()
    for tensor in inputs:
        if tensor is not roots[0]:
            result.add_(tensor.to(result.device))
    return result


def scatter(
    tensor: torch.Tensor,
    devices: _Devices | None = None,
    chunk_sizes: Sequence[int] | None = None,
    dim: int = 0,
    streams: Sequence[torch.Stream | None] | None = None,
    *,
    out: Sequence[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, ...]:
    """Chunks of `tensor` along `dim`, one per device of `devices` (or copied into `out`), each copied on its stream of
    `streams` if given. A chunk already on its device is a view of `tensor`, as on CUDA; a small tensor makes fewer
    chunks than devices."""
    tensor = _handle_complex(tensor)
    if out is not None:
        if devices is not None:
            raise RuntimeError(
                f"'devices' must not be specified when 'out' is specified, but got devices={devices}"
            )
        if chunk_sizes is not None:
            raise RuntimeError(
                f"'chunk_sizes' must not be specified when 'out' is specified, but got chunk_sizes={chunk_sizes}"
            )
        sizes = [o.size(dim) for o in out]
        _check_chunk_sizes(tensor, sizes, dim)
        for destination, chunk, stream in zip(out, tensor.split(sizes, dim), _each(streams, len(out))):
            with torch.neuron.stream(stream):
                destination.copy_(chunk)
        return tuple(out)
    if devices is None:
        raise RuntimeError("Exactly one of 'devices' and 'out' must be specified, but got neither")
    indices = [_get_device_index(d) for d in devices]
    if chunk_sizes is None:
        chunks = tensor.chunk(len(indices), dim)
    else:
        if len(chunk_sizes) != len(indices):
            raise RuntimeError(
                f"Expected devices and chunk_sizes to be of same length, but got len(devices) = {len(indices)} and "
                f"len(chunk_sizes) = {len(chunk_sizes)}"
            )
        _check_chunk_sizes(tensor, chunk_sizes, dim)
        chunks = tensor.split(list(chunk_sizes), dim)
    outputs = []
    for chunk, index, stream in zip(chunks, indices, _each(streams, len(indices))):
        with torch.neuron.stream(stream):
            outputs.append(chunk.to(_neuron(index)))
    return tuple(outputs)


def _each(streams: Sequence[torch.Stream | None] | None, count: int) -> Sequence[torch.Stream | None]:
    if streams is None:
        return [None] * count
    if len(streams) != count:
        raise RuntimeError(f"Expected one stream per device ({count}), but got {len(streams)} streams")
    return streams


def _check_chunk_sizes(tensor: torch.Tensor, sizes: Sequence[int], dim: int) -> None:
    for size in sizes:
        if size <= 0:
            raise RuntimeError(f"Expected positive chunk size, but got {size}")
    if sum(sizes) != tensor.size(dim):
        raise RuntimeError(
            f"Expected chunk sizes to sum to {tensor.size(dim)} (the size of dimension {dim}), but got {sum(sizes)}"
        )


def gather(
    tensors: Sequence[torch.Tensor],
    dim: int = 0,
    destination: int | str | torch.device | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """`tensors` (on `neuron` devices) concatenated along `dim` on `destination` ("cpu", a `neuron` device, or the
    current device), or into `out`."""
    tensors = [_handle_complex(t) for t in tensors]
    if not tensors:
        raise RuntimeError("Expected at least one tensor to gather from")
    _check_on_neuron(tensors, "gather")
    first = tensors[0]
    dim = dim + first.dim() if dim < 0 else dim
    for i, tensor in enumerate(tensors):
        if tensor.dim() != first.dim() or any(
            a != b for k, (a, b) in enumerate(zip(tensor.shape, first.shape)) if k != dim
        ):
            raise RuntimeError(
                f"Input tensor at index {i} has shape {list(tensor.shape)}, which differs from the first tensor's "
                f"{list(first.shape)} in a dimension other than {dim}"
            )
    sizes = [t.size(dim) for t in tensors]
    size = list(first.shape)
    size[dim] = sum(sizes)
    if out is not None:
        if destination is not None:
            raise RuntimeError(
                f"'destination' must not be specified when 'out' is specified, but got destination={destination}"
            )
        if list(out.shape) != size:
            raise RuntimeError(f"Expected out tensor to have shape {size}, but got {list(out.shape)}")
    else:
        if destination == -1:
            warnings.warn(
                'Using -1 to represent CPU tensor is deprecated. Please use a device object or string instead, e.g., "cpu".',
                FutureWarning,
                stacklevel=2,
            )
        index = _get_device_index(destination, allow_cpu=True, optional=True)
        out = torch.empty(size, dtype=first.dtype, device="cpu" if index == -1 else _neuron(index))
    for chunk, tensor in zip(out.split(sizes, dim), tensors, strict=True):
        chunk.copy_(tensor)
    return out
