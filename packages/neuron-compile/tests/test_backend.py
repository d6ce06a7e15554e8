"""TorchNeuron's compile contract: discovery by entry point, static shapes and recompilation metrics, `mode`,
`options`, fallback execution, auto-copy of CPU inputs, graph breaks, debug artifacts."""

from __future__ import annotations

import importlib.metadata
import re
import warnings

import pytest
import torch

from neuron_compile import backend, compiler, metrics
from neuron_compile.backend import DynamicShapesNotSupported, NeuronCompileError
from neuron_compile.settings import CompileSettings
from neuron_device import services
from neuron_device.simulation import ledger as host_exec

pytestmark = [pytest.mark.compiler, pytest.mark.usefixtures("fresh_dynamo_and_metrics")]


def scale_shift(x: torch.Tensor) -> torch.Tensor:
    return (x * 2 + 1).relu()


def _inner(info: pytest.ExceptionInfo) -> BaseException:
    assert isinstance(info.value, torch._dynamo.exc.BackendCompilerFailed)
    return info.value.inner_exception


def test_entry_points_are_declared() -> None:
    dynamo = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="torch_dynamo_backends")}
    assert dynamo.get("neuron") == "neuron_compile.backend:neuron_backend"
    plugins = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="neuron_device.plugins")}
    assert plugins.get("neuron_compile") == "neuron_compile.plugin"


def test_backend_found_by_name_without_import() -> None:
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("neuron") is backend.neuron_backend


def test_dynamic_true_is_rejected_naming_the_alternatives() -> None:
    compiled = torch.compile(scale_shift, backend="neuron", dynamic=True)
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
        compiled(torch.ones(4, device="neuron"))
    error = _inner(info)
    assert isinstance(error, DynamicShapesNotSupported)
    # TorchNeuron's documented text first (issue 21)
    assert re.match(r"Dynamic shapes detected in the model, but torch-neuronx requires static shapes\. "
                    r"Found \d+ dynamic dimension\(s\): input 0", str(error))
    assert "dynamic=True is not supported" in str(error)
    assert "dynamic=False" in str(error) and "pad or bucket" in str(error)


def test_unknown_option_is_an_error() -> None:
    compiled = torch.compile(scale_shift, backend="neuron", options={"model_nmae": "x"})
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
        compiled(torch.ones(4, device="neuron"))
    assert "unknown option(s) ['model_nmae']" in str(_inner(info))


def test_new_shapes_recompile_and_are_counted() -> None:
    compiled = torch.compile(scale_shift, backend="neuron")
    for size in (3, 4, 5, 4):
        x = torch.randn(size, device="neuron")
        torch.testing.assert_close(compiled(x).cpu(), scale_shift(x).cpu())
    # The counters moved from get_dynamo_metrics() to metrics.counters(): get_dynamo_metrics() now returns
    # TorchNeuron's per-graph records (issue 21), one per compiled graph.
    counts = metrics.counters()
    assert counts["compilations"] == 3  # the repeated shape 4 reuses its graph
    assert counts["recompilations"] == 2
    assert len(torch.neuron.get_dynamo_metrics()) == 3
    torch.neuron.reset_dynamo_metrics()
    assert metrics.counters()["compilations"] == 0
    assert torch.neuron.get_dynamo_metrics() == []


@pytest.mark.parametrize("backend_name", ["neuron", "eager"])
def test_recompile_limit_fallback_to_eager_warns(backend_name: str) -> None:
    """Past Dynamo's recompile limit a frame runs eagerly: for backend "neuron" never silently (a warning naming the
    limit and how to raise it); other backends keep Dynamo's own behaviour."""
    def shift(x: torch.Tensor) -> torch.Tensor:  # a code object of its own: its compiles alone count to the limit
        return x + 1

    compiled = torch.compile(shift, backend=backend_name, dynamic=False)
    with torch._dynamo.config.patch(recompile_limit=2), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for size in (2, 3, 4, 5):
            x = torch.randn(size, device="neuron")
            torch.testing.assert_close(compiled(x).cpu(), shift(x).cpu())
    limit = [w for w in caught if "recompile_limit" in str(w.message)]
    if backend_name == "eager":
        assert not limit
        return
    assert len(limit) == 1 and limit[0].category is RuntimeWarning  # once: the frame is then left to eager
    message = str(limit[0].message)
    assert "config.recompile_limit (2)" in message and "'shift'" in message
    assert "torch._dynamo.config.recompile_limit" in message and "fail_on_recompile_limit_hit" in message
    assert metrics.counters()["compilations"] == 2


def test_blocks_compiled_one_by_one_compile_one_shared_graph() -> None:
    """32 blocks each given to torch.compile(backend="neuron"): the string backend is one callable, so their shared
    `forward` compiles once and every block runs it (none falls back to eager past the recompile limit)."""
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.linear(x)) + x

    blocks = [Block().to("neuron") for _ in range(32)]
    compiled = [torch.compile(block, backend="neuron") for block in blocks]
    x = torch.randn(2, 8, device="neuron", requires_grad=True)
    y = expected = x
    for block, compiled_block in zip(blocks, compiled):
        y, expected = compiled_block(y), block(expected)
    torch.testing.assert_close(y.cpu(), expected.cpu())
    assert len(torch._dynamo.eval_frame._debug_get_cache_entry_list(Block.forward.__code__)) == 1
    assert metrics.counters()["compilations"] == 1


def test_mode_other_than_default_warns_and_compiles_as_default() -> None:
    compiled = torch.compile(scale_shift, backend="neuron", mode="max-autotune")
    x = torch.randn(6, device="neuron")
    with pytest.warns(UserWarning, match='supports only mode="default"'):
        out = compiled(x)
    torch.testing.assert_close(out.cpu(), scale_shift(x).cpu())


def test_model_name_names_the_debug_artifacts(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TORCH_NEURONX_DEBUG_DIR", str(tmp_path))
    monkeypatch.setenv("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", "1")
    x = torch.randn(6, device="neuron")
    torch.compile(scale_shift, backend="neuron", options={"model_name": "tiny"})(x)
    graphs = sorted(p.name for p in (tmp_path / "fx_graphs" / "proc_0").iterdir())
    assert graphs == ["tiny_0_0_dynamo.txt", "tiny_0_0_inference.txt"]
    code = (tmp_path / "code" / "proc_0" / "tiny_0_0_inference.py").read_text()
    if CompileSettings.resolve().host_code == "inductor":
        assert 'extern "C"' in code and "cpp_fused" in code  # the generated C++ kernels
    else:
        assert "torch.ops.aten.mul.Tensor" in code  # the AOT graph's own code, calling ATen kernels


def test_graph_breaks_compile_each_subgraph() -> None:
    def broken(x: torch.Tensor) -> torch.Tensor:
        y = scale_shift(x)
        torch._dynamo.graph_break()
        return y * 3

    x = torch.randn(5, device="neuron")
    out = torch.compile(broken, backend="neuron")(x)
    torch.testing.assert_close(out.cpu(), (scale_shift(x) * 3).cpu())
    assert metrics.counters()["compilations"] == 2


def test_data_dependent_shape_in_the_backward_is_a_graph_break() -> None:
    """A boolean-mask assignment's backward indexes with the mask (nonzero: a data-dependent shape). Dynamo breaks
    the graph there, as under Inductor, rather than the compile failing (T5Gemma2's embeddings did)."""

    def embed(weight: torch.Tensor, ids: torch.Tensor, special: torch.Tensor) -> torch.Tensor:
        x = weight[ids]
        x[ids == 3] = special
        return x

    def grads(device: str, compiled: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        weight, special = torch.randn(8, 4, requires_grad=True), torch.randn(4, requires_grad=True)
        leaves = [t.detach().to(device).requires_grad_() for t in (weight, special)]
        fn = torch.compile(embed, backend="neuron") if compiled else embed
        out = fn(leaves[0], torch.tensor([[1, 3, 2], [3, 3, 0]], device=device), leaves[1])
        (out * torch.arange(4.0, device=device)).sum().backward()
        return [leaf.grad.cpu() for leaf in leaves]

    for compiled, expected in zip(grads("neuron", compiled=True), grads("cpu", compiled=False)):
        torch.testing.assert_close(compiled, expected)


def test_cpu_inputs_are_copied_to_neuron(monkeypatch) -> None:
    x = torch.randn(7)
    out = torch.compile(scale_shift, backend="neuron")(x)
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), scale_shift(x))
    torch._dynamo.reset()
    monkeypatch.setenv("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY", "1")
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
        torch.compile(scale_shift, backend="neuron")(x)
    # TorchNeuron's documented text (issue 21), then which graph and why
    assert str(_inner(info)).startswith("Input tensor at index 0 is on cpu device, expected neuron. Move tensor to "
                                        "Neuron device first with tensor.to('neuron')")


def test_compiled_graph_runs_without_per_op_python() -> None:
    compiled = torch.compile(scale_shift, backend="neuron")
    x = torch.randn(8, device="neuron")
    compiled(x)
    before = sum(host_exec.executed_ops.values())
    compiled(x)
    assert sum(host_exec.executed_ops.values()) == before


def _two_matmuls(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return torch.mm(torch.mm(x, w1).relu(), w2)


def test_intermediates_count_toward_peak_memory_as_in_eager() -> None:
    """The compiled graph's intermediate (the 1 MiB relu result, in a host buffer of Inductor's) is taken from the
    device allocator while the graph runs: the peak is eager's (intermediate plus result), not the result alone."""
    x, w1, w2 = (torch.randn(512, 512, device="neuron") for _ in range(3))
    compiled = torch.compile(_two_matmuls, backend="neuron")
    compiled(x, w1, w2)
    peaks = {}
    for name, fn in (("eager", _two_matmuls), ("compiled", compiled)):
        torch.neuron.reset_peak_memory_stats()
        before = torch.neuron.memory_allocated()
        out = fn(x, w1, w2)
        peaks[name] = torch.neuron.max_memory_allocated() - before
        assert torch.neuron.memory_allocated() - before == out.nbytes  # the workspace is given back
        del out
    assert peaks["compiled"] == peaks["eager"] == 2 * 512 * 512 * 4


def test_checkpointed_compiled_block_charges_its_recompute(monkeypatch) -> None:
    """A compiled block under non-reentrant activation checkpointing (`checkpoint_wrapper` around
    `torch.compile`) runs its forward graph again in the backward, and that run is charged as the first was
    (issue #34): checkpointing's early stop ends the rerun from the graph's `save_for_backward`, after the graph
    ran, and the charge used to be skipped with it."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    charges = []
    charge = services.charge
    monkeypatch.setattr(services, "charge", lambda index, seconds, name, *args, **kwargs: (
        charges.append((name, seconds)), charge(index, seconds, name, *args, **kwargs))[1])
    block = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 16)).to("neuron")
    checkpointed = checkpoint_wrapper(torch.compile(block, backend="neuron", fullgraph=True), preserve_rng_state=False)
    checkpointed(torch.randn(8, 16, device="neuron", requires_grad=True)).sum().backward()
    forwards = [seconds for name, seconds in charges if name == "neuron_compile::graph_forward"]
    assert len(forwards) == 2 and forwards[0] == forwards[1] > 0
    assert [name for name, _ in charges].count("neuron_compile::graph_backward") == 1


def _failing_compile(*args, **kwargs):
    raise RuntimeError("lowering exploded")


def test_compile_failure_raises_by_default(monkeypatch) -> None:
    monkeypatch.setattr(compiler, "compile_graph", _failing_compile)
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
        torch.compile(scale_shift, backend="neuron")(torch.ones(3, device="neuron"))
    error = _inner(info)
    assert isinstance(error, NeuronCompileError)
    assert "lowering exploded" in str(error) and "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0" in str(error)


@pytest.mark.parametrize("how", ["env", "option"])
def test_fallback_execution_runs_the_graph_eagerly_with_a_warning(monkeypatch, how: str) -> None:
    monkeypatch.setattr(compiler, "compile_graph", _failing_compile)
    options = None
    if how == "env":
        monkeypatch.setenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "0")
    else:
        options = {"fallback_execution": True}
    x = torch.randn(3, device="neuron")
    with pytest.warns(RuntimeWarning, match="running it eagerly"):
        out = torch.compile(scale_shift, backend="neuron", options=options)(x)
    torch.testing.assert_close(out.cpu(), scale_shift(x).cpu())
    assert metrics.counters()["fallbacks"] == 1


def test_bad_environment_value_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setenv("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", "maybe")
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
        with warnings.catch_warnings():
            torch.compile(scale_shift, backend="neuron")(torch.ones(3, device="neuron"))
    assert "must be 0 or 1" in str(_inner(info))


def test_dynamo_names_the_traced_functions_only_for_its_trace_log(monkeypatch) -> None:
    """The function names of Dynamo's `trace_call` debug log (found by tokenizing each source file) are looked up
    only when that log is on (`_patches.lazy_trace_log_headers`)."""
    from torch._dynamo import symbolic_convert

    looked_up = []
    name_of = symbolic_convert.get_funcname
    monkeypatch.setattr(symbolic_convert, "get_funcname", lambda file, line: looked_up.append(file) or name_of(file, line))

    def compile_and_run(offset: float) -> None:
        torch._dynamo.reset()
        out = torch.compile(lambda t: t.sin() + offset, backend="neuron")(torch.ones(3, device="neuron"))
        torch.testing.assert_close(out.cpu(), torch.ones(3).sin() + offset)

    compile_and_run(1.0)
    assert not looked_up
    torch._logging.set_logs(trace_call=True)
    try:
        compile_and_run(2.0)
    finally:
        torch._logging.set_logs()
    assert __file__ in looked_up


def _flex_attention_leaves():
    from torch.nn.attention.flex_attention import create_block_mask

    torch.manual_seed(0)
    inputs = [torch.randn(1, 2, 256, 16) for _ in range(3)]
    leaves = [t.to("neuron").requires_grad_() for t in inputs]
    return inputs, leaves, create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, 256, 256, device="neuron")


@pytest.mark.fixed_host_code
def test_flex_attention_compiles_for_neuron() -> None:
    """Issue 39, item 5: torchtitan's attention under `torch.compile(backend="neuron")` (the default "aten" host
    code), with a block mask built on the device: the CPU's causal attention, forward and backward (it was refused:
    "only supported on CUDA, CPU, HPU, or MPS")."""
    from torch.nn.attention.flex_attention import flex_attention

    inputs, leaves, mask = _flex_attention_leaves()
    out = torch.compile(flex_attention, backend="neuron", options={"host_code": "aten"})(*leaves, block_mask=mask)
    out.backward(torch.ones_like(out))
    reference = [t.clone().requires_grad_() for t in inputs]
    expected = torch.nn.functional.scaled_dot_product_attention(*reference, is_causal=True)
    expected.backward(torch.ones_like(expected))
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.detach().cpu(), expected.detach(), atol=1e-5, rtol=1e-5)
    for leaf, want in zip(leaves, reference, strict=True):
        torch.testing.assert_close(leaf.grad.cpu(), want.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.fixed_host_code
def test_flex_attention_training_with_the_inductor_host_code_is_refused_by_name() -> None:
    """With the "inductor" host code, a flex attention graph that needs gradients is Inductor's to lower, and
    Inductor's CPU lowering of it is inference-only: the compile fails naming that limit, never silently."""
    from torch.nn.attention.flex_attention import flex_attention

    _, leaves, mask = _flex_attention_leaves()
    compiled = torch.compile(flex_attention, backend="neuron", options={"host_code": "inductor"})
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as info:
        compiled(*leaves, block_mask=mask)
    error = _inner(info)
    assert isinstance(error, NeuronCompileError) and "only supports inference" in str(error)


def test_pattern_passes_try_only_patterns_whose_targets_the_graph_calls(monkeypatch) -> None:
    """Inductor's pattern passes walked each pattern's tree at every node of its first function, also when no node
    of the graph calls one of its functions (the attention patterns at every `view` of a graph with no `bmm`: 6 s of
    a 70B decode plan). With `_patches.pattern_matches_need_their_targets` a pass skips such a pattern without
    walking it, and judges again after a replacement: a pattern whose function an earlier replacement of the same
    pass put in the graph still matches. The pass matches the same nodes as Inductor's own."""
    from torch._inductor import pattern_matcher as pm

    from neuron_compile import _patches

    own = pm.PatternMatcherPass.apply  # Inductor's own, also after an earlier compile patched it
    monkeypatch.setattr(pm.PatternMatcherPass, "apply", getattr(own, "__wrapped__", own))
    aten = torch.ops.aten
    on_mm = pm.CallFunction(aten.view.default, pm.CallFunction(aten.mm.default, pm.Arg(), pm.Arg()), pm.Arg())
    on_bmm = pm.CallFunction(aten.view.default, pm.CallFunction(aten.bmm.default, pm.Arg(), pm.Arg()), pm.Arg())
    both = pm.MultiOutputPattern([on_mm, pm.CallFunction(aten.bmm.default, pm.Arg(), pm.Arg())])
    walked = []
    walk = pm.CallFunction._match
    monkeypatch.setattr(pm.CallFunction, "_match", lambda self, node, ctx: walked.append(self) or walk(self, node, ctx))

    def run(mm_to_bmm: bool) -> tuple[list, str]:
        """The three patterns (and, with `mm_to_bmm`, a first one that turns the view's mm into a bmm) as one pass
        over `view(mm(x, y))`: the patterns matched, in order, and the graph after."""
        graph = torch.fx.Graph()
        x, y = graph.placeholder("x"), graph.placeholder("y")
        view = graph.call_function(aten.view.default, (graph.call_function(aten.mm.default, (x, y)), [4]))
        graph.output(view)
        module = torch.fx.GraphModule(torch.nn.Module(), graph)
        matched = []

        def to_bmm(match: pm.Match, *args: object) -> None:
            matched.append("to_bmm")
            mm = view.args[0]
            view.replace_input_with(mm, graph.call_function(aten.bmm.default, mm.args))
            graph.erase_node(mm)

        patterns = pm.PatternMatcherPass()
        if mm_to_bmm:
            pm.register_graph_pattern(on_mm, pass_dict=patterns)(to_bmm)
        for name, pattern in (("on_mm", on_mm), ("on_bmm", on_bmm), ("both", both)):
            pm.register_graph_pattern(pattern, pass_dict=patterns)(
                lambda match, *args, name=name: matched.append(name))
        patterns.apply(module)
        assert module.graph._find_nodes_lookup_table.__class__ is torch.fx.graph._FindNodesLookupTable
        return matched, str(module.graph)

    before = run(False), run(True)
    assert before[0][0] == ["on_mm"] and before[1][0] == ["to_bmm", "on_bmm"]
    assert {id(pattern) for pattern in walked} > {id(on_mm), id(on_mm.args[0])}  # the bmm patterns were walked
    _patches.pattern_matches_need_their_targets()
    walked.clear()
    assert run(False) == before[0]
    assert {id(pattern) for pattern in walked} <= {id(on_mm), id(on_mm.args[0])}  # only the mm pattern's tree
    assert run(True) == before[1]  # on_bmm judged again after to_bmm put a bmm in the graph


def test_guard_cse_is_linear_and_writes_dynamos_guard_code(monkeypatch) -> None:
    """Dynamo's CSE pass over guard expressions unparsed every subtree on every level (quadratic in the depth: 3.7 s
    of a 35 s plan of a TP 32 Llama decode), and parsed each expression twice. The patched pass
    (`_patches.linear_guard_cse`) writes the same guard function, with unparsing linear in the expressions' size,
    each expression parsed once."""
    import ast

    from torch._dynamo import guards

    from neuron_compile import _patches

    _patches.linear_guard_cse()
    patched = guards.PyExprCSEPass
    original = patched.__mro__[1]
    assert getattr(patched, "_neuron", False) and not getattr(original, "_neuron", False)
    chain = "L['self']" + "".join(f"._modules['m{i}']" for i in range(60))
    parts = [f"{chain}._parameters['weight'].size()[0] == 8", f"{chain}._parameters['bias'].stride()[0] == 1",
             f"___check_obj_id({chain}, 7)", "L['x'].a.b == -0.0", "L['x'].a.b == 0.0", "len(L['y'].c.d) == 2"]
    parts.append(parts[0])  # an expression met twice: each replace rewrites a tree of its own

    def build(cls):
        monkeypatch.setattr(guards, "PyExprCSEPass", cls)
        visited = parsed = 0
        traverse, parse = ast._Unparser.traverse, ast.parse

        def counting(self, node):
            nonlocal visited
            visited += 1
            return traverse(self, node)

        def parsing(*args, **kwargs):
            nonlocal parsed
            parsed += 1
            return parse(*args, **kwargs)

        with monkeypatch.context() as m:
            m.setattr(ast._Unparser, "traverse", counting)
            m.setattr(ast, "parse", parsing)
            code = guards.build_guard_function(parts, "G")
        return code, visited, parsed

    (body, code), visited, parsed = build(patched)
    (expected_body, expected_code), expected_visited, expected_parsed = build(original)
    assert (body, code) == (expected_body, expected_code)
    assert "-0.0" in body and " == 0.0" in body  # equal values of different text are not merged
    size = sum(len(list(ast.walk(ast.parse(part)))) for part in parts)
    assert visited < 2 * size < expected_visited
    assert parsed == len(parts) < expected_parsed == 2 * len(parts)  # each expression parsed once, not twice



@torch.compiler.nested_compile_region
def _shifted(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) + 1


@pytest.mark.fixed_host_code  # regions go through AOTAutograd with the "aten" host code only
def test_a_region_aot_autograd_cannot_keep_compiles_inlined_with_a_warning(monkeypatch) -> None:
    """A region whose local graph cannot hold what it does, seen only while AOTAutograd traces it (here an operand's
    metadata change, made to be seen: Dynamo refuses the cases it knows), is compiled as the graph with its regions
    inlined before AOTAutograd, with a warning naming the switch; the results are the CPU's."""
    from torch._functorch._aot_autograd import functional_utils

    monkeypatch.setattr(functional_utils, "has_metadata_mutation", lambda *args, **kwargs: True)

    def twice(x: torch.Tensor) -> torch.Tensor:
        return _shifted(_shifted(x) * 2)

    x = torch.arange(-3.0, 3.0).reshape(2, 3)
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="regions inlined before AOTAutograd.*AOT_REGIONS=0"):
        out = torch.compile(twice, backend="neuron", options={"host_code": "aten"})(x.to("neuron"))
    torch.testing.assert_close(out.cpu(), twice(x))
