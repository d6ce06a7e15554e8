"""Kernel partitioning and fusion on AOT-level graphs, and the simulated time of the resulting plan."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_compile.passes import KernelPlan, _classify, attention_work, plan_kernels
from neuron_compile.rms_norm import fuse_rms_norm


def _plan(fn, *args) -> KernelPlan:
    return plan_kernels(make_fx(fn, tracing_mode="fake")(*args))


def test_pointwise_and_reduction_chain_fuses_into_the_matmul() -> None:
    x, w, b = torch.randn(32, 64), torch.randn(64, 16), torch.randn(16)
    plan = _plan(lambda x, w, b: torch.relu(torch.mm(x, w) + b).sum(1), x, w, b)
    assert len(plan.kernels) == 1
    (kernel,) = plan.kernels
    # the Tensor engine's occupancy, as the product tiles onto the 128 x 128 array (issue 17; it was 2 m k n): one
    # 64-deep slice, one pass of max(min(64, 32 stationary columns), 16 moving columns) = 32 cycles
    assert kernel.work["tensor"] == 2 * 128 * 128 * 32
    # Only what crosses the kernel boundary moves: x, w, b in, the 32 sums out (the 32x16 product stays on chip).
    assert kernel.hbm_bytes == 4 * (32 * 64 + 64 * 16 + 16 + 32)


def test_views_are_free_and_data_movement_does_not_absorb_pointwise() -> None:
    x = torch.randn(8, 4)
    plan = _plan(lambda x: torch.cat([x, x]).t().exp(), x)
    assert [k.anchor_engine for k in plan.kernels] == ["dma", "scalar"]


def test_fusion_lowers_simulated_time() -> None:
    x = torch.randn(256, 256)

    def chain(x):
        return ((x * 2 + 1).tanh() * 3).sum()

    fused = _plan(chain, x)
    unfused = KernelPlan([k for op in (lambda x: x * 2, lambda x: x + 1, torch.tanh, lambda x: x * 3, torch.sum)
                          for k in _plan(op, x).kernels])
    assert len(fused.kernels) == 1 and len(unfused.kernels) == 5
    assert fused.seconds < unfused.seconds


def test_workspace_is_the_peak_of_intermediates_between_kernels() -> None:
    """Kernel results read by later kernels are live from their kernel to their last reader; results are not
    counted (the caller holds them) and neither is what stays inside a fused kernel."""
    x, w1, w2, w3 = torch.randn(64, 32), torch.randn(32, 16), torch.randn(16, 8), torch.randn(8, 8)

    def chain(x, w1, w2, w3):
        a = torch.mm(x, w1).relu()  # 64x16: read by the second matmul only
        b = torch.mm(a, w2)  # 64x8: read by the third matmul, and returned
        return torch.mm(b, w3) + 1, b

    plan = _plan(chain, x, w1, w2, w3)
    assert len(plan.kernels) == 3
    assert plan.workspace_bytes == 4 * 64 * 16
    assert _plan(lambda x: (x * 2).exp().sum(), x).workspace_bytes == 0  # one fused kernel: nothing in between

    def two_live(x, w1, w2):
        a, b = torch.mm(x, w1), torch.mm(x, w1 * 2)  # both live until the last matmul reads them
        return torch.mm(torch.cat([a, b], 1), torch.cat([w2, w2]))

    assert _plan(two_live, x, w1, w2).workspace_bytes >= 2 * 4 * 64 * 16


def test_attention_is_priced_as_its_fused_lowering() -> None:
    """The CPU flash-attention op a compiled graph keeps whole is one kernel priced as a compiler lowers it
    (`attention_work`): both products and P's transpose tiled onto the array, halved by the causal mask, exp on the
    Scalar engine, the row max and the PSUM copy on the Vector engine, the scores on chip; not a data-movement
    kernel sized by its output. (Issue 17: it was eager's two-product FLOP formula, Tensor engine only.)"""
    q, k, v = torch.randn(2, 4, 128, 64), torch.randn(2, 4, 256, 64), torch.randn(2, 4, 256, 64)
    plan = _plan(lambda q, k, v: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)[0],
                 q, q.new_empty(k.shape), v)
    (kernel,) = plan.kernels
    assert kernel.anchor_engine == "tensor"
    # per head: S [128, 256] = one 64-deep pass of 256 moving columns (256 cycles, scores oriented either way);
    # P V: two 128-deep slices of max(64, 64) = 64 cycles; P^T: two slices of 128 columns = 256 cycles
    cycles = 8 * (256 + 2 * 64 + 256)
    assert kernel.work == {"tensor": 0.5 * 2 * 128 * 128 * cycles, "scalar": 0.5 * 8 * 128 * 256,
                           "vector": 8 * 128 * 256 + 8 * 128 * 64}
    # q, k, v in; the output and the op's logsumexp [2, 4, 128] out (the scores never leave the chip)
    assert kernel.hbm_bytes == 4 * (q.numel() + k.numel() + v.numel() + q.numel() + 2 * 4 * 128)
    backward = attention_work(8, 128, 256, 64, causal=True, backward=True)
    assert backward["tensor"] > 2 * kernel.work["tensor"] and backward["scalar"] == kernel.work["scalar"]


def test_rows_fewer_than_partitions_cost_full_instructions() -> None:
    """A Vector/Scalar instruction costs its free size whatever the partitions it uses (calibration.md §2): a
    softmax or a norm's statistics of one row (a decode step's token) lays the row along one partition, so it
    costs what 128 rows cost, and so does the kernel's elementwise work on those rows; 256 rows cost twice that. A
    reduction over all of a tensor spreads over the partitions, and is unchanged. (Priced as if spread before.)"""
    def chain(x):
        return torch.softmax(x * 2, -1)

    work = {rows: _plan(chain, torch.randn(rows, 8192)).kernels[0].work for rows in (1, 128, 256)}
    assert work[1] == work[128] == {"vector": 2 * 128 * 8192}
    assert work[256] == {"vector": 2 * 256 * 8192}
    assert _plan(lambda x: (x * 2).sum(), torch.randn(1, 8192)).kernels[0].work == {"vector": 2 * 8192}
    # a decode step's attention: one query row a head, its exp and row max full instructions over the keys
    decode = attention_work(1, 1, 8192, 128, causal=False)
    assert decode["scalar"] == 128 * 8192 and decode["vector"] == 128 * 8192 + 8192 * 1 + 128 * 128


def test_a_plugin_kernels_estimate_does_not_price_compiled_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plugin's kernel for attention that knows its simulated time (neuron-nki's flash attention, one program
    per batch and head) prices eager calls only: a compiled graph's attention is the compiler's own fused lowering,
    which pays each instruction's fixed costs once for all heads (issue 17: the library kernel's per-head costs made
    compiled BERT 50 % slower than neuronx-cc's). The estimate is not even asked; a later pointwise op fuses in."""
    from neuron_device.ops import registry

    name = "aten::_scaled_dot_product_flash_attention_for_cpu"

    def kernel(*args, **kwargs):
        raise AssertionError("a compile-time plan must not run the kernel")

    def estimate_seconds(*args, **kwargs):
        raise AssertionError("a compile-time plan must not ask the plugin's estimate")

    kernel.estimate_seconds = estimate_seconds
    monkeypatch.setitem(registry.kernels, name, kernel)
    monkeypatch.setattr(registry, "builtin", registry.builtin - {name})
    q = torch.randn(2, 4, 128, 64)
    plan = _plan(lambda q, k, v: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)[0] * 2,
                 q, q, q)
    (attention,) = plan.kernels
    lowered = attention_work(8, 128, 128, 64, causal=True)
    assert attention.nodes[-1] == "mul" and attention.work == {**lowered, "vector": lowered["vector"] + q.numel()}
    assert KernelPlan.from_json(plan.to_json()).seconds == plan.seconds


def test_plan_round_trips_through_json() -> None:
    plan = _plan(lambda x: (x @ x).relu() @ x, torch.randn(4, 4))
    again = KernelPlan.from_json(plan.to_json())
    assert again.to_json() == plan.to_json() and again.seconds == plan.seconds
    assert again.workspace_bytes == plan.workspace_bytes > 0


def _llama_rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """transformers' LlamaRMSNorm.forward."""
    hidden = x.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    return weight * (hidden * torch.rsqrt(variance + 1e-6)).to(x.dtype)


def _aot_forward(fn, *args) -> torch.fx.GraphModule:
    """The forward (or inference) graph AOTAutograd makes of `fn` with Inductor's decompositions."""
    from torch._functorch.aot_autograd import aot_function
    from torch._inductor.decomposition import select_decomp_table

    graphs = []

    def capture(gm: torch.fx.GraphModule, inputs) -> torch.fx.GraphModule:
        graphs.append(gm)
        return gm

    aot_function(fn, fw_compiler=capture, bw_compiler=capture, decompositions=select_decomp_table())(*args)
    return graphs[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fn", [_llama_rms_norm, lambda x, w: torch.nn.functional.rms_norm(x, [32], w, 1e-6)],
                         ids=["llama", "rms_norm"])
def test_decomposed_rms_norm_becomes_the_fused_op(fn, dtype: torch.dtype) -> None:
    x, weight = torch.randn(4, 8, 32, dtype=dtype), torch.randn(32, dtype=dtype)
    gm = _aot_forward(fn, x, weight)
    assert fuse_rms_norm(gm) == 1
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten._fused_rms_norm.default in targets and torch.ops.aten.rsqrt.default not in targets
    tolerance = {"rtol": 1e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(gm(x, weight)[0], fn(x, weight), **tolerance)


def test_rms_norm_statistics_saved_for_backward_come_from_the_fused_op() -> None:
    x = torch.randn(4, 32, dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(32, dtype=torch.bfloat16, requires_grad=True)
    gm = _aot_forward(_llama_rms_norm, x, weight)
    saved = [n for n in gm.graph.find_nodes(op="output")[0].args[0] if n.target is torch.ops.aten.rsqrt.default]
    assert saved, "the forward graph saves the pattern's rsqrt for the backward"
    assert fuse_rms_norm(gm) == 1
    assert torch.ops.aten.rsqrt.default not in [n.target for n in gm.graph.nodes]
    hidden = x.detach().float()
    rstd = torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + 1e-6)
    outputs = gm(x.detach(), weight.detach())
    torch.testing.assert_close(outputs[0], _llama_rms_norm(x, weight).detach(), rtol=1e-2, atol=1e-2)
    assert any(o.dtype == torch.float32 and o.shape == rstd.shape and torch.allclose(o, rstd) for o in outputs)


def test_other_rsqrt_patterns_are_left_alone() -> None:
    def not_a_norm(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + 1e-6)  # reduces the first dim

    gm = _aot_forward(not_a_norm, torch.randn(4, 32))
    assert fuse_rms_norm(gm) == 0


def test_substituted_kernels_are_left_out_of_the_plan() -> None:
    """A substituted Neuron kernel charges its own time when it runs; the plan must not charge it again."""
    from neuron_compile import nki_substitution

    nki_exp = nki_substitution._replacement(torch.ops.aten.exp.default, torch.exp)
    plan = _plan(lambda x: nki_exp(x) * 2, torch.randn(64, 64))
    assert [k.nodes for k in plan.kernels] == [["mul"]]
    assert plan.kernels[0].hbm_bytes == 2 * 4 * 64 * 64  # the kernel's output is read from HBM, the product written


@pytest.mark.all_wheels  # with neuron-nki installed its kernels are the plugin's; alone, none
def test_only_kernels_a_plugin_registered_are_substituted(monkeypatch: pytest.MonkeyPatch) -> None:
    """neuron-device's own kernels for substitutable ops (the CPU kernel on host aliases) stay with Inductor; only a
    plugin's (neuron-nki's NKI kernels, when installed and simulated) replace an op."""
    monkeypatch.setenv("NEURON_NKI_NATIVE_KERNELS", "simulate")
    from neuron_compile import nki_substitution
    from neuron_device.ops import registry

    substituted = {id(fn) for fn in nki_substitution.substitutable_ops().values()}
    for name in ("aten::_softmax", "aten::native_layer_norm"):
        assert (id(registry.kernels[name]) in substituted) == (name not in registry.builtin), name


def test_flex_attention_is_priced_as_a_flash_kernel() -> None:
    """Issue 39, item 5: a compiled graph's flex attention (a higher-order op) is one flash kernel priced as
    attention (`attention_work`, every score block: the block mask's sparsity is run-time data), forward and
    backward; it was a data-movement kernel sized by its output."""
    from torch.nn.attention.flex_attention import flex_attention

    q = torch.randn(2, 4, 128, 64)
    graph = make_fx(lambda q, k, v: flex_attention(q, k, v), tracing_mode="fake")(q, q, q)
    (kernel,) = [k for k in plan_kernels(graph).kernels if "flex_attention" in k.nodes]
    assert kernel.anchor_engine == "tensor" and kernel.work == attention_work(8, 128, 128, 64, causal=False)
    forward = next(n for n in graph.graph.nodes if n.name == "flex_attention")
    with graph.graph.inserting_after(forward):  # the backward op's query, key and value come first as well
        node = graph.graph.call_function(torch.ops.higher_order.flex_attention_backward, forward.args[:3])
    assert _classify(node) == ("matmul", "tensor", attention_work(8, 128, 128, 64, causal=False, backward=True))


def _cache_update(cache: torch.Tensor, position: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    cache.index_copy_(2, position, new)  # a static KV cache's update (transformers' StaticCache)
    return cache.sum()


@pytest.mark.parametrize("decompose", [False, True], ids=["index_copy", "index_put"])
def test_a_scatter_into_an_input_copied_back_runs_in_place(decompose: bool) -> None:
    """Issue 34 (E4's decode step): the functional form of an in-place cache update, a scatter into the graph input
    and a copy of the result back, is an aliased output on the device (TorchNeuron's aliasing analysis, HLO
    input_output_alias; Inductor reinplaces it): it writes its one row, not a copy of the whole 2 MiB cache read
    and written twice. Out of place (no copy back), the scatter does write a new cache."""
    cache, new = torch.zeros(1, 1, 8192, 128, dtype=torch.bfloat16), torch.randn(1, 1, 1, 128, dtype=torch.bfloat16)
    position = torch.tensor([5])
    table = torch._decomp.core_aten_decompositions() if decompose else {}

    def plan(fn):
        return plan_kernels(make_fx(torch.func.functionalize(fn, remove="mutations_and_views"), tracing_mode="fake",
                                    decomposition_table=table)(cache, position, new))

    row = 128 * 2
    scatter, total = plan(_cache_update).kernels  # the copy back is no kernel
    assert scatter.hbm_bytes == row + 8 + row  # the new row and its position in, the row out
    assert total.hbm_bytes == cache.nbytes + 2  # the sum reads the updated cache
    out_of_place, _ = plan(lambda cache, position, new: cache.index_copy(2, position, new).sum()).kernels
    assert out_of_place.hbm_bytes == 2 * cache.nbytes + row + 8


def test_a_cat_of_adjacent_pieces_of_one_buffer_is_that_buffer() -> None:
    """Issue 34 (T2): DTensor's sequence-parallel reduce-scatter on dim 1 splits its input along dim 1 and
    concatenates the pieces along dim 0; at batch 1 the result has the input's bytes in the input's order, and the
    compiler (a reduce-scatter on dim 1, XLA's folding of a concatenation of adjacent slices) moves nothing. It cost
    a read and a write of the [4096, 4096] activation, 0.25 ms a time, four times a layer. A cat that reorders
    (batch 2) or duplicates still copies."""
    x, w = torch.randn(1, 64, 32), torch.randn(32, 32)

    def reassemble(x, w):  # the pieces laid side by side, as they lie in x
        return torch.cat(torch.split(x, 16, dim=1)) @ w

    (matmul,) = _plan(reassemble, x, w).kernels  # no data-movement kernel
    assert matmul.hbm_bytes == 4 * (64 * 32 + 32 * 32 + 64 * 32)  # x and w in, the product out
    reorder = _plan(reassemble, torch.randn(2, 64, 32), w).kernels
    assert [k.anchor_engine for k in reorder] == ["dma", "tensor"]
    assert [k.anchor_engine for k in _plan(lambda x: torch.cat([x, x]).exp(), x).kernels] == ["dma", "scalar"]


class _Cached(torch.nn.Module):
    """Two linear layers and a buffer the forward writes (as a static KV cache is written)."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = torch.nn.Linear(256, 512), torch.nn.Linear(512, 256)
        self.register_buffer("cache", torch.zeros(4, 256))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.cache.copy_(x)
        return self.second(torch.relu(self.first(self.cache)))


def _compiled_plan(monkeypatch: pytest.MonkeyPatch, mode: str):
    """The kernel plan of `_Cached` compiled with backend "neuron" under bf16 autocast (fp32 weights), and the
    AOT graph's casts of its 2-D inputs (the two weights and x, which the graph writes into the buffer)."""
    from neuron_compile import passes

    monkeypatch.setenv("TORCH_NEURONX_DISABLE_NEFF_CACHE", "1")  # planned afresh in every case
    captured = []
    plan_kernels_ = passes.plan_kernels
    monkeypatch.setattr(passes, "plan_kernels",
                        lambda gm, *args: captured.append((gm, args, plan_kernels_(gm, *args))) or captured[-1][2])
    model = _Cached().to("neuron")
    if mode == "requires_grad_(False)":
        model.requires_grad_(False)
    x = torch.randn(4, 256, device="neuron")
    grad = {"no_grad": torch.no_grad(), "inference_mode": torch.inference_mode()}.get(mode, contextlib.nullcontext())
    with grad, torch.autocast("neuron", dtype=torch.bfloat16):
        out = torch.compile(model, backend="neuron")(x)
    gm, args, plan = captured[0]
    written = {n.args[0] for n in gm.graph.nodes if n.target == torch.ops.aten.copy_.default}
    assert len(written) == 1 and not written & set(*args or [()])  # the buffer is no constant
    casts = {n.name for n in gm.graph.nodes if n.target == torch.ops.prims.convert_element_type.default
             and n.args[0].op == "placeholder" and n.args[0].meta["val"].dim() == 2}
    return plan, casts, out


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "requires_grad_(False)"])
def test_an_inference_graph_folds_the_work_on_its_frozen_weights(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """Issue 38: neuronx-cc takes an inference graph's weights as constants, so the bf16 casts of an fp32 model's
    weights under autocast are done once, at compile time. The per-call plan has no cast of a weight (the buffer
    the graph writes is no constant), the matmuls read the weights as bf16, and the folded copies are the graph's
    constants."""
    plan, casts, out = _compiled_plan(monkeypatch, mode)
    assert out.dtype == torch.bfloat16
    planned = {name for kernel in plan.kernels for name in kernel.nodes}
    assert len(casts) == 3  # both weights and x (the graph reads the buffer as x, which it writes there)
    assert len(casts & planned) == 1  # x's
    weights = 256 * 512 * 2
    assert plan.constant_bytes == 2 * (weights + 512 + 256)  # bf16 copies of both weights and biases
    bytes_read = sum(k.hbm_bytes for k in plan.kernels)
    assert bytes_read < 4 * weights  # the fp32 weights are not read per call


def test_a_training_graph_charges_the_casts_of_its_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parameters that require grad are not constants: their casts run (and are planned) every call."""
    plan, casts, _ = _compiled_plan(monkeypatch, "train")
    planned = {name for kernel in plan.kernels for name in kernel.nodes}
    assert len(casts) == 3 and casts <= planned
    assert plan.constant_bytes == 0


def _dropout_after_matmul(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dropout on a matmul's result as Inductor decomposes it (random numbers from `inductor_random`), then a
    `where` with a constant fill, as SDPA's safe softmax writes it; the mask is returned (saved for backward)."""
    seeds = torch.ops.prims.inductor_seeds(1, torch.device("cpu"))
    keep = torch.ops.prims.inductor_random([32, 16], torch.ops.prims.inductor_lookup_seed(seeds, 0), "rand") > 0.1
    y = torch.mm(x, w)
    return torch.where(y > 0, torch.full([32, 16], 0.0), y * keep * 1.1), keep


def test_random_numbers_and_constant_fills_are_made_on_chip() -> None:
    """Issue 34 (T1): dropout's random numbers are made by the Vector engine inside the kernel that uses them
    (`nki.isa.rand2` / `nki.isa.dropout`: one pass), and a constant fill is a scalar operand; neither crosses HBM.
    They were kernels of their own: BERT-Large's fp32 random numbers written and read back, 0.25 ms a layer and
    micro-batch."""
    import torch._inductor.inductor_prims  # defines the prims

    x, w = torch.randn(32, 64), torch.randn(64, 16)
    plan = _plan(_dropout_after_matmul, x, w)
    matmul = next(k for k in plan.kernels if "mm" in k.nodes)
    assert {"inductor_random", "gt", "full", "where"} <= set(matmul.nodes)
    # x, w and the seed in; the result and the kept mask (bool) out: no fp32 random numbers, no fill
    assert matmul.hbm_bytes == 4 * (32 * 64 + 64 * 16 + 32 * 16) + 8 + 32 * 16
    assert matmul.work["vector"] >= 32 * 16  # the random-number pass
    assert all(k.hbm_bytes < 100 for k in plan.kernels if k is not matmul)  # the seed's look-ups


def test_a_constant_fill_a_scatter_accumulates_into_is_written() -> None:
    """The zeros an embedding's backward accumulates into are memory the scatter (data movement) reads: a kernel
    writes them first (as before the fills were made on chip)."""
    table = torch.randn(100, 8)
    ids = torch.tensor([1, 5, 5])
    plan = _plan(lambda g, ids: torch.full((100, 8), 0.0).index_put([ids], g, accumulate=True), torch.randn(3, 8), ids)
    fill = next(k for k in plan.kernels if k.nodes == ["full"])
    assert fill.hbm_bytes == table.nbytes


def test_a_scatter_accumulate_into_zeros_added_to_a_result_runs_in_place_in_it() -> None:
    """Issue 34 (T1): a tied embedding's gradient, the embedding's backward (index_put-accumulate into zeros) plus
    the output projection's weight gradient, is the projection's gradient with the looked-up rows added in place
    (XLA: `X + scatter(0, i, u)` -> `scatter(X, i, u)`): no zeros, no pass over the whole table to add them. For
    BERT-Large ([30522, 1024] fp32) that was 2.8 ms a micro-batch."""
    table, rows = (1000, 64), 16
    grad_out, hidden, ids = torch.randn(rows, table[0]), torch.randn(rows, table[1]), torch.randint(0, 1000, (rows,))

    def tied(grad_out, hidden, ids, values):
        projection = torch.mm(grad_out.t(), hidden)
        return projection + torch.ops.aten._unsafe_masked_index_put_accumulate(
            torch.full(table, 0.0), (ids != -1).unsqueeze(1), [ids], values)  # the padding mask

    kernels = _plan(tied, grad_out, hidden, ids, torch.randn(rows, table[1])).kernels
    assert [k.anchor_engine for k in kernels] == ["tensor", "vector", "gpsimd"]  # the mask; no fill, no add
    scatter = kernels[2]
    row_bytes = rows * table[1] * 4
    assert scatter.hbm_bytes == rows + rows * 8 + row_bytes + row_bytes  # mask, ids, values in; the rows out
