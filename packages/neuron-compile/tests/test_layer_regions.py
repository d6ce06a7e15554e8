"""transformers' decoder layers traced once per kind while Dynamo traces for `neuron` (`layer_regions`): the
compiled prefill (which allocates the static cache) and decode of a tiny Llama stamp the first layer's trace out
for every later layer, give the CPU's greedy tokens, and the backend compiles the graph an unmarked trace gives."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from torch._dynamo.variables import invoke_subgraph  # noqa: E402

from neuron_compile import aot_regions, backend, compiler, layer_regions  # noqa: E402

pytestmark = [pytest.mark.optional, pytest.mark.usefixtures("fresh_dynamo_and_metrics")]  # the hf session runs it

LAYERS = 3


def _model() -> tuple[transformers.LlamaForCausalLM, transformers.LlamaConfig]:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128, pad_token_id=0)
    return transformers.LlamaForCausalLM(config).eval(), config


def _generate(model, config, prompt: torch.Tensor, compiled: bool) -> torch.Tensor:
    cache = transformers.StaticCache(config=config, max_cache_len=16)
    return model.generate(prompt, max_new_tokens=4, do_sample=False, past_key_values=cache,
                          prefill_chunk_size=prompt.shape[1], disable_compile=not compiled)


@pytest.fixture
def counted(monkeypatch):
    """How many layer calls Dynamo stamped out from an earlier trace, and the op counts of the graphs the backend
    compiled (after inlining)."""
    counts = {"stamped": 0, "graphs": []}
    stamp = invoke_subgraph.stamp_out_subgraph
    inline = backend._inlined_regions

    def stamped(*args, **kwargs):
        counts["stamped"] += 1
        return stamp(*args, **kwargs)

    def inlined(gm):
        gm = inline(gm)
        counts["graphs"].append([(node.op, str(node.target)) for node in gm.graph.nodes
                                 if node.op in ("call_function", "call_method")])
        return gm

    monkeypatch.setattr(invoke_subgraph, "stamp_out_subgraph", stamped)
    monkeypatch.setattr(backend, "_inlined_regions", inlined)
    return counts


def test_compiled_generate_traces_each_layer_once_and_matches_the_cpu(counted, monkeypatch):
    model, config = _model()
    prompt = torch.randint(1, config.vocab_size, (1, 6))
    cpu = _generate(model, config, prompt, compiled=False)
    model.to("neuron")
    tokens = _generate(model, config, prompt.to("neuron"), compiled=True)
    assert torch.equal(tokens.cpu(), cpu)
    # two graphs (the prefill, which allocates the cache, and the decode): every layer after the first stamped
    assert len(counted["graphs"]) == 2
    assert counted["stamped"] == 2 * (LAYERS - 1)
    assert not any("invoke_subgraph" in target for graph in counted["graphs"] for _, target in graph)
    regioned = counted["graphs"]

    torch._dynamo.reset()
    counted["graphs"], counted["stamped"] = [], 0
    monkeypatch.setenv("NEURON_COMPILE_LAYER_REGIONS", "0")
    unmarked = _generate(model, config, prompt.to("neuron"), compiled=True)
    assert torch.equal(unmarked.cpu(), cpu)
    assert counted["stamped"] == 0
    assert counted["graphs"] == regioned  # the same ops in the same order, whether the layers were traced once or each


def _described(gm: torch.fx.GraphModule) -> list[tuple]:
    """`gm`'s nodes by op, target, arguments (other nodes by position) and result layout: names aside, the graph."""
    index = {node: position for position, node in enumerate(gm.graph.nodes)}

    def arg(value):
        return ("node", index[value]) if isinstance(value, torch.fx.Node) else repr(value)

    def layout(value):
        if isinstance(value, torch.Tensor):
            return tuple(value.shape), value.stride(), value.dtype, str(value.device)
        return [layout(v) for v in value] if isinstance(value, (tuple, list)) else repr(value)

    return [(node.op, str(node.target), torch.fx.node.map_aggregate(node.args, arg),
             torch.fx.node.map_aggregate(node.kwargs, arg), layout(node.meta.get("val")))
            for node in gm.graph.nodes]


@pytest.fixture
def aot_traced(monkeypatch):
    """The AOT graphs the compiler gets (`_described`) and the identifier of the local graph of each region call
    AOTAutograd's passes make (`aot_regions._local_graph`)."""
    graphs, calls = [], []
    inner, local_graph = compiler._inner_compile, aot_regions._local_graph

    def compiled(gm, *args, **kwargs):
        graphs.append(_described(gm))
        return inner(gm, *args, **kwargs)

    def traced(*args, **kwargs):
        found = local_graph(*args, **kwargs)
        calls.append(found[1])
        return found

    monkeypatch.setattr(compiler, "_inner_compile", compiled)
    monkeypatch.setattr(aot_regions, "_local_graph", traced)
    return graphs, calls


def test_regions_kept_through_aot_autograd_give_the_same_aot_graphs(aot_traced, monkeypatch):
    """`NEURON_COMPILE_AOT_REGIONS=1`: AOTAutograd's passes call each layer's region through one local graph (traced
    once per pass, not per layer), the KV cache writes included; the AOT graphs the compiler gets (prefill, which
    allocates the cache, and decode) are those of the regions inlined before AOTAutograd, node for node, and the
    tokens are the CPU's."""
    graphs, calls = aot_traced
    model, config = _model()
    prompt = torch.randint(1, config.vocab_size, (1, 6))
    cpu = _generate(model, config, prompt, compiled=False)
    model.to("neuron")
    runs = {}
    for switch in ("0", "1"):  # the switch off, then on (its default)
        torch._dynamo.reset()
        graphs.clear()
        monkeypatch.setenv("NEURON_COMPILE_AOT_REGIONS", switch)
        monkeypatch.setenv("TORCH_NEURONX_DISABLE_NEFF_CACHE", "1")  # each run traces
        tokens = _generate(model, config, prompt.to("neuron"), compiled=True)
        assert torch.equal(tokens.cpu(), cpu)
        runs[switch] = list(graphs)
    assert len(runs["1"]) == 2
    assert runs["1"] == runs["0"]
    # AOTAutograd's metadata pass and its trace, each calling the 3 layers' regions, in both graphs; each pass's
    # local graph traced once (the metadata pass's without decompositions, the trace's with AOTAutograd's)
    assert len(calls) == 2 * 2 * LAYERS
    assert len(set(calls)) == 2 * 2


def test_regions_through_aot_autograd_keep_each_layers_constants(aot_traced, monkeypatch):
    """Gemma 3's sliding-window cache layer makes a tensor from constants in its update: the trace of the inlined
    layers lifts one constant a layer, the local graph's trace one; every call of the region gets its own copy, so
    the compiled decode is the same graph (names aside) and gives the CPU's tokens."""
    graphs, calls = aot_traced
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=4,
                                           pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                           layer_types=["sliding_attention", "full_attention"] * 3)
    model = transformers.Gemma3ForCausalLM(config).eval()
    prompt = torch.randint(3, config.vocab_size, (1, 6))
    cpu = model.generate(prompt, max_new_tokens=4, do_sample=False, cache_implementation="static",
                         disable_compile=True)
    model.to("neuron")
    monkeypatch.setenv("TORCH_NEURONX_DISABLE_NEFF_CACHE", "1")
    runs = {}
    for switch in ("0", "1"):
        torch._dynamo.reset()
        graphs.clear()
        monkeypatch.setenv("NEURON_COMPILE_AOT_REGIONS", switch)
        tokens = model.generate(prompt.to("neuron"), max_new_tokens=4, do_sample=False, cache_implementation="static")
        assert torch.equal(tokens.cpu(), cpu)
        runs[switch] = [[entry for entry in graph if entry[0] != "get_attr"] for graph in graphs], \
            [sum(entry[0] == "get_attr" for entry in graph) for graph in graphs]
    assert calls and runs["1"] == runs["0"] and runs["1"][0]


def test_regions_only_while_tracing_for_neuron(counted):
    """Another backend's trace, and eager calls, run the layers as transformers wrote them."""
    model, config = _model()
    prompt = torch.randint(1, config.vocab_size, (1, 6))
    cache = transformers.StaticCache(config=config, max_cache_len=16)
    assert not layer_regions.active()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        model(prompt, past_key_values=cache)
        position = torch.tensor([6])
        compiled(prompt[:, :1], past_key_values=cache, cache_position=position, position_ids=position[None])
    assert counted["stamped"] == 0


class _TupleLayer(transformers.modeling_layers.GradientCheckpointingLayer):
    """A decoder layer of the older form: it returns (hidden states, attention weights or None)."""

    def __init__(self, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.kv = torch.nn.Linear(64, 32)  # 2 key/value heads of 16

    def forward(self, hidden, past_key_values=None, cache_position=None):
        states = self.kv(hidden).view(1, -1, 2, 16).transpose(1, 2)
        keys, values = past_key_values.update(states, states * 2, self.layer_idx, {"cache_position": cache_position})
        return hidden + keys.sum() * 1e-3 + values.mean(), None


def _stack(layers, hidden, cache, position):
    for layer in layers:
        hidden, weights = layer(hidden, past_key_values=cache, cache_position=position)
        assert weights is None
    return hidden


def test_a_layer_returning_a_tuple_gives_the_cpus_results(counted):
    """Dynamo reuses a region only when it returns tensors alone: such a layer is traced at each call, as unmarked."""
    _, config = _model()
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(_TupleLayer(index) for index in range(LAYERS))
    hidden, position = torch.randn(1, 6, 64), torch.arange(6)
    cpu = _stack(layers, hidden, transformers.StaticCache(config=config, max_cache_len=16), position)
    layers.to("neuron")
    compiled = torch.compile(_stack, backend="neuron", fullgraph=True)
    cache = transformers.StaticCache(config=config, max_cache_len=16)
    out = compiled(layers, hidden.to("neuron"), cache, position.to("neuron"))
    torch.testing.assert_close(out.cpu(), cpu)
    assert counted["stamped"] == 0
    assert len(counted["graphs"]) == 1


def test_install_keeps_the_layers_own_call(monkeypatch):
    """Older transformers define `GradientCheckpointingLayer.__call__` (gradient checkpointing): every call, eager or
    traced, still goes through it."""
    base = transformers.modeling_layers.GradientCheckpointingLayer
    calls = []

    def own_call(self, *args, **kwargs):
        calls.append(type(self).__name__)
        return torch.nn.Module.__call__(self, *args, **kwargs)

    monkeypatch.setattr(layer_regions, "_layer_call", layer_regions._layer_call)
    monkeypatch.setattr(base, "__call__", own_call)
    layer_regions.install()
    assert base.__call__ is layer_regions._call
    _, config = _model()
    _stack([_TupleLayer(0)], torch.randn(1, 6, 64), transformers.StaticCache(config=config, max_cache_len=16),
           torch.arange(6))
    assert calls == ["_TupleLayer"]
