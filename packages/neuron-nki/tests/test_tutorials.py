"""Our current-API ports of the classic NKI tutorial kernels, against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from nki_testutil import bf16, check_k1_on_trn1, k1_cases, mamba_inputs, mamba_reference

from nki.tutorials import attention, elementwise, mamba, matmul, norms


def f32(a):
    return np.asarray(a).astype(np.float32)


@pytest.mark.parametrize("dtype", [np.float32, "bf16"])
def test_spmd_tensor_add(dtype, rng):
    a, b = rng.standard_normal((256, 1024)), rng.standard_normal((256, 1024))
    a, b = (bf16(a), bf16(b)) if dtype == "bf16" else (a.astype(np.float32), b.astype(np.float32))
    out = elementwise.tensor_add[2, 2](a, b)
    ref = f32(a) + f32(b)
    if dtype == "bf16":
        np.testing.assert_array_equal(out, bf16(ref))
    else:
        np.testing.assert_allclose(out, ref)


def test_transpose2d(rng):
    x = rng.standard_normal((128, 6 * 10)).astype(np.float32)
    out = elementwise.transpose2d(x, 6, 10)
    np.testing.assert_array_equal(out, x.reshape(128, 6, 10).transpose(0, 2, 1).reshape(128, 60))


@pytest.mark.parametrize("dtype", [np.float32, "bf16"])
def test_avg_pool2d(dtype, rng):
    x = rng.standard_normal((64, 16, 24))
    x = bf16(x) if dtype == "bf16" else x.astype(np.float32)
    out = elementwise.avg_pool2d(x, 4)
    ref = f32(x).reshape(64, 4, 4, 6, 4).mean(axis=(2, 4))
    np.testing.assert_allclose(f32(out), ref, rtol=1e-2 if dtype == "bf16" else 1e-5, atol=1e-2 if dtype == "bf16"
                               else 1e-6)


def test_matmul_basic(rng):
    a, b = bf16(rng.standard_normal((128, 64))), bf16(rng.standard_normal((128, 512)))
    np.testing.assert_allclose(f32(matmul.matmul_basic(a, b)), f32(a).T @ f32(b), rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("step", matmul.STEPS[1:], ids=lambda k: k.__name__)
def test_matmul_steps(step, rng):
    K, M, N = 512, 1024, 1024
    a, b = bf16(rng.standard_normal((K, M))), bf16(rng.standard_normal((K, N)))
    kw = {"TILES_K": 4} if step is matmul.matmul_fully_optimized else {}
    out = step(a, b, **kw)
    assert out.dtype == a.dtype
    ref = f32(a).T @ f32(b)
    np.testing.assert_allclose(f32(out), ref, rtol=2e-2, atol=0.25)  # bf16 output of K=512 sums


def test_matmul_fp32_exact_enough(rng):
    a = rng.standard_normal((256, 256)).astype(np.float32)
    b = rng.standard_normal((256, 1024)).astype(np.float32)
    out = matmul.matmul_tiled(a, b)
    np.testing.assert_allclose(out, a.T @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("N", [256, 200])
def test_rmsnorm(N, rng):
    x = rng.standard_normal((N, 384)).astype(np.float32)
    w = rng.standard_normal(384).astype(np.float32)
    ref = x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(norms.rmsnorm(x, w), ref, rtol=1e-4, atol=1e-5)


def test_rmsnorm_bf16(rng):
    x, w = bf16(rng.standard_normal((128, 256))), rng.standard_normal(256).astype(np.float32)
    xf = f32(x)
    ref = xf / np.sqrt((xf * xf).mean(1, keepdims=True) + 1e-6) * w
    out = norms.rmsnorm(x, w)
    assert out.dtype == x.dtype
    np.testing.assert_allclose(f32(out), ref, rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("D", [512, 1000])
def test_layernorm_bn_stats(D, rng):
    x = (rng.standard_normal((192, D)) * 2 + 0.5).astype(np.float32)
    g, b = rng.standard_normal(D).astype(np.float32), rng.standard_normal(D).astype(np.float32)
    ref = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5) * g + b
    np.testing.assert_allclose(norms.layernorm(x, g, b), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float32, "bf16"])
def test_softmax(dtype, rng):
    x = rng.standard_normal((300, 256)) * 4
    x = bf16(x) if dtype == "bf16" else x.astype(np.float32)
    xf = f32(x)
    e = np.exp(xf - xf.max(1, keepdims=True))
    ref = e / e.sum(1, keepdims=True)
    np.testing.assert_allclose(f32(norms.softmax(x)), ref, rtol=1e-2 if dtype == "bf16" else 1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, "bf16"])
def test_fused_self_attention(dtype, rng):
    S, d = 640, 64
    q, k, v = (rng.standard_normal((S, d)) for _ in range(3))
    if dtype == "bf16":
        q, k, v = bf16(q), bf16(k), bf16(v)
    else:
        q, k, v = (a.astype(np.float32) for a in (q, k, v))
    out = attention.fused_self_attention(np.ascontiguousarray(q.T), np.ascontiguousarray(k.T), v)
    s = f32(q) @ f32(k).T / np.sqrt(d)
    p = np.exp(s - s.max(1, keepdims=True))
    ref = (p / p.sum(1, keepdims=True)) @ f32(v)
    tol = 3e-2 if dtype == "bf16" else 1e-4
    np.testing.assert_allclose(f32(out), ref, rtol=tol, atol=tol)


def test_rotary_embedding(rng):
    S, D = 200, 64
    x = rng.standard_normal((S, D)).astype(np.float32)
    theta = rng.uniform(0, 6.28, (S, D // 2)).astype(np.float32)
    c, s = np.cos(theta), np.sin(theta)
    out = attention.rotary_embedding(x, c, s)
    x1, x2 = x[:, :32], x[:, 32:]
    ref = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=1)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


# The four K1 kernels of calibration.md (tiled; hoisted loads; blocked M/N; blocked M/N/K with the tutorial's
# 16x128 M, 2x512 N, 8x128 K blocks) on trn1, where the blocked kernel only fits by live ranges.
K1_KERNELS = [(matmul.matmul_tiled, {}), (matmul.matmul_hoist_load, {}), (matmul.matmul_block_free, {}),
              (matmul.matmul_fully_optimized, {"TILES_M": 16, "TILES_N": 2, "TILES_K": 8})]


@pytest.mark.parametrize(("kernel", "kw", "shape"), k1_cases(K1_KERNELS))
def test_k1_matmul_kernels_on_trn1(kernel, kw, shape, monkeypatch):
    def run(lhsT, rhs):
        result = kernel.run(lhsT, rhs, **kw)
        return result.outputs, result.cost

    check_k1_on_trn1(run, shape, monkeypatch)


def test_layernorm_v1_and_v2(rng):
    x = rng.standard_normal((200, 1000)).astype(np.float32) + 3.0
    g, b = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
    ref = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5) * g + b
    for kernel in (norms.layernorm_v1, norms.layernorm):
        np.testing.assert_allclose(kernel(x, g, b), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel", [mamba.mamba_v1, mamba.mamba_v2, mamba.mamba_v3], ids=lambda k: k.__name__)
def test_mamba(kernel, rng):
    args = mamba_inputs(rng, batch=2, channels=256, seq=1024, states=3)
    np.testing.assert_allclose(kernel(*args), mamba_reference(*args), rtol=1e-4, atol=1e-4)
