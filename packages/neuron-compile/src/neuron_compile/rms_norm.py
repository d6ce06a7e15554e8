"""Find RMSNorm written out as ops in an AOT graph and replace it with `aten._fused_rms_norm`, so the NKI
substitution (`nki_substitution`) runs it as one Neuron RMSNorm kernel.

Why here: `_fused_rms_norm` and `rms_norm` are CompositeImplicitAutograd ops on the host, so AOTAutograd always
traces them into `pow`/`mean`/`rsqrt`/`mul` (and so do hand-written norms such as transformers' `LlamaRMSNorm`).
The pass runs on each AOT graph (forward, inference, backward) after decomposition and partitioning, which keeps
autograd exactly as traced: the backward graph is left alone, and the values the forward saves for it stay
available. The fused op returns the normalised output and `rstd`, which *is* the pattern's `rsqrt` value when the
pattern computes in the op's computation dtype, so a saved `rsqrt` is read from the fused op too; any other
intermediate still used elsewhere keeps being computed.

Matched (dims = the last k dims, `xf` = `x` or `x` upcast to float32):
    r = rsqrt(mean(xf ** 2 or xf * xf, dims, keepdim=True) + eps);  y = xf * r
then, in either order, at most one cast and at most one multiplication by a weight of the normalised shape, as
long as the result has `x`'s dtype and shape (as `_fused_rms_norm` returns).
"""

from __future__ import annotations

import dataclasses
import numbers
import operator

import torch
from torch._subclasses.fake_tensor import FakeTensor

__all__ = ["fuse_rms_norm"]

aten = torch.ops.aten
prims = torch.ops.prims
_FUSED = aten._fused_rms_norm.default
_MEAN = aten.mean.dim
_ADDS = (aten.add.Tensor, aten.add.Scalar)
_MULS = (aten.mul.Tensor,)


@dataclasses.dataclass
class _Match:
    x: torch.fx.Node
    rstd: torch.fx.Node
    out: torch.fx.Node
    weight: torch.fx.Node | None
    normalized_shape: list[int]
    eps: float
    nodes: list[torch.fx.Node]  # the pattern's nodes, producers first


def _val(node: object) -> torch.Tensor | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _call(node: object, *targets: object) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets


def _other(node: torch.fx.Node, known: torch.fx.Node) -> object:
    """The operand of the binary `node` that is not `known` (None if `known` is not an operand)."""
    a, b = node.args[:2]
    return b if a is known else a if b is known else None


def _upcast_source(xf: torch.fx.Node) -> torch.fx.Node:
    """`x` for `xf = x.to(float32)`, else `xf` itself."""
    if _call(xf, prims.convert_element_type.default) and xf.args[1] == torch.float32:
        return xf.args[0]
    return xf


def _squared(node: object) -> torch.fx.Node | None:
    if _call(node, aten.pow.Tensor_Scalar) and node.args[1] == 2:
        return node.args[0]
    if _call(node, *_MULS) and node.args[0] is node.args[1]:
        return node.args[0]
    return None


def _trailing_dims(dims: object, rank: int) -> int:
    """k if `dims` are exactly the last k dims of a rank-`rank` tensor, else 0."""
    if not isinstance(dims, (list, tuple)) or not dims:
        return 0
    normalized = sorted(d % rank for d in dims)
    return len(dims) if normalized == list(range(rank - len(dims), rank)) else 0


def _match(rsqrt: torch.fx.Node) -> _Match | None:
    add = rsqrt.args[0]
    if (not _call(add, *_ADDS) or add.kwargs or not isinstance(add.args[1], numbers.Real)
            or isinstance(add.args[1], bool)):
        return None
    mean = add.args[0]
    if not _call(mean, _MEAN) or mean.kwargs.get("dtype") is not None:
        return None
    if not (mean.args[2] if len(mean.args) > 2 else mean.kwargs.get("keepdim", False)):
        return None
    xf = _squared(mean.args[0])
    value = _val(xf)
    if value is None:
        return None
    k = _trailing_dims(mean.args[1], value.dim())
    normed = [u for u in rsqrt.users if _call(u, *_MULS) and _other(u, rsqrt) is xf]
    if not k or not normed:
        return None
    x = _upcast_source(xf)
    x_val = _val(x)
    if x_val is None or not x_val.is_floating_point():
        return None
    normalized_shape = list(value.shape[value.dim() - k:])
    out, weight, cast = normed[0], None, False
    nodes = [n for n in (xf if xf is not x else None, mean.args[0], mean, add, rsqrt, out) if n is not None]
    while len(out.users) == 1:
        user = next(iter(out.users))
        if not cast and _call(user, prims.convert_element_type.default):
            cast = True
        elif weight is None and _call(user, *_MULS):
            candidate = _other(user, out)
            candidate_val = _val(candidate)
            if candidate_val is None or list(candidate_val.shape) != normalized_shape:
                break
            weight = candidate
        else:
            break
        out = user
        nodes.append(out)
    out_val = _val(out)
    if out_val is None or out_val.dtype != x_val.dtype or out_val.shape != x_val.shape:
        return None
    return _Match(x, rsqrt, out, weight, normalized_shape, float(add.args[1]), nodes)


def _replace(graph: torch.fx.Graph, match: _Match, order: dict[torch.fx.Node, int]) -> bool:
    """Insert the fused op right after the pattern's `rsqrt` and reroute the pattern's results to it."""
    x_val = _val(match.x)
    if not isinstance(x_val, FakeTensor):
        return False
    if match.weight is not None and order[match.weight] > order[match.rstd]:
        return False  # the weight is computed after the statistics: the fused op cannot take their place
    with x_val.fake_mode:
        out_val, rstd_val = _FUSED(x_val, match.normalized_shape, _val(match.weight), match.eps)
    with graph.inserting_after(match.rstd):
        fused = graph.call_function(_FUSED, (match.x, match.normalized_shape, match.weight, match.eps))
        fused.meta["val"] = (out_val, rstd_val)
    results = []
    for index, value in enumerate((out_val, rstd_val)):
        with graph.inserting_after(results[-1] if results else fused):
            results.append(graph.call_function(operator.getitem, (fused, index)))
            results[-1].meta["val"] = value
    match.out.replace_all_uses_with(results[0])
    rstd = _val(match.rstd)
    if rstd.dtype == rstd_val.dtype and rstd.shape == rstd_val.shape:
        match.rstd.replace_all_uses_with(results[1])
    for node in [*reversed(match.nodes), results[1]]:
        if not node.users:
            graph.erase_node(node)
    return True


def fuse_rms_norm(gm: torch.fx.GraphModule) -> int:
    """Replace each decomposed RMSNorm in the AOT graph `gm` with `aten._fused_rms_norm`; return how many."""
    count = 0
    for rsqrt in list(gm.graph.find_nodes(op="call_function", target=aten.rsqrt.default)):
        match = _match(rsqrt)
        if match is not None:
            order = {node: i for i, node in enumerate(gm.graph.nodes)}
            count += _replace(gm.graph, match, order)
    if count:
        gm.recompile()
    return count
