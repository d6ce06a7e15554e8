"""What compiling a `neuron` graph as a host graph must get right beyond lowering: random numbers from the `neuron`
generator, ops the host's CPU kernels refuse (integer `histc`), data-dependent sizes, the device's streams under
Dynamo, substituted kernels' output layouts, `torch.autocast("neuron")` (which never fires on host tensors), and the
node each output is sourced at (what a plan's out-of-memory names)."""

from __future__ import annotations

import pytest
import torch

from neuron_compile import nki_substitution

pytestmark = pytest.mark.compiler


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def dropout_and_rand(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.dropout(x, 0.5, training=True) + torch.rand_like(x)


def test_compiled_random_ops_draw_from_the_neuron_generator() -> None:
    compiled = torch.compile(dropout_and_rand, backend="neuron", fullgraph=True)
    x = torch.ones(64, device="neuron")
    torch.manual_seed(0)
    first = compiled(x).cpu()
    torch.neuron.manual_seed(0)
    torch.random.default_generator.manual_seed(1234)  # the CPU generator plays no part
    again = compiled(x).cpu()
    torch.neuron.manual_seed(1)
    other = compiled(x).cpu()
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    assert not torch.equal(other, first)
    assert set(first.floor().unique().tolist()) <= {0.0, 2.0}  # dropout's 0 or 2, plus a uniform in [0, 1)


def shuffle_and_sample(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ops Inductor leaves to ATen: they run their CPU kernels from the compiled code. (`gather`, because
    torch 2.13's Inductor fails to compile `x[randperm(n)]` and `index_select` by a permutation, on CPU too.)"""
    return torch.gather(x, 0, torch.randperm(x.numel(), device=x.device)), torch.multinomial(x.abs() + 0.1, 4)


def test_compiled_aten_random_ops_draw_from_the_neuron_generator_as_eager() -> None:
    """`randperm` and `multinomial` in a compiled graph give eager `neuron`'s numbers for the same device seed,
    advance the device generator as eager does, and leave the CPU generator alone."""
    compiled = torch.compile(shuffle_and_sample, backend="neuron", fullgraph=True)
    x = torch.randn(32, device="neuron")
    compiled(x)
    cpu_state = torch.random.default_generator.get_state()
    results = {}
    for name, fn in (("eager", shuffle_and_sample), ("compiled", compiled)):
        torch.neuron.manual_seed(3)
        results[name] = [[t.cpu() for t in fn(x)] for _ in range(2)]  # two calls: the generator advances
    assert torch.equal(torch.random.default_generator.get_state(), cpu_state)
    for (eager_perm, eager_sample), (perm, sample) in zip(results["eager"], results["compiled"]):
        torch.testing.assert_close(perm, eager_perm, rtol=0, atol=0)
        torch.testing.assert_close(sample, eager_sample, rtol=0, atol=0)
    assert not torch.equal(results["compiled"][0][0], results["compiled"][1][0])


def test_compiled_dropout_trains_reproducibly() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Dropout(0.5)).to("neuron")
    compiled = torch.compile(model, backend="neuron", fullgraph=True)
    x = torch.randn(8, 16, device="neuron")
    grads = []
    for _ in range(2):
        torch.neuron.manual_seed(7)
        model.zero_grad()
        compiled(x).sum().backward()
        grads.append(model[0].weight.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)


def expert_counts(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' qwen2_moe load-balancing loss on an accelerator: integer `histc` of the chosen experts."""
    _, selected = torch.topk(logits.softmax(-1), 2, dim=-1)
    flat = selected.reshape(-1)
    return torch.histc(flat.to(torch.int32), bins=8, min=0, max=8), flat.int().histc(bins=8, min=0, max=7)


@pytest.mark.all_wheels  # neuron-nki's kernels run in its graphs when installed
def test_integer_histc_compiles_and_matches_eager() -> None:
    logits = torch.randn(32, 8, device="neuron")
    compiled = torch.compile(expert_counts, backend="neuron", fullgraph=True)
    for got, want in zip(compiled(logits), expert_counts(logits)):
        assert got.dtype == want.dtype == torch.int32
        torch.testing.assert_close(got.cpu(), want.cpu())


def test_bincount_with_a_data_dependent_size_compiles() -> None:
    def counts(logits: torch.Tensor) -> torch.Tensor:
        return torch.bincount(logits.argmax(-1), minlength=8)

    logits = torch.randn(32, 8, device="neuron")
    got = torch.compile(counts, backend="neuron", fullgraph=True)(logits)
    torch.testing.assert_close(got.cpu(), counts(logits.cpu()))


@pytest.mark.parametrize("current_stream", ["torch.accelerator", "torch.neuron"])
def test_current_stream_traces_without_graph_breaks(current_stream: str) -> None:
    module = torch.accelerator if current_stream == "torch.accelerator" else torch.neuron

    def scaled(x: torch.Tensor):
        stream = module.current_stream()
        return x * 2, stream

    out, stream = torch.compile(scaled, backend="neuron", fullgraph=True)(torch.ones(4, device="neuron"))
    assert stream == torch.neuron.current_stream()
    torch.testing.assert_close(out.cpu(), torch.full((4,), 2.0))
    assert not torch._dynamo.utils.counters["graph_break"]


def test_substituted_kernel_outputs_take_the_layout_the_meta_function_promises() -> None:
    """A kernel returning a contiguous result where the op's meta function follows the input's memory order (here
    `exp` of a transposed, non-dense view) is restrided by the substituted op, as Inductor's stride checks need."""
    op = torch.ops.aten.exp.default
    replacement = nki_substitution._replacement(op, lambda x: torch.exp(x).contiguous())
    base = torch.randn(2, 16, 4, 8)[..., :6]  # non-dense
    x = base.transpose(1, 2)
    out = replacement(x)
    with torch._subclasses.FakeTensorMode() as mode:
        promised = op(mode.from_tensor(x))
    assert out.stride() == promised.stride() != torch.exp(x).contiguous().stride()
    torch.testing.assert_close(out, torch.exp(x))


def _mixed_precision(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = torch.mm(x, w)
    return (y, y.softmax(-1), torch.nn.functional.layer_norm(y, (8,)), y.exp(), y.sum(), torch.nn.functional.gelu(y),
            (y @ y).log_softmax(-1))


@pytest.mark.all_wheels  # neuron-nki's kernels run in its graphs when installed
def test_compiled_graphs_follow_neuron_autocast_as_eager() -> None:
    """Under `torch.autocast("neuron")` a compiled graph gives eager's dtypes, with `neuron`'s op lists (softmax,
    layer_norm, exp, sum in fp32 as on CUDA, where CPU autocast would keep them bf16), and close values; gradients
    flow; outside autocast the graph recompiles to fp32. Issue 17: compiled graphs ignored autocast (all fp32)."""
    x = torch.randn(8, 8, device="neuron", requires_grad=True)
    w = torch.randn(8, 8, device="neuron")
    compiled = torch.compile(_mixed_precision, backend="neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        eager, graph = _mixed_precision(x, w), compiled(x, w)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            cpu = _mixed_precision(x.detach().cpu(), w.cpu())
    assert [t.dtype for t in graph] == [t.dtype for t in eager]
    assert [t.dtype for t in eager][:3] == [torch.bfloat16, torch.float32, torch.float32]
    assert cpu[1].dtype == torch.bfloat16  # CPU's policy differs: the graph is not traced under it
    for got, expected in zip(graph, eager):
        torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
    graph[1].sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.float32
    assert all(t.dtype == torch.float32 for t in compiled(x, w))



def _cache_made_and_updated(values: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cache = torch.zeros(4, 8)
    cache.index_copy_(0, positions, values)
    return cache, values * 2


def test_an_output_is_sourced_at_the_node_that_allocates_it() -> None:
    """What a plan's out-of-memory names for a compiled graph's output (`host_runtime.output_sources`): the op and the
    stack trace of the node that allocated its buffer. In the functional AOT graph, a buffer made and then updated in
    place is an `index_copy` of a `zeros`: the allocation is the `zeros`, back through ops torch's reinplacing would
    run in place; an op whose result is new memory (`values * 2`) is its own."""
    from torch._dynamo.backends.common import aot_autograd

    from neuron_compile.host_runtime import output_sources

    graphs = []

    def capture(gm: torch.fx.GraphModule, example_inputs):
        graphs.append(gm)
        return gm

    compiled = torch.compile(_cache_made_and_updated, backend=aot_autograd(fw_compiler=capture), fullgraph=True)
    compiled(torch.ones(2, 8), torch.tensor([0, 2]))
    (graph,) = graphs
    assert torch.ops.aten.index_copy.default in [node.target for node in graph.graph.nodes]
    (cache_op, cache_trace), (product_op, product_trace) = output_sources(graph)
    assert cache_op == "aten.zeros.default" and "cache = torch.zeros(4, 8)" in cache_trace
    assert product_op == "aten.mul.Tensor" and "values * 2" in product_trace
