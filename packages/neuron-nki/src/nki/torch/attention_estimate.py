"""The flash-attention kernels' simulated latency at any size, from a few small simulations (plan mode's estimate).

Plan mode charges an attention call the NKI kernel's simulated latency for the call's signature. Simulating the
kernel instruction by instruction at a 70B model's size (64 heads x 8,192 tokens: 2,080 causal tile pairs a head,
forward and backward) takes minutes of host time. The latency has a structure that makes it unnecessary, and that
structure is checked on every signature rather than assumed:

* the launch grid's instances (a query head forward, a KV head and its query-head group backward) do the same
  work, so after the first few each further instance adds the same time (on one logical core, and on LNC 2's two,
  which share the DMA engines and HBM): the latency is linear in the number of instances;
* with Sq = Sk it is a quadratic polynomial in the number of 128-row sequence tiles (every query tile visits every
  key tile, or the causal half of them), the last tile keeping its ragged size.

So the kernel runs on small samples (batch 1; two instance counts x three tile counts), the linear x quadratic model
goes exactly through them, and one more sample (a third instance count, a fourth tile count) must agree with what
the model predicts for it, to a relative 1e-9; the model then gives the call's latency. When the check disagrees,
larger samples are tried (the model holds once the kernel is in its steady state). A call no larger than the
samples, or with Sq != Sk, is simulated whole; so is one whose checks all disagree (with a warning: slow, but still
the simulator's answer).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["TILE", "attention_seconds"]

TILE = 128  # the kernels' sequence tile (nki.library.attention.TILE)
# Where the samples start (instances, tiles), tried in turn: from there on each instance adds the same time and the
# latency is quadratic in the tiles (measured: 2 instances forward, 3 backward; 1 tile on trn1; 3 to 4 on trn2,
# whose Tensor engine starts throttled and ramps up over a fixed time, longer in tiles when they are small).
_STEADY = ((3, 3), (3, 5), (6, 8))
_AGREEMENT = 1e-9

DrySeconds = Callable[[Callable, tuple, dict], float]


def _resized(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A meta tensor of `shape` laid out as `t`: its dimensions in the same order in memory (contiguous if `t` is),
    broadcast (stride 0) where `t` is."""
    if t.is_contiguous():
        order = list(range(t.dim()))
    else:
        order = sorted(range(t.dim()), key=lambda i: (t.stride(i), t.size(i), -i), reverse=True)
    broadcast = {i for i in range(t.dim()) if t.stride(i) == 0 and t.size(i) > 1}
    base = torch.empty([1 if i in broadcast else shape[i] for i in order], dtype=t.dtype, device="meta")
    return base.permute([order.index(i) for i in range(t.dim())]).expand(shape)


def _polynomial_at(xs: list[int], ys: list[float], x: int) -> float:
    """The polynomial of degree len(xs) - 1 through (xs, ys), at x (Lagrange)."""
    total = 0.0
    for i, (xi, yi) in enumerate(zip(xs, ys, strict=True)):
        weight = 1.0
        for j, xj in enumerate(xs):
            if j != i:
                weight *= (x - xj) / (xi - xj)
        total += weight * yi
    return total


def _predict(measured: dict[tuple[int, int], float], fit_instances: list[int], fit_tiles: list[int], instances: int,
             tiles: int) -> float:
    """The latency at (`instances`, `tiles`) of the model through `measured` (latency by instances and tiles): a line
    through the two instance counts (or the one), then a polynomial through the tile counts."""
    at_tiles = []
    for tile in fit_tiles:
        first = measured[fit_instances[0], tile]
        if len(fit_instances) == 1:
            at_tiles.append(first)
            continue
        slope = (measured[fit_instances[1], tile] - first) / (fit_instances[1] - fit_instances[0])
        at_tiles.append(first + (instances - fit_instances[0]) * slope)
    return _polynomial_at(fit_tiles, at_tiles, tiles)


def attention_seconds(launch: Callable, args: tuple, kwargs: dict, dry_seconds: DrySeconds, *, query_at: int,
                      grid_over_kv_heads: bool) -> float:
    """Simulated seconds of `launch(*args, **kwargs)`, a flash-attention kernel whose query is `args[query_at]`
    ([B, H, S, d]) and key the next argument ([B, Hkv, S, d]); every 3-d or 4-d tensor argument is [B, heads, S,
    ...] with heads H or Hkv. `dry_seconds` simulates one call on sample data. The grid has an instance per query
    head (forward) or per KV head (`grid_over_kv_heads`, backward)."""
    query, key = args[query_at], args[query_at + 1]
    batch, heads, seq = query.shape[:3]
    kv_heads = key.shape[1]
    if key.shape[2] != seq or heads % kv_heads:
        return dry_seconds(launch, args, kwargs)
    per_kv = 1 if grid_over_kv_heads else heads // kv_heads

    def instances(n: int) -> int:
        """The launch grid's instances over `n` KV heads of batch 1."""
        return n * per_kv

    n_real, tiles = batch * kv_heads, -(-seq // TILE)
    ragged = seq - (tiles - 1) * TILE

    def simulated(n: int, t: int) -> float:
        def resize(v: Any) -> Any:
            if not (isinstance(v, torch.Tensor) and v.dim() >= 3):
                return v
            return _resized(v, (1, n * (v.size(1) // kv_heads), (t - 1) * TILE + ragged, *v.shape[3:]))

        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            sample = tuple(resize(a) for a in args)
        return dry_seconds(launch, sample, kwargs)

    for first_instances, first_tile in _STEADY:
        samples = [n for n in range(1, n_real + 1) if instances(n) >= first_instances][:3]
        fit_n = samples[:2] if len(samples) == 3 and n_real > samples[2] else [n_real]
        fit_t = [first_tile, first_tile + 1, first_tile + 2] if tiles > first_tile + 3 else [tiles]
        if fit_n == [n_real] and fit_t == [tiles]:
            break  # the samples would be as large as the call
        measured = {(instances(n), t): simulated(n, t) for n in fit_n for t in fit_t}
        fit_instances = [instances(n) for n in fit_n]
        check_n = samples[2] if len(fit_n) == 2 else n_real
        check_t = first_tile + 3 if len(fit_t) == 3 else tiles
        predicted = _predict(measured, fit_instances, fit_t, instances(check_n), check_t)
        if math.isclose(predicted, simulated(check_n, check_t), rel_tol=_AGREEMENT):
            return _predict(measured, fit_instances, fit_t, instances(n_real), tiles)
    else:
        warnings.warn(f"NKI attention estimate: the latency of {getattr(launch, '__name__', launch)} on samples is "
                      "not linear in instances x quadratic in tiles; simulating the whole call instead (slow at "
                      "large sizes)", RuntimeWarning, stacklevel=2)
    return dry_seconds(launch, args, kwargs)
