"""Our legacy-API ports of the classic tutorial kernels, each checked against NumPy (fp32, and bf16 where the
tutorial runs in bf16)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from nki_testutil import check_k1_on_trn1, k1_cases, mamba_inputs, mamba_reference

import neuronxcc.nki as nki
from neuronxcc.nki.tutorials import (
    attention,
    avgpool,
    flash_attention,
    layernorm,
    mamba,
    matmul,
    rmsnorm,
    rope,
    softmax,
    tensor_add,
    transpose2d,
)

BF16 = ml_dtypes.bfloat16
pytestmark = pytest.mark.filterwarnings("ignore:tensor .* has block dimensions:DeprecationWarning")


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def _close(out, ref, dtype):
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == BF16 else dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out, dtype=np.float32), np.asarray(ref, dtype=np.float32), **tol)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_spmd_tensor_add_single_core(rng, dtype):
    a = rng.random((256, 1024)).astype(dtype)
    b = rng.random((256, 1024)).astype(dtype)
    _close(tensor_add.tensor_add(a, b), a.astype(np.float32) + b.astype(np.float32), dtype)


def test_spmd_tensor_add_two_cores_costs_less_than_one(rng):
    a = rng.random((512, 1024)).astype(np.float32)
    b = rng.random((512, 1024)).astype(np.float32)
    np.testing.assert_array_equal(tensor_add.tensor_add_nc2(a, b), a + b)
    one = tensor_add.tensor_add_kernel[4, 2].run(a, b).cost
    two = tensor_add.tensor_add_kernel[nki.language.spmd_dim(2, nki.language.nc(2)), 2].run(a, b).cost
    assert len(one.per_core_latency_ns) == 1 and len(two.per_core_latency_ns) == 2
    assert two.latency_ns < one.latency_ns


def test_transpose2d(rng):
    x = rng.standard_normal((16, 6 * 4)).astype(np.float32)
    out = transpose2d.tensor_transpose2d_kernel(x, (6, 4))
    np.testing.assert_array_equal(out, x.reshape(16, 6, 4).transpose(0, 2, 1).reshape(16, 24))


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_average_pool(rng, dtype):
    x = rng.standard_normal((8, 16, 12)).astype(dtype)
    ref = x.astype(np.float32).reshape(8, 8, 2, 6, 2).mean(axis=(2, 4))
    _close(tensor_avgpool := avgpool.tensor_avgpool_kernel(x, 2), ref, dtype)
    assert tensor_avgpool.shape == (8, 8, 6)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_matmul_basic(rng, dtype):
    lhsT = rng.standard_normal((128, 64)).astype(dtype)
    rhs = rng.standard_normal((128, 512)).astype(dtype)
    _close(matmul.matmul_basic(lhsT, rhs), lhsT.astype(np.float32).T @ rhs.astype(np.float32), dtype)


@pytest.mark.parametrize("step", ["matmul_tiled", "matmul_hoist_load", "matmul_block_free_dimension",
                                  "matmul_fully_optimized"])
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_matmul_optimisation_steps(rng, step, dtype):
    K, M, N = 512, 256, 1024
    lhsT = rng.standard_normal((K, M)).astype(dtype)
    rhs = rng.standard_normal((K, N)).astype(dtype)
    ref = lhsT.astype(np.float32).T @ rhs.astype(np.float32)
    out = getattr(matmul, step)(lhsT, rhs)
    np.testing.assert_allclose(out.astype(np.float32), ref, rtol=1e-4 if dtype == np.float32 else 2e-2,
                               atol=1e-3 if dtype == np.float32 else 0.5)


def test_matmul_steps_get_cheaper(rng):
    """The simulated cost reflects the tutorial's point: hoisting and blocking reduce DMA traffic."""
    lhsT = rng.standard_normal((512, 256)).astype(BF16)
    rhs = rng.standard_normal((512, 1024)).astype(BF16)
    hbm = [getattr(matmul, s).run(lhsT, rhs).cost.hbm_bytes
           for s in ("matmul_tiled", "matmul_hoist_load", "matmul_block_free_dimension")]
    assert hbm[0] > hbm[1] > hbm[2]


def _rmsnorm_ref(a, g):
    a = a.astype(np.float32)
    return a / np.sqrt(np.mean(a * a, axis=1, keepdims=True)) * g.astype(np.float32)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_rmsnorm_with_ragged_last_tile(rng, dtype):
    a = rng.standard_normal((250, 64)).astype(dtype)
    g = rng.standard_normal(64).astype(dtype)
    _close(rmsnorm.rmsnorm_kernel(a, g), _rmsnorm_ref(a, g), dtype)


@pytest.mark.parametrize("shape", [(256, 512), (200, 700)])
@pytest.mark.parametrize("version", ["layernorm_kernel_v1", "layernorm_kernel"])
@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_layernorm(rng, shape, version, dtype):
    x = rng.standard_normal(shape).astype(dtype)
    gamma = rng.standard_normal(shape[1]).astype(dtype)
    beta = rng.standard_normal(shape[1]).astype(dtype)
    out = getattr(layernorm, version)(x, 1e-5, gamma, beta)
    xf, g, b = (t.astype(np.float32) for t in (x, gamma, beta))
    ref = (xf - xf.mean(1, keepdims=True)) / np.sqrt(xf.var(1, keepdims=True) + 1e-5) * g + b
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else dict(rtol=2e-2, atol=5e-2)
    np.testing.assert_allclose(out.astype(np.float32), ref, **tol)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_softmax(rng, dtype):
    x = (rng.standard_normal((300, 96)) * 4).astype(dtype)
    xf = x.astype(np.float32)
    e = np.exp(xf - xf.max(1, keepdims=True))
    _close(softmax.softmax_kernel(x), e / e.sum(1, keepdims=True), dtype)


def _attention_ref(q, k, v, causal):
    q, k, v = (t.astype(np.float32) for t in (q, k, v))
    s = q @ k.T / np.sqrt(q.shape[1])
    if causal:
        s = np.where(np.tril(np.ones_like(s)) > 0, s, -9984.0)
    p = np.exp(s - s.max(1, keepdims=True))
    return (p / p.sum(1, keepdims=True)) @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mixed", [False, True])
def test_fused_self_attention(rng, causal, mixed):
    q, k, v = (rng.standard_normal((256, 64)).astype(np.float32) for _ in range(3))
    out = attention.fused_self_attn_kernel(q, k, v, use_causal_mask=causal, mixed_precision=mixed)
    tol = 2e-2 if mixed else 1e-4
    np.testing.assert_allclose(out, _attention_ref(q, k, v, causal), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_rotary_embedding(rng, dtype):
    S, D = 256, 64
    x = rng.standard_normal((S, D)).astype(dtype)
    theta = np.arange(S)[:, None] / (10000 ** (np.arange(D // 2)[None, :] * 2 / D))
    cos, sin = np.cos(theta).astype(dtype), np.sin(theta).astype(dtype)
    xf, cf, sf = (t.astype(np.float32) for t in (x, cos, sin))
    x1, x2 = xf[:, :D // 2], xf[:, D // 2:]
    ref = np.concatenate([x1 * cf - x2 * sf, x2 * cf + x1 * sf], axis=1)
    _close(rope.rope_kernel(x, cos, sin), ref, dtype)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_forward(rng, causal):
    bs, heads, d, seq = 1, 2, 64, 1024
    q, k = (rng.standard_normal((bs, heads, d, seq)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((bs, heads, seq, d)).astype(np.float32)
    out = flash_attention.flash_attention_fwd[bs, heads](q, k, v, use_causal_mask=causal)
    for hh in range(heads):
        ref = _attention_ref(q[0, hh].T, k[0, hh].T, v[0, hh], causal)
        np.testing.assert_allclose(out[0, hh], ref, rtol=3e-2, atol=3e-2)


# calibration.md's K1 kernels on trn1; the blocked one with the tutorial's 16 x 2 x 8 tile blocks
K1_KERNELS = [(matmul.matmul_tiled, {}), (matmul.matmul_hoist_load, {}), (matmul.matmul_block_free_dimension, {}),
              (matmul.matmul_fully_optimized, {"tiles_in_block_m": 16, "tiles_in_block_n": 2, "tiles_in_block_k": 8})]


@pytest.mark.parametrize(("kernel", "kw", "shape"), k1_cases(K1_KERNELS))
def test_k1_matmul_kernels_on_trn1(kernel, kw, shape, monkeypatch):
    def run(lhsT, rhs):
        k = nki.baremetal(kernel)
        return k(lhsT, rhs, **kw), k.last_run.cost

    check_k1_on_trn1(run, shape, monkeypatch)


@pytest.mark.parametrize("kernel", [mamba.mamba_v1, mamba.mamba_v2, mamba.mamba_v3], ids=lambda k: k.__name__)
def test_mamba(kernel, rng):
    args = mamba_inputs(rng, batch=2, channels=256, seq=1024, states=3)
    np.testing.assert_allclose(kernel(*args), mamba_reference(*args), rtol=1e-4, atol=1e-4)
