"""Legacy error behaviours with the documented codes and messages (``reference/nki.md`` §1, §2.4)."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl
import neuronxcc.nki.typing as nt
from nki import NkiError, NkiValidationError


def _raises(code: str, match: str | None = None):
    class _Ctx:
        def __enter__(self):
            self.cm = pytest.raises(NkiError, match=match)
            self.info = self.cm.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = self.cm.__exit__(*exc)
            assert self.info.value.code == code, self.info.value
            return handled

    return _Ctx()


def test_out_of_bound_access_message_and_mask_fix():
    def kernel(x, masked):
        out = nl.ndarray((128, 4000), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.mgrid[0:128, 0:512]
        for i in nl.affine_range(8):
            if masked:
                nl.store(out[t.p, i * 512 + t.x], value=0, mask=(i * 512 + t.x < 4000))
            else:
                nl.store(out[t.p, i * 512 + t.x], value=0)
        return out

    k = nki.jit(kernel)
    x = np.ones((128, 4000), np.float32)
    assert (k(x, True) == 0).all()
    msg = "Out-of-bound access for tensor `out` on dimension 1: index range [3584, 4095] exceed dimension size of 4000"
    with _raises("err_tensor_access_out_of_bound", re.escape(msg)) as info:
        k(x, False)
    assert info.value.lineno > 0 and "nl.store" in info.value.source


def test_mask_that_keeps_out_of_bound_elements_still_fails():
    @nki.jit
    def k(x):
        out = nl.ndarray((100, 8), dtype=x.dtype, buffer=nl.shared_hbm)
        ip, jf = nl.arange(128)[:, None], nl.arange(8)[None, :]
        nl.store(out[ip, jf], nl.load(x[ip, jf], mask=(ip < 100)), mask=(ip < 120))
        return out

    with _raises("err_tensor_access_out_of_bound", "dimension 0: index range"):
        k(np.ones((100, 8), np.float32))


def test_1d_arange_index_is_an_error():
    @nki.jit
    def k(x):
        return nl.load(x[nl.arange(128), 0])

    with _raises("err_1d_arange_not_supported"):
        k(np.ones((128, 4), np.float32))


def test_partition_limits():
    @nki.jit
    def alloc(x):
        nl.ndarray((256, 512), dtype=nl.float32, buffer=nl.sbuf)

    @nki.jit
    def load(x):
        nl.load(x)

    x = np.ones((256, 512), np.float32)
    with _raises("err_num_partition_exceed_arch_limit",
                 re.escape("Size of partition dimension 256 exceeds architecture limitation of 128.")):
        alloc(x)
    with _raises("err_num_partition_exceed_arch_limit",
                 re.escape("number of partitions 256 exceed architecture limitation of 128.")):
        load(x)


def test_partition_mismatch_message():
    @nki.jit
    def k(a, b):
        nisa.tensor_tensor(nl.load(a), nl.load(b), op=nl.add)

    msg = ("number of partitions (dimension 0 size of a tile) mismatch in parameters (data1[128, 512], "
           "data2[1, 512]) of 'tensor_tensor'")
    with _raises("err_num_partition_mismatch", re.escape(msg)):
        k(np.ones((128, 512), np.float32), np.ones((1, 512), np.float32))


def test_transpose_limits():
    @nki.jit
    def too_wide(x):
        nl.transpose(nl.load(x))

    @nki.jit
    def three_d(x):
        nl.transpose(nl.load(x))

    with _raises("err_size_of_dimension_exceed_arch_limit", re.escape(
            "size of dimension 1 in 'x[128, 512]' of 'transpose' exceed architecture limitation of 128.")):
        too_wide(np.ones((128, 512), np.float32))
    with _raises("err_exceed_max_supported_dimension", re.escape(
            "parameter 'x[64, 32, 2]' of 'transpose' exceed max supported number of dimensions of 2.")):
        three_d(np.ones((64, 32, 2), np.float32))


@pytest.mark.parametrize(("stat", "mov"), [((128, 256), (128, 512)), ((128, 128), (128, 1024))])
def test_matmul_tile_limits(stat, mov):
    @nki.jit
    def k(a, b):
        nisa.nc_matmul(nl.load(a), nl.load(b))

    with pytest.raises(NkiValidationError, match="exceed architecture limitation"):
        k(np.ones(stat, np.float32), np.ones(mov, np.float32))


def test_scope_rule_error_and_its_fix():
    def kernel(a, b, fixed):
        c = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        for i in range(4):
            if fixed:
                tmp = nl.ndarray(shape=a.shape, dtype=a.dtype)
                if i < 2:
                    tmp[...] = nl.load(a)
                else:
                    tmp[...] = nl.load(b)
                nl.store(c, tmp)
            else:
                if i < 2:
                    tmp = nl.load(a)
                else:
                    tmp = nl.load(b)
                nl.store(c, tmp)
        return c

    k = nki.jit(kernel)
    a, b = np.ones((8, 8), np.float32), np.full((8, 8), 2, np.float32)
    assert (k(a, b, True) == 2).all()
    with _raises("err_local_variable_used_out_of_scope", "Local variable 'tmp' is referenced outside of its parent "
                                                         "scope") as info:
        k(a, b, False)
    assert "nl.store(c, tmp)" in info.value.source


def test_shadowing_warning_then_scope_error_and_fix():
    def kernel(ptr, fixed):
        out = nl.ndarray(ptr.shape, dtype=ptr.dtype, buffer=nl.shared_hbm)
        data = nl.zeros((nl.par_dim(128), 128), dtype=np.float32)
        for i in nl.sequential_range(4):
            i_tile = nisa.iota(i + 0 * nl.arange(128)[None, :], dtype=nl.uint32).broadcast_to(data.shape)
            if fixed:
                data[...] = data + i_tile
            else:
                data = data + i_tile
        nl.store(out, value=data)
        return out

    k = nki.jit(kernel)
    x = np.zeros((128, 128), np.float32)
    assert (k(x, True) == 6).all()
    with pytest.warns(SyntaxWarning, match=re.escape(
            "shadowing local tensor 'float32 data[128, 128]' with a new object, use 'data[...] =' if you want to "
            "update the existing object")), _raises("err_local_variable_used_out_of_scope"):
        k(x, False)


def test_scalars_and_loop_indices_are_not_scoped():
    @nki.jit
    def k(x):
        out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
        for i in nl.affine_range(3):
            last = i * 2
        t = nl.full((1, 1), last + i, dtype=nl.int32)
        nl.store(out, t)
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert k(np.zeros(1, np.float32))[0, 0] == 6


def test_mutable_parameter_must_be_returned():
    def writes(x: nt.mutable_tensor, returns: bool):
        nl.store(x, nl.add(nl.load(x), 1.0))
        return x if returns else None

    k = nki.jit(writes)
    x = np.zeros((4, 4), np.float32)
    out = k(x, True)
    assert (x == 1).all() and np.shares_memory(out, x)
    with _raises("err_mutable_parameter_not_returned", "'x'"):
        k(x, False)


def test_api_outside_kernel_and_nested_spmd_call():
    with _raises("err_nki_api_outside_of_nki_kernel", "outside of NKI kernels"):
        nl.zeros((4, 4), nl.float32)

    @nki.jit(mode="trace")
    def sub(x):
        return nl.load(x)

    @nki.jit
    def top(x, grid):
        t = sub[grid](x) if grid else sub(x)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, t)
        return out

    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_array_equal(top(x, 0), x)
    with _raises("err_nested_kernel_with_spmd_grid"):
        top(x, 2)


def test_block_dimension_is_deprecated_but_counts_blocks_per_partition():
    @nki.jit
    def k(x):
        t = nl.ndarray((8, nl.par_dim(128), 4096), dtype=nl.float32, buffer=nl.sbuf)  # 128 KiB per partition
        t[0] = nl.load(x)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, t[0])
        return out

    x = np.ones((128, 4096), np.float32)
    with pytest.warns(DeprecationWarning, match="block dimensions"):
        np.testing.assert_array_equal(k(x), x)


def test_constant_ifs_open_no_scope_and_outer_none_is_updated():
    """Public kernels bind tensors under compile-time ``if``s (``if config.training: lse = nl.ndarray(...)``) and
    update an outer ``x = None`` inside loops; neither is a scope violation."""
    @nki.jit
    def k(x, training):
        if training:
            lse = nl.ndarray((4, 4), dtype=x.dtype, buffer=nl.shared_hbm)
        else:
            lse = None
        last = None
        for i in nl.affine_range(2):
            last = nl.load(x[i:i + 4])
        nl.store(lse, nl.add(last, 1.0))
        return lse

    x = np.arange(20, dtype=np.float32).reshape(5, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(k(x, True), x[1:] + 1)  # the last iteration's tile


def test_errors_in_shipped_tutorial_kernels_point_at_the_kernel_line():
    from neuronxcc.nki.tutorials import tensor_add

    a = np.ones((200, 512), np.float32)
    with _raises("err_tensor_access_out_of_bound") as info:
        tensor_add.tensor_add_kernel[2, 1](a, a)
    assert info.value.filename.endswith("tensor_add.py") and "nl.load" in info.value.source


def test_assigning_a_mismatched_tile_is_reported():
    @nki.jit
    def k(x):
        t = nl.ndarray((128, 128), dtype=x.dtype)
        t[...] = nl.load(x)

    with pytest.raises(NkiValidationError, match="mismatch"):
        k(np.ones((64, 256), np.float32))
