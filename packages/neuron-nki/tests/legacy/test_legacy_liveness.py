"""On-chip allocation by live range (issue 20 item 1): a tile is dead after its last use, whatever Python
names still hold it; the capacity error stays for tiles that really are live together."""

from __future__ import annotations

import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.language as nl
from nki import NkiValidationError

TILE = (128, 16384)  # float32: 65536 bytes per partition; trn1's SBUF partition holds 196608 (three tiles)


@pytest.fixture(autouse=True)
def _trn1(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")


def _cost(kernel, *args):
    k = nki.baremetal(kernel)
    out = k(*args)
    return out, k.last_run.cost


def test_chain_of_dead_tiles_fits():
    def chain(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        x = nl.load(a)
        y = nl.exp(x)
        z = nl.exp(y)
        w = nl.exp(z)  # x and y are dead here although still bound
        nl.store(out, w)
        return out

    a = np.full(TILE, 0.01, np.float32)
    out, cost = _cost(chain, a)
    np.testing.assert_allclose(out, np.exp(np.exp(np.exp(a))), rtol=1e-5)
    assert cost.sbuf_peak_bytes_per_partition == 2 * 65536  # an input and its result


def test_augmented_assignment_updates_in_place():
    def accumulate(a, b):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        acc = nl.load(a)
        x = nl.load(b)
        acc += x
        acc *= x
        acc -= 1.0
        nl.store(out, acc)
        return out

    a, b = np.full(TILE, 2.0, np.float32), np.full(TILE, 3.0, np.float32)
    out, cost = _cost(accumulate, a, b)
    np.testing.assert_array_equal(out, (a + b) * b - 1.0)
    assert cost.sbuf_peak_bytes_per_partition == 2 * 65536  # no temporary for +=, *=, -=


def test_loop_body_tiles_die_each_iteration():
    def row_sum(a):
        out = nl.ndarray((128, 2048), a.dtype, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 2048), nl.float32)
        for i in nl.affine_range(a.shape[1] // 2048):
            t = nl.load(a[:, i * 2048:(i + 1) * 2048])
            s = nl.multiply(t, 2.0)
            acc += s
        nl.store(out, acc)
        return out

    a = np.arange(128 * 8192, dtype=np.float32).reshape(128, 8192) % 7
    out, cost = _cost(row_sum, a)
    np.testing.assert_allclose(out, 2 * a.reshape(128, 4, 2048).sum(1))
    assert cost.sbuf_peak_bytes_per_partition == 3 * 8192  # acc, one t and its s: not one per iteration


def test_tiles_live_together_still_exceed_capacity():
    def too_many(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        x = nl.load(a)
        y = nl.exp(x)
        z = nl.exp(y)
        w = nl.exp(z)  # <-- x is used below, so x, y, z and w are live together
        nl.store(out, nl.add(nl.add(x, y), nl.add(z, w)))
        return out

    with pytest.raises(NkiValidationError, match=r"SBUF capacity exceeded on trn1: allocating .*\[128, 16384\] "
                                                    r"float32 \(65536 bytes per partition\) with 196608 of 196608 "
                                                    r"bytes per partition already live") as ei:
        nki.simulate_kernel(nki.jit(too_many), np.zeros(TILE, np.float32))
    assert ei.value.code == "err_out_of_memory"
    assert "w = nl.exp(z)" in str(ei.value)


@pytest.mark.filterwarnings("ignore:tensor .keep. has block dimensions:DeprecationWarning")
def test_psum_accumulator_live_across_loop():
    def psum_banks(a):
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        keep = nl.zeros((8, nl.par_dim(128), 512), nl.float32, buffer=nl.psum)  # all eight banks
        for _ in nl.affine_range(2):
            extra = nl.zeros((128, 512), nl.float32, buffer=nl.psum)  # <-- no bank is free: keep is used below
            nl.store(out, nl.add(extra, 1.0))
        nl.store(out, nl.copy(keep[0]))
        return out

    with pytest.raises(NkiValidationError, match="PSUM capacity exceeded on trn1") as ei:
        nki.simulate_kernel(nki.jit(psum_banks), np.zeros((128, 512), np.float32))
    assert "extra = nl.zeros" in str(ei.value)
