"""Each documented hardware limit: triggered, message checked, and the kernel source line named."""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

import nki
import nki.isa as nisa
import nki.language as nl
from nki._errors import NkiError, NkiValidationError


def _marked_line(fn) -> int:
    lines, start = inspect.getsourcelines(fn)
    for i, line in enumerate(lines):
        if "# <-- here" in line:
            return start + i
    raise AssertionError("no marker")


def check(kernel, args, message, code=None, grid=None):
    k = nki.jit(kernel)
    if grid:
        k = k[grid]
    with pytest.raises(nki.NkiValidationError, match=re.escape(message)) as ei:
        nki.simulate(k)(*args)
    err = ei.value
    assert isinstance(err, AssertionError)
    assert err.filename == __file__ and err.lineno == _marked_line(kernel), (err.filename, err.lineno)
    assert f"test_limits.py:{err.lineno}" in str(err)
    if code:
        assert err.code == code
    return err


def test_partition_dim_of_new_tile():
    def k():
        nl.ndarray((256, 4), nl.float32, buffer=nl.sbuf)  # <-- here

    check(k, (), "Size of partition dimension 256 exceeds architecture limitation of 128.",
          "err_num_partition_exceed_arch_limit")


def test_partition_dim_of_operand():
    def k(x):
        nl.load(x)  # <-- here

    check(k, (np.zeros((256, 4), np.float32),), "number of partitions 256 exceed architecture limitation of 128.",
          "err_num_partition_exceed_arch_limit")


def test_partition_mismatch_tensor_tensor():
    def k():
        a = nl.zeros((128, 512), nl.float32)
        b = nl.zeros((1, 512), nl.float32)
        d = nl.ndarray((128, 512), nl.float32)
        nisa.tensor_tensor(d, a, b, nl.add)  # <-- here

    check(k, (), "number of partitions (dimension 0 size of a tile) mismatch in parameters (data1[128, 512], "
                 "data2[1, 512]) of 'tensor_tensor'", "err_num_partition_mismatch")


def test_transpose_dimension_size():
    def k():
        x = nl.zeros((128, 512), nl.float32)
        nl.transpose(x)  # <-- here

    check(k, (), "size of dimension 1 in 'x[128, 512]' of 'transpose' exceed architecture limitation of 128.",
          "err_size_of_dimension_exceed_arch_limit")


def test_transpose_max_dimensions():
    def k():
        x = nl.zeros((64, 32, 2), nl.float32)
        nl.transpose(x)  # <-- here

    check(k, (), "parameter 'x[64, 32, 2]' of 'transpose' exceed max supported number of dimensions of 2.",
          "err_exceed_max_supported_dimension")


def test_out_of_bound_access():
    def k(x):
        for i in nl.affine_range(8):
            nl.load(x[:, i * 512:(i + 1) * 512])  # <-- here

    check(k, (np.zeros((128, 4000), np.float32),),
          "Out-of-bound access for tensor `x` on dimension 1: index range [3584, 4095] exceed dimension size of 4000",
          "err_tensor_access_out_of_bound")


def test_out_of_bound_ds_and_int_index():
    def k(x):
        nl.load(x[nl.ds(120, 16), 0:4])  # <-- here

    check(k, (np.zeros((128, 4), np.float32),),
          "Out-of-bound access for tensor `x` on dimension 0: index range [120, 135] exceed dimension size of 128")

    def k2(x):
        t = nl.load(x)
        t[:, 9]  # <-- here

    check(k2, (np.zeros((4, 8), np.float32),), "index range [9, 9] exceed dimension size of 8")


# nc_matmul(d[128, F], stationary[128, S], moving[128, F]) over its limit in one dimension
@pytest.mark.parametrize(("stationary_free", "free", "message", "code"), [
    pytest.param(128, 1024, "exceeding one PSUM bank of 2048 bytes", "err_psum_tile_exceed_bank",
                 id="psum_tile_exceeds_one_bank"),
    pytest.param(256, 512, "free size 256 of stationary[128, 256] of 'nc_matmul' exceed architecture limitation of "
                 "128", "err_size_of_dimension_exceed_arch_limit", id="stationary_free_limit"),
])
def test_matmul_tile_limits(stationary_free, free, message, code):
    def k():
        d = nl.ndarray((128, free), nl.float32, buffer=nl.psum)
        s = nl.zeros((128, stationary_free), nl.bfloat16)
        m = nl.zeros((128, free), nl.bfloat16)
        nisa.nc_matmul(d, s, m)  # <-- here

    check(k, (), message, code)


def test_matmul_moving_free_limit():
    def k():
        d = nl.ndarray((128, 256), nl.float32, buffer=nl.psum)
        s = nl.zeros((128, 128), nl.bfloat16)
        m = nl.zeros((128, 2, 512), nl.bfloat16)
        nisa.nc_matmul(d.reshape((128, 256)), s, m)  # <-- here

    check(k, (), "free size 1024 of moving[128, 2, 512] of 'nc_matmul' exceed architecture limitation of 512")


def test_matmul_contraction_limit_with_pe_tiling():
    def k():
        d = nl.ndarray((64, 512), nl.float32, buffer=nl.psum)
        s = nl.zeros((128, 64), nl.bfloat16)
        m = nl.zeros((128, 512), nl.bfloat16)
        nisa.nc_matmul(d, s, m, tile_position=(0, 0), tile_size=(64, 64))  # <-- here

    check(k, (), "contraction (partition) dimension 128 of 'nc_matmul' exceed architecture limitation of 64.")


def test_matmul_memory_types():
    def k():
        d = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
        s = nl.zeros((128, 128), nl.bfloat16)
        m = nl.zeros((128, 512), nl.bfloat16, buffer=nl.psum)
        nisa.nc_matmul(d, s, m)  # <-- here

    check(k, (), "Expected operand 'moving' of 'nc_matmul' to be in address space 'sbuf', but got a tile in 'psum'",
          "err_unsupported_memory")

    def k2():
        d = nl.ndarray((128, 512), nl.float32, buffer=nl.sbuf)
        s = nl.zeros((128, 128), nl.bfloat16)
        m = nl.zeros((128, 512), nl.bfloat16)
        nisa.nc_matmul(d, s, m)  # <-- here

    check(k2, (), "Expected operand 'dst' of 'nc_matmul' to be in address space 'psum'")


def test_tensor_tensor_inputs_not_both_psum():
    def k():
        a = nl.zeros((128, 128), nl.float32, buffer=nl.psum)
        b = nl.zeros((128, 128), nl.float32, buffer=nl.psum)
        d = nl.ndarray((128, 128), nl.float32)
        nisa.tensor_tensor(d, a, b, nl.add)  # <-- here

    check(k, (), "'tensor_tensor' cannot read both 'data1' and 'data2' from PSUM", "err_unsupported_memory")


def test_gpsimd_cannot_access_psum():
    def k():
        a = nl.zeros((128, 128), nl.float32, buffer=nl.psum)
        d = nl.ndarray((128, 128), nl.float32)
        nisa.tensor_copy(d, a, engine=nisa.engine.gpsimd)  # <-- here

    check(k, (), "GpSimd Engine cannot access PSUM", "err_unsupported_memory")


def test_compute_cannot_read_hbm():
    def k(x):
        nl.exp(x)  # <-- here

    check(k, (np.zeros((4, 4), np.float32),),
          "Expected operand 'x' of 'exp' to be in address space 'sbuf|psum', but got a tile in 'hbm' instead.")


def test_dma_cannot_read_psum():
    def k(x):
        p = nl.zeros((4, 4), nl.float32, buffer=nl.psum)
        nisa.dma_copy(dst=x, src=p)  # <-- here

    check(k, (np.zeros((4, 4), np.float32),), "dma_copy cannot read from PSUM")


def test_sbuf_capacity_single_tensor_per_target(monkeypatch):
    def k():
        nl.ndarray((128, 50000), nl.float32)  # <-- here   (200000 B/partition)

    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    check(k, (), "needs 200000 bytes per partition, exceeding the SBUF partition size of 196608 bytes on trn1",
          "err_out_of_memory")
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    nki.simulate(nki.jit(k))()  # fits in 224 KiB on trn2


def test_sbuf_capacity_live_allocations():
    def k():
        keep = [nl.ndarray((128, 20000), nl.float32) for _ in range(2)]
        nl.ndarray((128, 20000), nl.float32)  # <-- here
        return keep

    check(k, (), "SBUF capacity exceeded on trn2: allocating `tensor` [128, 20000] float32 (80000 bytes per "
                 "partition) with 160000 of 229376 bytes per partition already live", "err_out_of_memory")

    def ok():
        for _ in range(10):  # dropped tiles are freed
            nl.ndarray((128, 20000), nl.float32)

    nki.simulate(nki.jit(ok))()


def test_psum_capacity():
    def k():
        banks = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(8)]
        nl.ndarray((128, 512), nl.float32, buffer=nl.psum)  # <-- here
        return banks

    check(k, (), "PSUM capacity exceeded on trn2", "err_out_of_memory")


def test_bn_stats_free_limit():
    def k():
        x = nl.zeros((128, 1024), nl.float32)
        d = nl.ndarray((128, 6), nl.float32)
        nisa.bn_stats(d, x)  # <-- here

    check(k, (), "size of dimension 1 in 'data[128, 1024]' of 'bn_stats' exceed architecture limitation of 512.")


def test_reduce_partition_axis_rejected():
    def k():
        x = nl.zeros((128, 16), nl.float32)
        d = nl.ndarray((1, 16), nl.float32)
        nisa.tensor_reduce(d, nl.add, x, axis=0)  # <-- here

    check(k, (), "cannot reduce the partition axis")


def test_trn3_only_instruction_on_trn2():
    def k():
        x = nl.zeros((8, 8), nl.float32)
        nisa.activate2(x, nl.relu, x, 1.0, 0.0, nl.multiply, nl.add)  # <-- here

    check(k, (), "only available on NeuronCore-v4 (trn3), target is trn2", "err_unsupported_target")


def test_scalar_engine_limits():
    def k():
        x = nl.zeros((8, 8), nl.float32)
        nisa.tensor_scalar(x, x, nl.subtract, 1.0, engine=nisa.engine.scalar)  # <-- here

    check(k, (), "tensor_scalar on the Scalar Engine of trn2 supports (multiply, add)", "err_unsupported_engine")

    def k2():
        x = nl.zeros((2, 4096 + 1), nl.bfloat16, buffer=nl.psum)
        d = nl.ndarray((2, 4097), nl.float32)
        nisa.activation(d, nl.exp, x)  # <-- here

    check(k2, (), "reads 4097 elements per partition from PSUM, exceeding the Scalar Engine limit of 4096")


def test_scalar_bias_needs_trn2_or_newer(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")

    def k():
        x = nl.zeros((8, 8), nl.float32)
        nisa.activation(x, nl.exp, x, bias=1.0)  # <-- here

    check(k, (), "bias must be a [8, 1] vector on NeuronCore-v2")


def test_error_in_tutorial_kernel_names_tutorial_line():
    from nki.tutorials import matmul

    a = np.zeros((128, 64), np.float32)
    b = np.zeros((128, 1024), np.float32)
    with pytest.raises(nki.NkiValidationError) as ei:
        matmul.matmul_basic(a, b)  # moving free 1024 > 512
    assert ei.value.filename.endswith("tutorials/matmul.py") and "nc_matmul" in ei.value.source


# -- issue 19, item 12: the simulator never hangs or accepts the impossible ------------------------------------------


def _copy_kernel():
    @nki.jit
    def copy(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a))
        return out

    return copy


def test_a_loop_beyond_the_trip_count_limit_raises_before_running():
    @nki.jit
    def endless(a):
        for _ in nl.affine_range(10**12):  # ran "forever" before
            nl.load(a)
        return a

    with pytest.raises(NkiValidationError, match="affine_range: a loop of 1000000000000 iterations exceeds"):
        endless(np.ones((4, 4), np.float32))


@pytest.mark.parametrize("grid", [0, -2, (2, 0), 10**6])
def test_empty_negative_and_huge_grids_are_errors(grid):
    with pytest.raises(NkiValidationError, match="launch grid"):
        _copy_kernel()[grid](np.ones((4, 4), np.float32))


@pytest.mark.parametrize("dtype", [np.int32, np.float64])
def test_nc_matmul_rejects_what_the_tensor_engine_cannot_multiply(dtype):
    @nki.jit
    def matmul(a, b):
        out = nl.ndarray((4, 4), nl.float32, buffer=nl.shared_hbm)
        product = nl.ndarray((4, 4), nl.float32, buffer=nl.psum)
        nisa.nc_matmul(product, nl.load(a), nl.load(b))
        nl.store(out, nl.copy(product))
        return out

    a = np.ones((4, 4), dtype)
    with pytest.raises(NkiValidationError, match="nc_matmul: the Tensor Engine multiplies fp8, bf16"):
        matmul(a, a)
    assert matmul(a.astype(np.float32), a.astype(np.float32))[0, 0] == 4.0


def test_a_non_array_kernel_argument_is_named():
    with pytest.raises(NkiError, match="kernel argument `a` is a list"):
        _copy_kernel()([1.0, 2.0])


@pytest.mark.parametrize("grid", [2.0, 2.5, (2, 1.5), True, "2"])
def test_a_grid_that_is_not_integers_is_refused_by_name(grid):
    """A float grid was truncated (2.5 ran 2 instances) or failed with "'float' object is not iterable"."""
    with pytest.raises(NkiValidationError, match=r"launch grid .*: grid dimensions must be integers, got"):
        _copy_kernel()[grid](np.ones((4, 4), np.float32))


def test_a_float_argument_or_shape_is_refused_by_name():
    """A float where an array belongs failed with "'float' object has no attribute 'ndim'"; a float dimension was
    truncated (4.5 made 4)."""
    @nki.jit
    def load_it(a):
        out = nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a))
        return out

    with pytest.raises(NkiValidationError, match=r"load: `src` must be a tensor, got float 1\.5"):
        nki.simulate(load_it)(1.5)

    @nki.jit
    def shaped(a, size):
        out = nl.ndarray((4, size), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a))
        return out

    with pytest.raises(NkiValidationError, match=r"ndarray: shape \(4, 4\.5\) must be integers, got float 4\.5"):
        nki.simulate(shaped)(np.ones((4, 4), np.float32), 4.5)
