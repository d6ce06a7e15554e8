"""Coverage of the reference/nki.md §2 API tables by the current API (``nki``, ``nki.language``, ``nki.isa``).

Counting: every name in §2.1-§2.3 that exists in the current (0.x) API, incl. 0.x additions, dtypes, buffers,
enums and NkiTensor methods. Legacy-only names (``nl.arange``, ``mgrid``, ``par_dim``, ``spmd_dim``, ``nc``,
``loop_reduce``, ``all_reduce``, ``nki.simulate_kernel``, ``baremetal``, ``profile``, ``nki.compiler``, ``mask=``)
belong to the legacy ``neuronxcc.nki`` layer and are counted there. A name is "implemented" if it exists and is
not marked ``_nki_unimplemented`` (those raise NotImplementedError naming themselves).
"""

from __future__ import annotations

import nki
import nki.isa as nisa
import nki.language as nl
from nki._tensor import NkiTensor

TOP = ["jit", "simulate", "benchmark"]
NL = """ndarray zeros ones full rand empty_like zeros_like shared_constant shared_identity_matrix
sbuf psum hbm private_hbm shared_hbm load store load_transpose2d atomic_rmw ds
affine_range sequential_range static_range dynamic_range fori_loop while_loop program_id num_programs program_ndim
add subtract multiply divide maximum minimum power fmod mod equal not_equal less less_equal greater greater_equal
logical_and logical_or logical_xor bitwise_and bitwise_or bitwise_xor left_shift right_shift abs_max abs_min
exp log sqrt rsqrt reciprocal abs negative sign square sin cos tan arctan tanh ceil floor trunc invert logical_not
sigmoid relu gelu gelu_dx gelu_apprx_tanh gelu_apprx_sigmoid gelu_apprx_sigmoid_dx silu silu_dx softplus mish erf
erf_dx copy sum max min mean prod all var matmul transpose softmax rms_norm where dropout random_seed expand_dims
broadcast_to gather_flattened device_print static_cast gemm_grid finfo no_reorder is_sbuf is_psum is_hbm is_on_chip
bool_ int8 int16 int32 uint8 uint16 uint32 float16 float32 bfloat16 tfloat32 float8_e4m3 float8_e5m2 float8_e4m3fn
float8_e8m0fnu float8_e5m2_x4 float8_e4m3fn_x4 float4_e2m1fn_x4 tile_size fp32""".split()
TILE_SIZE = """pmax psum_fmax psum_bank_fmax psum_bank_fmax_bytes psum_num_banks sbuf_size_bytes sbuf_fmax
sbuf_fmax_bytes gemm_stationary_fmax gemm_moving_fmax bn_stats_fmax psum_min_align sbuf_min_align""".split()
TENSOR = "ap reshape permute broadcast rearrange view indirect select slice".split()
ISA = """nc_matmul nc_transpose activation activation_reduce tensor_tensor tensor_scalar tensor_reduce
tensor_partition_reduce tensor_copy memset iota affine_select dma_copy dma_transpose bn_stats bn_aggr reciprocal
tensor_tensor_scan scalar_tensor_tensor tensor_scalar_reduce tensor_copy_predicated select_reduce range_select
local_gather nc_stream_shuffle max8 nc_find_index8 nc_match_replace8 dropout sequence_bounds get_nc_version
nc_matmul_mx quantize_mx exponential activate2 rng rand2 register_alloc register_move register_load
register_store core_barrier sendrecv dma_compute topk nonzero_with_count
engine reduce_cmd dge_mode oob_mode nc_version""".split()


def coverage():
    entries = [(nki, n) for n in TOP] + [(nl, n) for n in NL] + [(NkiTensor, n) for n in TENSOR] + [
        (nisa, n) for n in ISA]
    missing, unimpl, impl = [], [], []
    for mod, name in entries:
        label = f"{getattr(mod, '__name__', mod)}.{name}"
        if not hasattr(mod, name):
            missing.append(label)
            continue
        obj = getattr(mod, name)
        (unimpl if getattr(obj, "_nki_unimplemented", False) else impl).append(label)
    for a in TILE_SIZE:
        (impl if hasattr(nl.tile_size, a) else missing).append(f"nl.tile_size.{a}")
    return impl, unimpl, missing


def test_every_table_entry_exists_and_coverage_at_least_90_percent():
    impl, unimpl, missing = coverage()
    total = len(impl) + len(unimpl) + len(missing)
    print(f"\n§2 coverage: {len(impl)}/{total} implemented = {100 * len(impl) / total:.1f} %; "
          f"NotImplemented: {unimpl}")
    assert not missing, missing
    assert len(impl) / total >= 0.9


def test_unimplemented_entries_raise_naming_themselves():
    import pytest

    _, unimpl, _ = coverage()
    for label in unimpl:
        mod_name, name = label.rsplit(".", 1)
        obj = getattr({"nki.isa": nisa, "nki.language": nl}.get(mod_name, NkiTensor), name)
        with pytest.raises(NotImplementedError, match=name):
            obj(None) if mod_name != "NkiTensor" else obj(None, None)
