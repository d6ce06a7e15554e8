"""Neuron FX passes on an AOT graph: partition it into device kernels, fusing pointwise and reduction chains into
their producers, and price each kernel with the device's cost model.

The host code Inductor generates computes the results; this plan is what the simulated chip does: one launch per
fused kernel, whose HBM traffic is only what crosses the kernel's boundary (intermediates stay on chip). Eager mode
charges every op its own launch and its own reads and writes, so fusion shows up as saved time on the timeline.

Partitioning (greedy, in topological order): metadata-only views cost nothing and stand for their base; a
pointwise or reduction op joins the most recent kernel among its inputs' kernels when that kernel accepts fusion
(every kernel except data movement ones); anything else starts a kernel. Joining only the most recent input kernel
keeps the kernel graph acyclic. Substituted Neuron kernels (`nki_substitution`) are left out: they charge their own
simulated time each time they run, and their outputs are read from HBM like a graph input. Ops that keep their own
Tensor-engine kernel (attention) are priced as eager prices them: by the `estimate_seconds` of the kernel a plugin
registered for the op (neuron-nki's flash attention: its simulated latency), else by eager's FLOP formula
(`optracking`).

The plan also gives the graph's workspace: the peak bytes of kernel results that later kernels read, each live from
the kernel that writes it to the last kernel that reads it (results the graph returns belong to the caller).
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Mapping
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import optimization_hint

from neuron_device import services

__all__ = ["Kernel", "KernelPlan", "plan_kernels", "priced_ops"]

aten = torch.ops.aten

_VIEWS = frozenset(
    {aten.view, aten._unsafe_view, aten.reshape, aten.permute, aten.t, aten.transpose, aten.expand, aten.squeeze,
     aten.unsqueeze, aten.slice, aten.select, aten.alias, aten.as_strided, aten.split, aten.unbind,
     aten.split_with_sizes, aten.view_as_real, aten.view_as_complex, aten.detach}
)
_MATMULS = frozenset({aten.mm, aten.bmm, aten.addmm, aten.baddbmm, aten.convolution, aten.convolution_backward})
_TRANSCENDENTAL = frozenset(
    {aten.exp, aten.log, aten.tanh, aten.sigmoid, aten.rsqrt, aten.sqrt, aten.erf, aten.sin, aten.cos, aten.pow,
     aten.log1p, aten.expm1, aten.reciprocal, aten.gelu}
)
_NO_FUSION_ENGINES = frozenset({"dma", "gpsimd"})
_UNBACKED_SIZE = 8192  # Inductor's `unbacked_symint_fallback`: the size a data-dependent dim is planned with


@dataclasses.dataclass
class Kernel:
    """One device kernel: the FX nodes it runs, its work per engine, its HBM traffic, its compute dtype, and for a
    plugin's kernel its own estimate (`simulated_seconds`, which the cost model's is not asked for)."""

    nodes: list[str]
    work: dict[str, float]
    hbm_bytes: float
    dtype: torch.dtype
    anchor_engine: str
    simulated_seconds: float | None = None

    def seconds(self) -> float:
        if self.simulated_seconds is not None:
            return self.simulated_seconds
        return services.estimate_kernel(self.work, self.hbm_bytes, dtype=self.dtype).seconds


@dataclasses.dataclass
class KernelPlan:
    """The kernels of one compiled graph and their simulated device time (seconds, on the current target).

    `workspace_bytes`: the most device memory the graph's intermediates hold at once (kernel results read by a
    later kernel, but not returned). A run of the graph takes it from the device allocator for its duration, so
    peak memory and out-of-memory see what eager mode would have allocated for them.
    """

    kernels: list[Kernel]
    workspace_bytes: int = 0

    @property
    def seconds(self) -> float:
        return sum(kernel.seconds() for kernel in self.kernels)

    def to_json(self) -> dict[str, Any]:
        """JSON-safe form (stored in the compile cache next to the compiled code)."""
        return {"kernels": [{"nodes": k.nodes, "work": k.work, "hbm_bytes": k.hbm_bytes, "dtype": str(k.dtype),
                             "anchor_engine": k.anchor_engine, "simulated_seconds": k.simulated_seconds}
                            for k in self.kernels],
                "workspace_bytes": self.workspace_bytes}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KernelPlan:
        kernels = []
        for k in data["kernels"]:
            dtype = getattr(torch, str(k["dtype"]).removeprefix("torch."))
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"bad dtype {k['dtype']!r} in a stored kernel plan")
            simulated = k.get("simulated_seconds")
            kernels.append(Kernel(list(k["nodes"]), {str(e): float(w) for e, w in k["work"].items()},
                                  float(k["hbm_bytes"]), dtype, str(k["anchor_engine"]),
                                  None if simulated is None else float(simulated)))
        return cls(kernels, int(data["workspace_bytes"]))


def _size(value: int | torch.SymInt) -> int:
    """A concrete size to price: a data-dependent one (`nonzero`, `bincount`, ...) at Inductor's planning size."""
    return optimization_hint(value, fallback=_UNBACKED_SIZE)


def _nbytes(node: torch.fx.Node) -> int:
    return sum(_size(t.numel()) * t.element_size() for t in services.flat_tensors(node.meta.get("val")))


def _numel(node: torch.fx.Node) -> int:
    return sum(_size(t.numel()) for t in services.flat_tensors(node.meta.get("val")))


def _packet(node: torch.fx.Node) -> Any:
    target = node.target
    return target.overloadpacket if isinstance(target, torch._ops.OpOverload) else target


def _matmul_flops(node: torch.fx.Node) -> float:
    packet = _packet(node)
    out = services.flat_tensors(node.meta.get("val"))
    if not out:
        return 0.0
    args = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in node.args]
    outputs = _size(out[0].numel())
    if packet in (aten.mm, aten.bmm):
        return 2.0 * outputs * _size(args[0].shape[-1])
    if packet in (aten.addmm, aten.baddbmm):
        return 2.0 * outputs * _size(args[1].shape[-1])
    weight = args[1]  # convolution / convolution_backward: 2 x outputs x input channels per group x kernel size
    macs = _size(weight.shape[1] * math.prod(weight.shape[2:])) if weight is not None and weight.dim() > 1 else 1
    return 2.0 * outputs * macs * (2 if packet is aten.convolution_backward else 1)


def _plugin_estimator(name: str) -> Any:
    """The `estimate_seconds` of the kernel a plugin registered for op `name`, if it has one."""
    if name in services.builtin_kernels:  # neuron-device's own kernel: priced by the cost model
        return None
    return getattr(services.registered_kernels.get(name), "estimate_seconds", None)


def priced_ops() -> list[str]:
    """The ops a plugin's kernel prices itself (part of the compile cache's key: the plans depend on them)."""
    return sorted(name for name in services.registered_kernels if _plugin_estimator(name) is not None)


def _classify(node: torch.fx.Node) -> tuple[str, str, float]:
    """(kind, engine, work) of a call_function node; kind is "view", "matmul", "fusable", "substituted" (a Neuron
    kernel put in by `nki_substitution`), "priced" (a plugin kernel's estimate: work is its seconds) or "other"."""
    packet = _packet(node)
    if packet in _VIEWS or node.target in (getattr, operator.getitem):  # getitem: one result of a multi-output op
        return "view", "", 0.0
    if packet in _MATMULS:
        return "matmul", "tensor", _matmul_flops(node)
    tags = getattr(node.target, "tags", ())
    if torch.Tag.pointwise in tags:
        engine = "scalar" if packet in _TRANSCENDENTAL else "vector"
        return "fusable", engine, float(_numel(node))
    if torch.Tag.reduction in tags or packet in (aten.sum, aten.mean, aten.amax, aten.amin, aten.var_mean,
                                                   aten._softmax, aten._log_softmax, aten.native_layer_norm):
        inputs = [a for a in node.args if isinstance(a, torch.fx.Node)]
        return "fusable", "vector", float(sum(_numel(a) for a in inputs[:1]))
    if str(node.target).startswith("neuron_compile.nki_"):
        return "substituted", "", 0.0
    info = services.op_info(node.target) if isinstance(node.target, torch._ops.OpOverload) else None
    if info is not None and info.engine == "tensor":  # attention and the like: priced as eager prices them
        args = tuple(a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in node.args)
        estimator = _plugin_estimator(node.target.name())  # an OpOverload: `op_info` answered for it
        if estimator is not None:
            kwargs = {k: v.meta.get("val") if isinstance(v, torch.fx.Node) else v for k, v in node.kwargs.items()}
            seconds = estimator(*args, **kwargs)
            if seconds is not None:
                return "priced", "tensor", float(seconds)
        out = services.flat_tensors(node.meta.get("val"))
        return "matmul", "tensor", float(info.flops(args, out[0] if out else None))
    return "other", "dma" if packet in (aten.cat, aten.copy, aten.clone, aten.index, aten.embedding,
                                        aten.gather, aten.scatter, aten.index_put) else "gpsimd", float(_numel(node))


def plan_kernels(gm: torch.fx.GraphModule) -> KernelPlan:
    """Partition `gm` (an AOT graph with `val` metadata) into fused kernels."""
    source: dict[torch.fx.Node, torch.fx.Node] = {}  # view node -> the node whose memory it reads
    group_of: dict[torch.fx.Node, int] = {}
    groups: list[list[torch.fx.Node]] = []
    engines: list[str] = []
    work: list[dict[str, float]] = []
    priced: dict[int, float] = {}  # group -> a plugin kernel's own estimate (such a group takes no fusion)
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        kind, engine, amount = _classify(node)
        inputs = [source.get(a, a) for a in node.all_input_nodes]
        if kind == "substituted":  # a Neuron kernel that charges its own simulated time when it runs
            continue
        if kind == "view":
            source[node] = inputs[0] if inputs else node
            continue
        input_groups = [group_of[a] for a in inputs if a in group_of]
        latest = max(input_groups, default=None)
        if (kind == "fusable" and latest is not None and engines[latest] not in _NO_FUSION_ENGINES
                and latest not in priced):
            index = latest
        else:
            index = len(groups)
            groups.append([])
            engines.append(engine)
            work.append({})
        groups[index].append(node)
        group_of[node] = index
        if kind == "priced":
            priced[index] = amount
        else:
            work[index][engine] = work[index].get(engine, 0.0) + amount
    kernels = []
    lifetimes = []  # (first kernel, last kernel, bytes) of each intermediate written to HBM
    for index, members in enumerate(groups):
        inside = set(members)
        read = {source.get(a, a) for n in members for a in n.all_input_nodes} - inside
        written = {}
        for node in members:
            consumers = [u for u in _consumers(node, source) if u not in inside]
            if consumers:
                written[node] = consumers
        hbm = sum(_nbytes(n) for n in read) + sum(_nbytes(n) for n in written)
        tensors = services.flat_tensors(members[0].meta.get("val"))
        dtype = tensors[0].dtype if tensors and tensors[0].is_floating_point() else torch.float32
        amounts = {engine: float(amount) for engine, amount in work[index].items()}  # static: SymFloat -> float
        kernels.append(Kernel([n.name for n in members], amounts, float(hbm), dtype, engines[index],
                              priced.get(index)))
        for node, consumers in written.items():
            if all(u.op != "output" for u in consumers):  # a result is the caller's memory, not the graph's
                last = max((group_of[u] for u in consumers if u in group_of), default=index)
                lifetimes.append((index, last, _nbytes(node)))
    return KernelPlan(kernels, _peak_live_bytes(lifetimes, len(groups)))


def _peak_live_bytes(lifetimes: list[tuple[int, int, int]], count: int) -> int:
    """The most bytes live at once over kernels 0..count-1, each buffer live from its first to its last kernel."""
    change = [0] * (count + 1)
    for first, last, nbytes in lifetimes:
        change[first] += nbytes
        change[last + 1] -= nbytes
    peak = live = 0
    for amount in change:
        live += amount
        peak = max(peak, live)
    return peak


def _consumers(node: torch.fx.Node, source: Mapping[torch.fx.Node, torch.fx.Node]) -> list[torch.fx.Node]:
    """Users of `node`, looking through views (a view's users read `node`'s memory)."""
    found = []
    for user in node.users:
        if user in source:
            found.extend(_consumers(user, source))
        else:
            found.append(user)
    return found
