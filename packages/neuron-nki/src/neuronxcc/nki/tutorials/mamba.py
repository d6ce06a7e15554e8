"""The fused Mamba selective-scan tutorial's three kernels, legacy API (our port).

For every batch ``b``, channel ``c``, state ``n`` and step ``t``::

    h[t] = exp(delta[b, c, t] * A[c, n]) * h[t - 1] + delta[b, c, t] * u[b, c, t] * B[b, n, t]
    out[b, c, t] = sum_n h[t] * C[b, n, t]

Channels map to partitions (128 per tile), the sequence to the free axis; the recurrence is one
``nisa.tensor_tensor_scan`` per tile.

* ``mamba_v1``: states outside channel tiles: every (state, channel tile) reloads ``delta``/``u``; partial sums in
  an SBUF block holding all channel tiles of a batch.
* ``mamba_v2``: loop reordered: a channel tile's ``delta``/``u`` are loaded once and reused by every state.
* ``mamba_v3``: the sequence is tiled by 512 columns; the scan carries its last column into the next tile, and
  each tile's product is formed in PSUM before it is added to the accumulator.
"""

from __future__ import annotations

import numpy as np

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

P = 128  # channels per tile (nl.tile_size.pmax)
SEQ_TILE = 512  # v3's sequence tile


def _state_term(delta_t, u_t, a_col, b_row, c_row, initial=0):
    """One state's contribution ``scan(exp(delta * a), delta * u * b) * c`` for a [P, L] tile, and its scan."""
    decay = nisa.activation(op=nl.exp, data=delta_t, scale=a_col)
    drive = nisa.tensor_tensor(nisa.tensor_tensor(delta_t, u_t, op=nl.multiply),
                               b_row.broadcast_to(delta_t.shape), op=nl.multiply)
    h = nisa.tensor_tensor_scan(decay, drive, initial=initial, op0=np.multiply, op1=np.add)
    return nisa.tensor_tensor(h, c_row.broadcast_to(delta_t.shape), op=nl.multiply), h


@nki.jit
def mamba_v1(delta, u, A, B, C):
    """delta, u: [batch, channels, seq]; A: [channels, state]; B, C: [batch, state, seq]."""
    batch, channels, seq = delta.shape
    states = A.shape[1]
    assert channels % P == 0, "channels must be a multiple of 128"
    out = nl.ndarray(delta.shape, dtype=delta.dtype, buffer=nl.shared_hbm)
    tiles = channels // P
    for b in nl.affine_range(batch):
        acc = nl.zeros((tiles, nl.par_dim(P), seq), dtype=delta.dtype)
        for n in nl.affine_range(states):
            for c in nl.affine_range(tiles):
                rows = slice(c * P, (c + 1) * P)
                term, _ = _state_term(nl.load(delta[b, rows, :]), nl.load(u[b, rows, :]), nl.load(A[rows, n]),
                                      nl.load(B[b, n:n + 1, :]), nl.load(C[b, n:n + 1, :]))
                acc[c, :, :] += term
        for c in nl.affine_range(tiles):
            nl.store(out[b, c * P:(c + 1) * P, :], acc[c, :, :])
    return out


@nki.jit
def mamba_v2(delta, u, A, B, C):
    """As v1 with the loops swapped: each channel tile's delta/u are loaded once for all states."""
    batch, channels, seq = delta.shape
    states = A.shape[1]
    assert channels % P == 0, "channels must be a multiple of 128"
    out = nl.ndarray(delta.shape, dtype=delta.dtype, buffer=nl.shared_hbm)
    for b in nl.affine_range(batch):
        for c in nl.affine_range(channels // P):
            rows = slice(c * P, (c + 1) * P)
            acc = nl.zeros((nl.par_dim(P), seq), dtype=delta.dtype)
            d_t = nl.load(delta[b, rows, :])
            u_t = nl.load(u[b, rows, :])
            for n in nl.affine_range(states):
                term, _ = _state_term(d_t, u_t, nl.load(A[rows, n]), nl.load(B[b, n:n + 1, :]),
                                      nl.load(C[b, n:n + 1, :]))
                acc += term
            nl.store(out[b, rows, :], acc)
    return out


@nki.jit
def mamba_v3(delta, u, A, B, C):
    """As v2 with the sequence tiled by 512: the scan's last column seeds the next tile."""
    batch, channels, seq = delta.shape
    states = A.shape[1]
    assert channels % P == 0 and seq % SEQ_TILE == 0, "channels % 128 == 0 and seq % 512 == 0 required"
    out = nl.ndarray(delta.shape, dtype=delta.dtype, buffer=nl.shared_hbm)
    for b in nl.affine_range(batch):
        for c in nl.affine_range(channels // P):
            rows = slice(c * P, (c + 1) * P)
            acc = nl.zeros((nl.par_dim(P), seq), dtype=delta.dtype)
            d_t = nl.load(delta[b, rows, :])
            u_t = nl.load(u[b, rows, :])
            for n in nl.affine_range(states):
                a_col = nl.load(A[rows, n])
                carry = nl.zeros((P, 1), dtype=delta.dtype)
                for s in nl.static_range(seq // SEQ_TILE):
                    cols = slice(s * SEQ_TILE, (s + 1) * SEQ_TILE)
                    term, h = _state_term(d_t[:, cols], u_t[:, cols], a_col, nl.load(B[b, n:n + 1, cols]),
                                          nl.load(C[b, n:n + 1, cols]), initial=carry)
                    carry[...] = h[:, SEQ_TILE - 1]
                    in_psum = nl.ndarray((P, SEQ_TILE), dtype=delta.dtype, buffer=nl.psum)
                    in_psum[...] = term
                    acc[:, cols] += in_psum
            nl.store(out[b, rows, :], acc)
    return out
