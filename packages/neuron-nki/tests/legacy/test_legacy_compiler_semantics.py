"""What the legacy compiler does for code AWS's public kernels rely on (issue 20 items 2-5), each as a minimal
kernel written from the NKI 0.1 documentation."""

from __future__ import annotations

import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
from nki import NkiError, NkiValidationError


@pytest.fixture
def rng():
    return np.random.default_rng(20)


def test_psum_matmul_operand_is_moved_to_sbuf_and_charged(rng):
    """An ``nc_transpose`` result lives in PSUM; used as an ``nc_matmul`` operand the compiler copies it to SBUF."""
    def transpose_then_matmul(a, b):
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        a_t = nisa.nc_transpose(nl.load(a))  # [128, 128] in PSUM
        nl.store(out, nl.copy(nisa.nc_matmul(a_t, nl.load(b))))
        return out

    a = rng.standard_normal((128, 128)).astype(np.float32)
    b = rng.standard_normal((128, 512)).astype(np.float32)
    k = nki.baremetal(transpose_then_matmul)
    np.testing.assert_allclose(k(a, b), a @ b, rtol=1e-4, atol=1e-4)
    counts = k.last_run.cost.instruction_counts
    assert counts["tensor_copy"] == 1 and counts["nc_matmul"] == 1  # the PSUM -> SBUF move is charged


def test_current_api_still_requires_sbuf_matmul_operands():
    import nki as cnki
    import nki.isa as cisa
    import nki.language as cnl

    def k():
        s = cnl.ndarray((128, 128), cnl.float32, buffer=cnl.psum)
        m = cnl.ndarray((128, 512), cnl.float32, buffer=cnl.sbuf)
        d = cnl.ndarray((128, 512), cnl.float32, buffer=cnl.psum)
        cisa.nc_matmul(d, s, m)

    with pytest.raises(NkiValidationError, match="address space 'sbuf'"):
        cnki.simulate(cnki.jit(k))()


def test_loop_reduce_into_subscripted_destination(rng):
    def reduce_into_slot(a):
        out = nl.ndarray((128, 3, 64), nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 3, 64), nl.float32)
        for i in nl.affine_range(a.shape[0]):
            acc[:, 1, :] = nl.loop_reduce(nl.load(a[i]), op=np.add,
                                          loop_indices=[i])
        nl.store(out, acc)
        return out

    a = rng.standard_normal((4, 128, 64)).astype(np.float32)
    out = nki.simulate_kernel(nki.jit(reduce_into_slot), a)
    np.testing.assert_allclose(out[:, 1], a.sum(0), rtol=1e-5, atol=1e-5)
    assert not out[:, 0].any() and not out[:, 2].any()


def test_integer_true_division_is_floating_point():
    def bucket(a):
        out = nl.ndarray((128, 16), nl.float32, buffer=nl.shared_hbm)
        i = nisa.iota(nl.arange(16)[None, :] + 0 * nl.arange(128)[:, None], dtype=nl.int32)
        q = i / 4
        assert q.dtype == nl.float32
        nl.store(out, nl.floor(q))
        return out

    out = nki.simulate_kernel(nki.jit(bucket), np.zeros(1, np.float32))
    np.testing.assert_array_equal(out, np.broadcast_to(np.floor(np.arange(16) / 4), (128, 16)))


def test_mask_limits_bounds_check_of_slice_access(rng):
    def ragged_rows(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        for t in nl.affine_range((a.shape[0] + 127) // 128):
            rows = t * 128 + i_p < a.shape[0]
            x = nl.load(a[t * 128:(t + 1) * 128, :], mask=rows)
            nl.store(out[t * 128:(t + 1) * 128, :], nl.multiply(x, 2.0), mask=rows)
        return out

    a = rng.standard_normal((200, 64)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(nki.jit(ragged_rows), a), 2 * a)


def test_unmasked_slice_past_the_end_is_still_out_of_bounds():
    def unmasked(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out[0:128, :], nl.load(a[128:256, :]))
        return out

    with pytest.raises(NkiValidationError, match=r"index range \[128, 255\] exceed dimension size of 200"):
        nki.simulate_kernel(nki.jit(unmasked), np.zeros((200, 8), np.float32))


def test_if_on_a_tile_takes_the_branch_with_a_warning():
    """NKI 0.1 traces ``if tile:`` as a true condition (the tile object is truthy); the hardware runs the branch."""
    def branch(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        if t:
            t = nl.multiply(t, 3.0)
        nl.store(out, t)
        return out

    a = np.zeros((4, 4), np.float32) - 1.0
    with pytest.warns(SyntaxWarning, match="always true"):
        out = nki.simulate_kernel(nki.jit(branch), a)
    np.testing.assert_array_equal(out, 3 * a)


def test_returning_an_sbuf_tile_stays_an_error():
    """Kernel outputs are HBM tensors on the hardware too, so this strictness is kept (docs/nki.md)."""
    def returns_tile(a):
        return nl.load(a)

    with pytest.raises(NkiError, match="outputs must be HBM"):
        nki.simulate_kernel(nki.jit(returns_tile), np.zeros((4, 4), np.float32))
