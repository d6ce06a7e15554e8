"""Neuron FX passes on an AOT graph: partition it into device kernels, fusing pointwise and reduction chains into
their producers, and price each kernel with the device's cost model.

The host code Inductor generates computes the results; this plan is what the simulated chip does: one launch per
fused kernel, whose HBM traffic is only what crosses the kernel's boundary (intermediates stay on chip). Eager mode
charges every op its own launch and its own reads and writes, so fusion shows up as saved time on the timeline.

Partitioning (greedy, in topological order): metadata-only views cost nothing and stand for their base; a
pointwise or reduction op joins the most recent kernel among its inputs' kernels when that kernel accepts fusion
(every kernel except data movement ones); anything else starts a kernel. Joining only the most recent input kernel
keeps the kernel graph acyclic. Substituted Neuron kernels (`nki_substitution`) are left out: they charge their own
simulated time each time they run, and their outputs are read from HBM like a graph input.

Attention (the flash-attention ops a graph keeps whole) is its own kernel, priced as a compiler lowers it
(`attention_work`): its products tiled onto the array, the scores kept on chip, and every (batch, head) laid side by
side along the instructions' free dimension, so each instruction's fixed costs are paid once for all heads. Eager
mode runs a library kernel instead (neuron-nki's flash attention, one program per batch and head, each paying its
instructions' fixed costs): at BERT's seq 128 that is ~3.5 us per head of Vector-engine minimums and operand
accesses, 10x what the fused lowering costs, and more than what neuronx-cc's compiled BERT takes (calibration E1/E2).
Other Tensor-engine ops without a formula here are priced by eager's FLOP formula (`ops.catalogue`).

A scatter into a graph input that the graph copies its result back into (the functional form of an in-place
update, e.g. a static KV cache's `index_copy_`: `index_put(cache, ...)` then `copy_(cache, result)`) runs in place,
as TorchNeuron's aliasing analysis makes that output the input's buffer (HLO `input_output_alias`; AWS's "Aliasing
Output Rewrite Pass": "updating KV-cache state ... reuse the allocation instead of copying") and as Inductor's
reinplacing turns it into `index_put_`: it moves only the elements it writes (and its indices and values), not
the whole input twice, and the copy back is no kernel. Likewise a scatter-accumulate into zeros that is only added
to another result (a tied embedding's gradient: the embedding's backward plus the output projection's `mm`) runs
in place in that result (`_scatter_adds`, XLA's `X + scatter(0, i, u)` -> `scatter(X, i, u)`): it moves the rows it
adds, where the zeros, the scatter over them and the add moved the [vocabulary, hidden] table five times.

A concatenation of pieces of one buffer that lie side by side in it, in order, each contiguous, into a result laid
out as the buffer is (no dimension before the concatenated one larger than 1) is that buffer: no kernel
(`_concatenated_base`). DTensor writes a sequence-parallel all-gather and reduce-scatter on dim 1 as a collective on
dim 0 with a `split` and a `cat` around it; the compiler gathers and scatters on dim 1 directly (an XLA all-gather or
reduce-scatter takes any dimension, and XLA's algebraic simplifier folds a concatenation of adjacent slices of one
operand back into the operand), so at batch 1 the reorder moves nothing.

Values a kernel makes on chip (`_classify`'s "generated"): random numbers (Inductor's `inductor_random`, what
dropout's mask is drawn from; on the chip the Vector engine's random-number instruction, `nki.isa.rand2` /
`nki.isa.dropout`: one pass of N elements) and constant fills (`full`: a broadcast constant, a scalar operand of the
instructions that read it, as XLA fuses a broadcast of a constant into its users) are made inside the kernel that
first reads them, with the pointwise ops on them alone (dropout's `rand > p`): they never cross HBM. Only a value
that no compute kernel reads (a graph output, the zeros a scatter accumulates into) is a kernel of its own, which
writes it. They were kernels of their own: dropout's fp32 random numbers written to HBM and read back, 0.25 ms a
BERT-Large layer and micro-batch (T1).

The plan also gives the graph's workspace: the peak bytes of kernel results that later kernels read, each live from
the kernel that writes it to the last kernel that reads it (results the graph returns belong to the caller).

Frozen weights (`frozen_inputs`): an inference graph's parameters and buffers that it does not write are constants
of the compiled graph, as neuronx-cc treats an inference model's weights. Work that depends on nothing else (the
bf16 cast of an fp32 weight under autocast, a transposed weight, an embedding of a position-ids buffer) is done
once at compile time: it is not planned per call, and its results are the graph's constants (`constant_bytes`),
resident in HBM next to the originals, which the user's model still holds. Kernels read the folded copies (a
matmul under bf16 autocast reads its weight as bf16). A training graph's parameters require grad: nothing folds.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Mapping, Sequence, Set
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import optimization_hint

from neuron_device import services
from neuron_spec.costs import PE_SIZE

__all__ = ["Kernel", "KernelPlan", "attention_work", "frozen_inputs", "plan_kernels"]

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
# A graph's collectives (DTensor's, traced `dist` calls) charge themselves as the process group prices them when the
# host code runs them (`services.running_host_code`), like a substituted kernel.
_COLLECTIVES = frozenset({"_c10d_functional", "_c10d_functional_autograd", "c10d"})
# Inductor's random numbers (dropout's mask), by name: the prims exist only once Inductor has loaded
_RANDOM = frozenset({"prims.inductor_random.default", "prims.inductor_randint.default"})
_UNBACKED_SIZE = 8192  # Inductor's `unbacked_symint_fallback`: the size a data-dependent dim is planned with


@dataclasses.dataclass
class Kernel:
    """One device kernel: the FX nodes it runs, its work per engine, its HBM traffic and its compute dtype."""

    nodes: list[str]
    work: dict[str, float]
    hbm_bytes: float
    dtype: torch.dtype
    anchor_engine: str
    part: str = "other"  # what its time goes to in a step's breakdown (`services.breakdown_part`, or "recompute")

    def seconds(self) -> float:
        # kernels of a compiled graph run back to back in one instruction stream: no per-kernel launch
        return services.estimate_kernel(self.work, self.hbm_bytes, dtype=self.dtype, launch_seconds=0.0).seconds


@dataclasses.dataclass
class KernelPlan:
    """The kernels of one compiled graph and their simulated device time (seconds, on the current target).

    `workspace_bytes`: the most device memory the graph's intermediates hold at once (kernel results read by a
    later kernel, but not returned). A run of the graph takes it from the device allocator for its duration, so
    peak memory and out-of-memory see what eager mode would have allocated for them. `constant_bytes`: the results
    of work on frozen weights done at compile time (`frozen_inputs`), held in device memory while the graph lives.
    """

    kernels: list[Kernel]
    workspace_bytes: int = 0
    constant_bytes: int = 0

    @property
    def seconds(self) -> float:
        """The kernels back to back, plus one launch of the graph (the runtime's launch of an op's kernel)."""
        return sum(self.parts().values())

    def parts(self) -> dict[str, float]:
        """`seconds` split by what the kernels do (each kernel's `part`; the graph's launch is "other")."""
        if not self.kernels:
            return {}
        parts = {"other": services.LAUNCH_SECONDS}
        for kernel in self.kernels:
            parts[kernel.part] = parts.get(kernel.part, 0.0) + kernel.seconds()
        return parts

    def to_json(self) -> dict[str, Any]:
        """JSON-safe form (stored in the compile cache next to the compiled code)."""
        return {"kernels": [{"nodes": k.nodes, "work": k.work, "hbm_bytes": k.hbm_bytes, "dtype": str(k.dtype),
                             "anchor_engine": k.anchor_engine, "part": k.part} for k in self.kernels],
                "workspace_bytes": self.workspace_bytes, "constant_bytes": self.constant_bytes}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KernelPlan:
        kernels = []
        for k in data["kernels"]:
            dtype = getattr(torch, str(k["dtype"]).removeprefix("torch."))
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"bad dtype {k['dtype']!r} in a stored kernel plan")
            kernels.append(Kernel(list(k["nodes"]), {str(e): float(w) for e, w in k["work"].items()},
                                  float(k["hbm_bytes"]), dtype, str(k["anchor_engine"]), str(k["part"])))
        return cls(kernels, int(data["workspace_bytes"]), int(data["constant_bytes"]))


def _size(value: int | torch.SymInt) -> int:
    """A concrete size to price: a data-dependent one (`nonzero`, `bincount`, ...) at Inductor's planning size."""
    return optimization_hint(value, fallback=_UNBACKED_SIZE)


def _nbytes(node: torch.fx.Node) -> int:
    return sum(_size(t.numel()) * t.element_size() for t in services.flat_tensors(node.meta.get("val")))


_GATHERS = frozenset({aten.embedding, aten.index_select, aten.gather, aten.index})


def _member_readers(members: list[torch.fx.Node], source: Mapping) -> dict[torch.fx.Node, list[torch.fx.Node]]:
    """The members of a kernel that read each value (through `source`), in the members' order: one pass over the
    kernel's inputs (a search of every member for each value read was quadratic in the kernel's size)."""
    readers: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for member in members:
        for value in {source.get(a, a): None for a in member.all_input_nodes}:
            readers.setdefault(value, []).append(member)
    return readers


def _read_bytes(node: torch.fx.Node, readers: list[torch.fx.Node], source: Mapping) -> int:
    """HBM bytes a kernel reads of input `node` (`readers`: its members that read it): all of it, except a table
    only gathered from (embedding, index_select, gather, index as first argument), of which the DMA reads just the
    gathered rows."""
    if readers and all(_packet(m) in _GATHERS and source.get(m.args[0], m.args[0]) is node for m in readers):
        return min(_nbytes(node), sum(_nbytes(m) for m in readers))
    return _nbytes(node)


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
    if packet in (aten.mm, aten.bmm, aten.addmm, aten.baddbmm):  # tiled onto the 128 x 128 array
        m, n = _size(out[0].shape[-2]), _size(out[0].shape[-1])
        contraction = _size(args[0 if packet in (aten.mm, aten.bmm) else 1].shape[-1])
        return services.matmul_array_flops(m, contraction, n, outputs // (m * n) if m * n else 0)
    weight = args[1]  # convolution / convolution_backward: 2 x outputs x input channels per group x kernel size
    macs = _size(weight.shape[1] * math.prod(weight.shape[2:])) if weight is not None and weight.dim() > 1 else 1
    return 2.0 * outputs * macs * (2 if packet is aten.convolution_backward else 1)


_FLASH_ATTENTION = frozenset({aten._scaled_dot_product_flash_attention_for_cpu,
                              aten._scaled_dot_product_flash_attention_for_cpu_backward})


def _lanes(rows: int, free: int) -> int:
    """Vector/Scalar work, in elements of full 128-partition instructions, of `rows` rows of `free` elements laid
    one row a partition: an instruction costs its free size whatever the partitions it uses (calibration.md §2,
    `max(64, N)` cycles for N elements a partition), so fewer than 128 rows cost as much as 128."""
    return -(-rows // PE_SIZE) * PE_SIZE * free


def attention_work(batch_heads: int, sq: int, sk: int, d: int, causal: bool, backward: bool = False) -> dict[str, float]:
    """Work per engine of attention over `batch_heads` heads of [sq, d] queries and [sk, d] keys, lowered as a
    compiler lowers it: scores S = Q K^T on the array, exp(S - rowmax) on the Scalar engine (the row sum
    accumulated by the same instruction), the row max on the Vector engine, P transposed on the array (an identity
    matmul) and copied out of PSUM, then P V; the output normalised once per row. The backward recomputes S and P,
    and adds dV = P^T dO, dP = dO V^T, dS = P (dP - D), dK = dS^T Q and dQ = dS K (dS transposed too). A causal
    mask skips about half of every score-sized term, as eager's formula (`ops.catalogue`) assumes. Query rows lie
    on partitions (keys on them once transposed): fewer than 128 rows, a decode step's one query, still cost full
    instructions (`_lanes`)."""
    visible = 0.5 if causal else 1.0
    flops = services.matmul_array_flops
    # the identity matmul that transposes P moves at most one array width of columns per pass
    scores, transpose = flops(sq, d, sk, batch_heads), flops(sk, sq, PE_SIZE, batch_heads)
    by_query, by_key = visible * batch_heads * _lanes(sq, sk), visible * batch_heads * _lanes(sk, sq)
    if not backward:
        tensor = scores + flops(sq, sk, d, batch_heads) + transpose
        return {"tensor": visible * tensor, "scalar": by_query,
                "vector": by_query + by_key + batch_heads * _lanes(sq, d)}
    products = scores + 2 * flops(sk, sq, d, batch_heads) + flops(sq, d, sk, batch_heads) + flops(sq, sk, d, batch_heads)
    # dS = P (dP - D) and the two PSUM copies out (P and dS transposed); the dQ, dK, dV accumulators
    return {"tensor": visible * (products + 2 * transpose), "scalar": by_query,
            "vector": by_query + 2 * by_key + batch_heads * (_lanes(sq, d) + 2 * _lanes(sk, d))}


def _attention(node: torch.fx.Node) -> dict[str, float]:
    """`attention_work` of a flash-attention node (forward: query, key, ..., is_causal; backward: grad_out, query,
    key, ..., is_causal)."""
    backward = node.target.overloadpacket is aten._scaled_dot_product_flash_attention_for_cpu_backward
    first, causal_at = (1, 7) if backward else (0, 4)
    query, key = (node.args[first + i].meta["val"] for i in (0, 1))
    causal = len(node.args) > causal_at and bool(node.args[causal_at])
    *lead, sq, d = (_size(n) for n in query.shape)
    return attention_work(math.prod(lead), sq, _size(key.shape[-2]), d, causal, backward)


_FLEX_ATTENTION = (torch.ops.higher_order.flex_attention, torch.ops.higher_order.flex_attention_backward)


def _flex_attention(node: torch.fx.Node) -> dict[str, float]:
    """`attention_work` of a flex-attention node (query, key, ... first, forward or backward): one flash kernel
    over every score block, as the block mask's sparsity is data the graph only reads at run time."""
    query, key = (node.args[i].meta["val"] for i in (0, 1))
    *lead, sq, d = (_size(n) for n in query.shape)
    backward = node.target is torch.ops.higher_order.flex_attention_backward
    return attention_work(math.prod(lead), sq, _size(key.shape[-2]), d, False, backward)


def _classify(node: torch.fx.Node) -> tuple[str, str, float | dict[str, float]]:
    """(kind, engine, work) of a call_function node; kind is "view", "matmul", "fusable", "substituted" (a Neuron
    kernel put in by `nki_substitution`, or a collective: both charge their own time when they run), "generated" (values
    the kernel reading them makes on chip: module doc) or "other"; attention's work is on several engines
    (`attention_work`)."""
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
    if str(node.target).startswith("neuron_compile.nki_") or getattr(node.target, "namespace", "") in _COLLECTIVES:
        return "substituted", "", 0.0
    if str(node.target) in _RANDOM:  # the Vector engine's random-number instruction (`nki.isa.rand2`): N elements
        return "generated", "vector", float(_numel(node))
    if packet is aten.full:  # a broadcast constant: a scalar operand of the instructions that read it
        return "generated", "vector", 0.0
    if packet in _FLASH_ATTENTION:
        return "matmul", "tensor", _attention(node)
    if node.target in _FLEX_ATTENTION:
        return "matmul", "tensor", _flex_attention(node)
    info = services.op_info(node.target) if isinstance(node.target, torch._ops.OpOverload) else None
    if info is not None and info.engine == "tensor":  # priced by eager's FLOP formula
        args = tuple(a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in node.args)
        out = services.flat_tensors(node.meta.get("val"))
        return "matmul", "tensor", float(info.flops(args, out[0] if out else None))
    return "other", "dma" if packet in (aten.cat, aten.copy, aten.clone, aten.index, aten.embedding,
                                        aten.gather, aten.scatter, aten.index_put) else "gpsimd", float(_numel(node))


_ROW_REDUCTIONS = frozenset({aten.sum, aten.mean, aten.amax, aten.amin, aten.var_mean, aten.var, aten.logsumexp,
                             aten._softmax, aten._log_softmax, aten.native_layer_norm})


def _row_length(node: torch.fx.Node) -> int | None:
    """The row length of a reduction over the trailing dims of an input of more than one dim (softmax, a norm's
    statistics, a row max or sum), whose rows then lie one a partition with the row along the instructions' free
    dimension (the layout of AWS's NKI softmax and norm kernels); None for any other node, and for a reduction
    over all of its input or over leading dims (those spread over the partitions)."""
    if _packet(node) not in _ROW_REDUCTIONS or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    value = node.args[0].meta.get("val")
    if not isinstance(value, torch.Tensor) or value.dim() < 2:
        return None
    if _packet(node) is aten.native_layer_norm:
        dims = list(range(value.dim() - len(node.args[1]), value.dim()))
    else:
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        dims = sorted(d % value.dim() for d in ([dim] if isinstance(dim, int) else dim or []))
    if not dims or dims != list(range(value.dim() - len(dims), value.dim())) or len(dims) == value.dim():
        return None
    return math.prod(_size(value.shape[d]) for d in dims)


def _written_inputs(node: torch.fx.Node) -> list[Any]:
    """The arguments `node` writes in place (its schema's mutable arguments)."""
    if not isinstance(node.target, torch._ops.OpOverload):
        return []
    written = []
    for position, argument in enumerate(node.target._schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            written.append(node.args[position] if position < len(node.args) else node.kwargs.get(argument.name))
    return written


def frozen_inputs(gm: torch.fx.GraphModule, static_indices: Sequence[int]) -> set[torch.fx.Node]:
    """The placeholders of an inference graph that are frozen weights: its static inputs (`static_indices`, the
    parameters and buffers Dynamo lifted, as Inductor's `static_input_idxs`) that the graph does not write (a
    static KV cache is a buffer the graph updates: an input, not a constant)."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    frozen = {placeholders[i] for i in static_indices if i < len(placeholders)}
    for node in gm.graph.nodes:
        for value in _written_inputs(node):
            while isinstance(value, torch.fx.Node) and _packet(value) in _VIEWS and value.args:
                value = value.args[0]  # a write through a view writes its base
            frozen.discard(value)
    return frozen


def _foldable(node: torch.fx.Node, constants: set[torch.fx.Node]) -> bool:
    """Whether `node` is work on constants only, which a compiler does once at compile time: a pure ATen op (not
    random, writing nothing) whose inputs are all constants."""
    target = node.target
    if not (isinstance(target, torch._ops.OpOverload) and target.namespace in ("aten", "prims")):
        return False
    if torch.Tag.nondeterministic_seeded in target.tags or _written_inputs(node):
        return False
    return bool(node.all_input_nodes) and all(a in constants for a in node.all_input_nodes)


_SCATTERS = frozenset({aten.index_put, aten._unsafe_index_put, aten.index_copy, aten.scatter})


def _scattered_elements(node: torch.fx.Node) -> int | None:
    """Elements a scatter writes into its input (`services.scattered_elements`: the indexed region), or None when
    data decides (a mask)."""
    def val(a: Any) -> Any:
        if isinstance(a, (list, tuple)):
            return [val(i) for i in a]
        return a.meta.get("val") if isinstance(a, torch.fx.Node) else a

    packet = _packet(node)
    args = tuple(val(a) for a in node.args)
    if packet is aten._unsafe_masked_index_put_accumulate:  # (self, mask, indices, values): index_put's region
        packet, args = aten.index_put, (args[0], *args[2:])
    region = services.scattered_elements(packet.__name__, args)
    return None if region is None else _size(region)


_ACCUMULATING_SCATTERS = frozenset({aten.index_put, aten._unsafe_index_put, aten._unsafe_masked_index_put_accumulate})


def _accumulated_into_zeros(node: torch.fx.Node) -> bool:
    """Whether `node` adds its values into a zero fill (`full(0)`) that nothing else reads: an embedding's
    backward."""
    packet = _packet(node)
    if packet not in _ACCUMULATING_SCATTERS or not isinstance(node.args[0], torch.fx.Node):
        return False
    base = node.args[0]
    accumulate = packet is aten._unsafe_masked_index_put_accumulate or (
        len(node.args) > 3 and bool(node.args[3])) or bool(node.kwargs.get("accumulate", False))
    return (accumulate and _packet(base) is aten.full and base.args[1] == 0 and list(base.users) == [node]
            and _scattered_elements(node) is not None)


def _scatter_adds(gm: torch.fx.GraphModule, order: Mapping[torch.fx.Node, int]) -> dict[torch.fx.Node, torch.fx.Node]:
    """Scatter-accumulates into zeros whose only reader adds them to another result X of the same layout, made
    before them and read by nothing else (a tied embedding's two gradients): each with its add. The sum is X with
    the values accumulated into its rows, as XLA's algebraic simplifier rewrites `X + scatter(0, i, u)` into
    `scatter(X, i, u)` and runs it in place: the add and the zeros are no kernels."""
    found = {}
    for add in gm.graph.find_nodes(op="call_function", target=aten.add.Tensor):
        if len(add.args) != 2 or add.kwargs.get("alpha", 1) != 1:
            continue
        for scatter, other in (add.args, add.args[::-1]):
            if not (isinstance(scatter, torch.fx.Node) and isinstance(other, torch.fx.Node)
                    and _accumulated_into_zeros(scatter) and list(scatter.users) == [add]
                    and _readers(other) == [add] and order[other] < order[scatter]):
                continue
            values = [n.meta.get("val") for n in (scatter, other, add)]
            if all(isinstance(v, torch.Tensor) for v in values) and len({(v.shape, v.dtype) for v in values}) == 1:
                found[scatter] = add
                break
    return found


def _in_place_scatters(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, torch.fx.Node]:
    """The scatters that run in place (module docstring), each with its copy back: scatter S into placeholder P,
    a later `copy_(P, S)`, and no read of P in between (Inductor's `reinplace` condition for a graph input); and
    the scatter-accumulates into zeros added to another result, each with its add (`_scatter_adds`)."""
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    found = _scatter_adds(gm, order)
    for copy in gm.graph.find_nodes(op="call_function", target=aten.copy_.default):
        dst, src = copy.args[0], copy.args[1]
        if not (isinstance(src, torch.fx.Node) and dst.op == "placeholder" and _packet(src) in _SCATTERS
                and src.args[0] is dst and _scattered_elements(src) is not None):
            continue
        readers = [u for u in _readers(dst) if u not in (src, copy)]
        if not any(order[src] < order[u] < order[copy] for u in readers):
            found[src] = copy
    return found


def _concatenated_base(node: torch.fx.Node, source: Mapping[torch.fx.Node, torch.fx.Node]) -> torch.fx.Node | None:
    """The buffer a `cat` node merely reassembles (module docstring), or None when it moves data: its inputs are
    views of one node's memory, each contiguous, adjacent and in memory order, covering all of it, and the result
    lays their elements out in that order."""
    if _packet(node) is not aten.cat or not node.args[0]:
        return None
    pieces = node.args[0]
    if not all(isinstance(a, torch.fx.Node) for a in pieces):
        return None
    bases = {source.get(a, a) for a in pieces}
    base = bases.pop()
    if bases or base in pieces:
        return None
    vals = [a.meta.get("val") for a in pieces]
    out, whole = node.meta.get("val"), base.meta.get("val")
    if not all(isinstance(v, torch.Tensor) for v in (*vals, out, whole)):
        return None
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    dim = dim % out.dim() if out.dim() else 0
    if math.prod(_size(n) for n in out.shape[:dim]) != 1 or not all(v.is_contiguous() for v in (*vals, out, whole)):
        return None
    offset = _size(whole.storage_offset())
    for value in vals:
        if _size(value.storage_offset()) != offset:
            return None
        offset += _size(value.numel())
    return base if offset - _size(whole.storage_offset()) == _size(whole.numel()) else None


def plan_kernels(gm: torch.fx.GraphModule, frozen: Set[torch.fx.Node] = frozenset()) -> KernelPlan:
    """Partition `gm` (an AOT graph with `val` metadata) into fused kernels. `frozen`: its placeholders that are
    constants (`frozen_inputs`); the work on them alone is folded at compile time, not planned."""
    source: dict[torch.fx.Node, torch.fx.Node] = {}  # view node -> the node whose memory it reads
    group_of: dict[torch.fx.Node, int] = {}
    groups: list[list[torch.fx.Node]] = []
    engines: list[str] = []
    work: list[dict[str, float]] = []
    parts: list[str] = []  # each kernel's breakdown part: its first node's (attention by name, else its engine)
    elementwise: dict[torch.fx.Node, tuple[str, float]] = {}  # fusable Vector/Scalar nodes: (engine, elements)
    constants = set(frozen)
    pending: dict[torch.fx.Node, tuple[str, Any]] = {}  # values made on chip, not yet in a kernel (module doc)

    def new_kernel(node: torch.fx.Node, engine: str) -> int:
        groups.append([])
        engines.append(engine)
        work.append({})
        parts.append(services.breakdown_part(str(node.target), engine))
        return len(groups) - 1

    def add(node: torch.fx.Node, index: int, engine: str, amount: Any) -> None:
        groups[index].append(node)
        group_of[node] = index
        for unit, count in (amount.items() if isinstance(amount, dict) else ((engine, amount),)):
            work[index][unit] = work[index].get(unit, 0.0) + count

    def place(value: torch.fx.Node, index: int) -> None:
        """Make pending `value` (and the pending values it is computed from) in kernel `index`."""
        engine, amount = pending.pop(value)
        for a in value.all_input_nodes:
            a = source.get(a, a)
            if a in pending:
                place(a, index)
        add(value, index, engine, amount)

    in_place = _in_place_scatters(gm)
    copies_back = {copy: scatter for scatter, copy in in_place.items()}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node in copies_back:  # the scatter wrote the input's buffer: its users read that
            source[node] = copies_back[node]
            continue
        if _foldable(node, constants):
            constants.add(node)
            continue
        base = _concatenated_base(node, source)
        if base is not None:  # the buffer reassembled: its readers read the buffer
            source[node] = base
            continue
        kind, engine, amount = _classify(node)
        if node in in_place:  # its engine handles only the elements it writes
            amount = float(_scattered_elements(node))
            if _accumulated_into_zeros(node):  # into the other addend's buffer: the zeros are never made
                pending.pop(source.get(node.args[0], node.args[0]), None)
        inputs = [source.get(a, a) for a in node.all_input_nodes]
        if kind == "substituted":  # a Neuron kernel that charges its own simulated time when it runs
            continue
        if kind == "view":
            source[node] = inputs[0] if inputs else node
            continue
        if kind == "generated" or (kind == "fusable" and inputs and all(a in pending for a in inputs)):
            pending[node] = (engine, amount)  # made on chip by the kernel that first reads it
            continue
        waiting = [a for a in inputs if a in pending]
        input_groups = [group_of[a] for a in inputs if a in group_of]
        latest = max(input_groups, default=None)
        if kind == "fusable" and latest is not None and engines[latest] not in _NO_FUSION_ENGINES:
            index = latest
        else:
            if engine in _NO_FUSION_ENGINES:  # data movement reads memory: what it reads is written first
                for value in waiting:
                    place(value, new_kernel(value, pending[value][0]))
                waiting = []
            index = new_kernel(node, engine)
        add(node, index, engine, amount)
        if kind == "fusable" and engine in ("vector", "scalar"):
            elementwise[node] = (engine, float(amount))
        for value in waiting:
            place(value, index)
    for value in list(pending):  # read by no compute kernel: a kernel of its own writes it
        if value in pending:
            place(value, new_kernel(value, pending[value][0]))
    for index, members in enumerate(groups):  # a kernel with row reductions lays every row out as they do
        lengths = {n for n in map(_row_length, members) if n}
        for node in members:
            engine, amount = elementwise.get(node, ("", 0.0))
            length = next((n for n in sorted(lengths, reverse=True) if amount and amount % n == 0), None)
            if length is not None:
                work[index][engine] += _lanes(int(amount) // length, length) - amount
    kernels = []
    lifetimes = []  # (first kernel, last kernel, bytes) of each intermediate written to HBM
    for index, members in enumerate(groups):
        inside = set(members)
        read = {source.get(a, a) for n in members for a in n.all_input_nodes} - inside
        # an in-place scatter neither reads its input nor writes more than its region
        read -= {n.args[0] for n in members if n in in_place and not _read_elsewhere(n.args[0], n, members)}
        written = {}
        for node in members:
            consumers = [u for u in _consumers(node, source) if u not in inside]
            if consumers or node in in_place:
                written[node] = consumers
        readers = _member_readers(members, source)
        hbm = sum(_read_bytes(n, readers.get(n, []), source) for n in read) + sum(
            _scattered_elements(n) * _element_size(n) if n in in_place else _nbytes(n) for n in written)
        tensors = services.flat_tensors(members[0].meta.get("val"))
        dtype = tensors[0].dtype if tensors and tensors[0].is_floating_point() else torch.float32
        amounts = {engine: float(amount) for engine, amount in work[index].items()}  # static: SymFloat -> float
        kernels.append(Kernel([n.name for n in members], amounts, float(hbm), dtype, engines[index], parts[index]))
        for node, consumers in written.items():
            # a result, or an input written in place, is the caller's memory, not the graph's
            if node not in in_place and all(u.op != "output" for u in consumers):
                last = max((group_of[u] for u in consumers if u in group_of), default=index)
                lifetimes.append((index, last, _nbytes(node)))
    return KernelPlan(kernels, _peak_live_bytes(lifetimes, len(groups)), _folded_bytes(constants - set(frozen), group_of))


def _readers(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The nodes that read `node`'s memory: its users, through views."""
    found = []
    for user in node.users:
        found.extend(_readers(user) if _packet(user) in _VIEWS else [user])
    return found


def _read_elsewhere(value: torch.fx.Node, scatter: torch.fx.Node, members: list[torch.fx.Node]) -> bool:
    """Whether a kernel member other than `scatter` reads `value` (then the kernel reads it from HBM)."""
    return any(m is not scatter and value in m.all_input_nodes for m in members)


def _element_size(node: torch.fx.Node) -> int:
    return services.flat_tensors(node.meta.get("val"))[0].element_size()


def _folded_bytes(folded: set[torch.fx.Node], group_of: Mapping[torch.fx.Node, int]) -> int:
    """Device bytes of the folded results the planned kernels read: each one's base (a view of a folded result, or
    of a weight, holds no memory of its own) counted once."""
    kept = set()
    for node in folded:
        if any(u in group_of for u in node.users):
            while node in folded and _packet(node) in _VIEWS and node.args:
                node = node.args[0]
            if node in folded:
                kept.add(node)
    return sum(_nbytes(n) for n in kept)


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
