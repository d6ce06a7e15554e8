"""The fused Mamba selective-scan tutorial's three kernels, current NKI API (our port).

Same math as ``neuronxcc.nki.tutorials.mamba``: for each state ``n``,
``h[t] = exp(delta[t] * A[:, n]) * h[t - 1] + delta[t] * u[t] * B[n, t]`` and ``out += h * C[n]``, with channels on
partitions and the recurrence as one ``nisa.tensor_tensor_scan`` per tile. v1 puts states outside channel tiles,
v2 loads a channel tile's ``delta``/``u`` once for all states, v3 also tiles the sequence by 512 columns and
carries the scan's last column into the next tile.
"""

from __future__ import annotations

import nki
import nki.isa as nisa
import nki.language as nl

P = 128  # channels per tile (nl.tile_size.pmax)
SEQ_TILE = 512  # v3's sequence tile


def _row(src, width: int):
    """A [1, width] HBM row loaded into one partition, then broadcast to all 128 (as the tutorial does)."""
    return nl.broadcast_to(_load(src), (P, width))


def _add_state_term(acc, d_t, u_t, a_col, b_row, c_row, initial=0.0):
    """``acc += scan(exp(d * a), d * u * b) * c`` for one state over a [P, L] tile; returns the scan."""
    shape = d_t.shape
    decay = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=decay, op=nl.exp, data=d_t, scale=a_col)
    delta_u = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)  # its own tile, as in the tutorial
    nisa.tensor_tensor(dst=delta_u, data1=d_t, data2=u_t, op=nl.multiply)
    drive = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=drive, data1=delta_u, data2=b_row, op=nl.multiply)
    h = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor_scan(dst=h, data0=decay, data1=drive, initial=initial, op0=nl.multiply, op1=nl.add)
    term = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=term, data1=h, data2=c_row, op=nl.multiply)
    nisa.tensor_tensor(dst=acc, data1=acc, data2=term, op=nl.add)
    return h


def _load(src):
    t = nl.ndarray(src.shape, dtype=src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src)
    return t


def _zeros(shape):
    t = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=0.0)
    return t


@nki.jit
def mamba_v1(delta, u, A, B, C):
    """delta, u: [batch, channels, seq] fp32; A: [channels, state]; B, C: [batch, state, seq]."""
    batch, channels, seq = delta.shape
    assert channels % P == 0, "channels must be a multiple of 128"
    out = nl.ndarray(delta.shape, dtype=delta.dtype, buffer=nl.shared_hbm)
    tiles = channels // P
    for b in nl.affine_range(batch):
        accs = [_zeros((P, seq)) for _ in range(tiles)]
        for n in nl.affine_range(A.shape[1]):
            for c in nl.affine_range(tiles):
                rows = slice(c * P, (c + 1) * P)
                _add_state_term(accs[c], _load(delta[b, rows, :]), _load(u[b, rows, :]), _load(A[rows, n:n + 1]),
                                _row(B[b, n:n + 1, :], seq), _row(C[b, n:n + 1, :], seq))
        for c in nl.affine_range(tiles):
            nisa.dma_copy(dst=out[b, c * P:(c + 1) * P, :], src=accs[c])
    return out


@nki.jit
def mamba_v2(delta, u, A, B, C):
    """As v1 with the loops swapped: each channel tile's delta/u are loaded once for all states."""
    batch, channels, seq = delta.shape
    assert channels % P == 0, "channels must be a multiple of 128"
    out = nl.ndarray(delta.shape, dtype=delta.dtype, buffer=nl.shared_hbm)
    for b in nl.affine_range(batch):
        for c in nl.affine_range(channels // P):
            rows = slice(c * P, (c + 1) * P)
            acc = _zeros((P, seq))
            d_t, u_t = _load(delta[b, rows, :]), _load(u[b, rows, :])
            for n in nl.affine_range(A.shape[1]):
                _add_state_term(acc, d_t, u_t, _load(A[rows, n:n + 1]), _row(B[b, n:n + 1, :], seq),
                                _row(C[b, n:n + 1, :], seq))
            nisa.dma_copy(dst=out[b, rows, :], src=acc)
    return out


@nki.jit
def mamba_v3(delta, u, A, B, C):
    """As v2 with the sequence tiled by 512: the scan's last column seeds the next tile."""
    batch, channels, seq = delta.shape
    assert channels % P == 0 and seq % SEQ_TILE == 0, "channels % 128 == 0 and seq % 512 == 0 required"
    out = nl.ndarray(delta.shape, dtype=delta.dtype, buffer=nl.shared_hbm)
    for b in nl.affine_range(batch):
        for c in nl.affine_range(channels // P):
            rows = slice(c * P, (c + 1) * P)
            acc = _zeros((P, seq))
            d_t, u_t = _load(delta[b, rows, :]), _load(u[b, rows, :])
            for n in nl.affine_range(A.shape[1]):
                a_col = _load(A[rows, n:n + 1])
                carry = _zeros((P, 1))
                for s in nl.static_range(seq // SEQ_TILE):
                    cols = slice(s * SEQ_TILE, (s + 1) * SEQ_TILE)
                    h = _add_state_term(acc[:, cols], d_t[:, cols], u_t[:, cols], a_col,
                                        _row(B[b, n:n + 1, cols], SEQ_TILE), _row(C[b, n:n + 1, cols], SEQ_TILE),
                                        initial=carry)
                    nisa.tensor_copy(dst=carry, src=h[:, SEQ_TILE - 1:SEQ_TILE])
            nisa.dma_copy(dst=out[b, rows, :], src=acc)
    return out
