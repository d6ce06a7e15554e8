"""SPMD tensor addition: one [128, 512] tile per program, on one NeuronCore or sharded over two (``nl.nc``)."""

from __future__ import annotations

import neuronxcc.nki as nki
import neuronxcc.nki.language as nl


@nki.jit
def tensor_add_kernel(a_input, b_input):
    """Each SPMD instance adds one [128, 512] tile at (program_id(0), program_id(1))."""
    c_output = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
    offset_x = nl.program_id(0) * 128
    offset_y = nl.program_id(1) * 512
    ix = offset_x + nl.arange(128)[:, None]
    iy = offset_y + nl.arange(512)[None, :]
    a_tile = nl.load(a_input[ix, iy])
    b_tile = nl.load(b_input[ix, iy])
    c_tile = a_tile + b_tile
    nl.store(c_output[ix, iy], value=c_tile)
    return c_output


def tensor_add(a_input, b_input):
    """Launch one instance per tile on a single NeuronCore."""
    grid_x = a_input.shape[0] // 128
    grid_y = a_input.shape[1] // 512
    return tensor_add_kernel[grid_x, grid_y](a_input, b_input)


def tensor_add_nc2(a_input, b_input):
    """Shard the first grid dimension over two NeuronCores (interleaved: ``spmd_dim(n, nl.nc(2))``)."""
    grid_x = a_input.shape[0] // (128 * 2)
    grid_y = a_input.shape[1] // 512
    return tensor_add_kernel[nl.spmd_dim(grid_x, nl.nc(2)), grid_y](a_input, b_input)
