"""The two host codes of a compiled graph (`options={"host_code": ...}`): "aten" (default, the AOT graph runs its
ATen CPU kernels, no C++ compiler) and "inductor" (Inductor's C++ code). Both run the graph the Neuron passes
planned, so the simulated device time is the same, bitwise, and the results agree (to float rounding: Inductor
may reorder a reduction)."""

from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
from models import decoder
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_compile import metrics, passes
from neuron_compile.settings import CompileSettings
from neuron_device import services


def _step(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """One forward + backward; the logits."""
    logits = model(ids)
    logits.float().pow(2).mean().backward()
    return logits.detach().cpu()


@pytest.mark.slow  # Inductor's C++ compile of a decoder's forward and backward; it sets both host codes itself, so
@pytest.mark.compiler  # the compile-inductor session (not slow tests) would only repeat it
def test_simulated_time_and_results_are_the_same_in_both_host_codes(monkeypatch) -> None:
    """The same charges (name and seconds, bitwise) and results that agree. (Not the device-memory peak: the graph's
    outputs and saved activations are the host code's own buffers, which the allocator accounts as they are.)"""
    charges = []
    charge = services.charge
    monkeypatch.setattr(services, "charge", lambda index, seconds, name, *args, **kwargs: (
        charges.append((name, seconds)), charge(index, seconds, name, *args, **kwargs))[1])
    torch.manual_seed(0)
    eager = decoder("llama", layers=1).to("neuron")
    ids = torch.randint(0, 64, (2, 8), device="neuron")
    measured = {}
    for host_code in ("aten", "inductor"):
        model = copy.deepcopy(eager)
        compiled = torch.compile(model, backend="neuron", fullgraph=True, dynamic=False,
                                 options={"host_code": host_code})
        _step(compiled, ids)  # compiles
        model.zero_grad()
        charges.clear()
        logits = _step(compiled, ids)
        grads = [p.grad.cpu() for p in model.parameters()]
        measured[host_code] = list(charges), logits, grads
    (aten_charges, aten_logits, aten_grads), (inductor_charges, inductor_logits, inductor_grads) = measured.values()
    assert [name for name, _ in aten_charges] == ["neuron_compile::graph_forward", "neuron_compile::graph_backward"]
    assert aten_charges == inductor_charges  # the same kernel plans, charged the same way
    torch.testing.assert_close(aten_logits, inductor_logits, atol=1e-5, rtol=1e-5)
    for got, want in zip(aten_grads, inductor_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.fixed_host_code
def test_aten_host_code_runs_no_inductor_codegen(monkeypatch) -> None:
    from torch._inductor import compile_fx

    def refuse(*args, **kwargs):
        raise AssertionError("the 'aten' host code must not call Inductor's code generation")

    monkeypatch.setattr(compile_fx, "compile_fx_inner", refuse)
    x = torch.randn(4, 5, device="neuron", requires_grad=True)
    out = torch.compile(lambda t: (t.sin() * 2).sum(), backend="neuron", options={"host_code": "aten"})(x)
    out.backward()
    torch.testing.assert_close(x.grad.cpu(), 2 * x.detach().cpu().cos())


# Inductor's passes, lowering and code generators, which a warm "aten" compile does not run.
_INDUCTOR = ("torch._inductor.compile_fx", "torch._inductor.graph", "torch._inductor.lowering",
             "torch._inductor.pattern_matcher", "torch._inductor.codegen.cpp", "torch._inductor.codegen.triton",
             "torch._inductor.codegen.halide")

_FIRST_COMPILES = textwrap.dedent("""
    import json, sys, torch
    from neuron_compile import metrics
    x = torch.randn(4, 5, device="neuron", requires_grad=True)
    torch.compile(lambda t: (t.sin() * 2).sum(), backend="neuron")(x).backward()  # a training graph
    with torch.no_grad():
        torch.compile(lambda t: t.cos() + 1, backend="neuron")(x)  # an inference graph
    print(json.dumps({"hits": metrics.counters()["cache_hits"], "grad": x.grad.tolist(),
                      "imported": [m for m in sys.modules if m.startswith("torch._inductor")]}))
""")


@pytest.mark.fixed_host_code  # its processes run without NEURON_COMPILE_HOST_CODE
def test_a_warm_aten_compile_imports_no_inductor_passes_or_code_generation(tmp_path) -> None:
    """Issue 36: the first `torch.compile(backend="neuron")` of a process imported Inductor (`compile_fx`: its
    passes, lowering and code generators, ~2 s) before AOTAutograd looked at its cache. With a warm compile cache the
    "aten" host code is loaded from that cache and none of them runs: a second process, whose training and inference
    graphs both hit, imports none of them (a first one, which traces, runs Inductor's passes as before)."""
    env = {**os.environ, "TORCH_NEURONX_NEFF_CACHE_DIR": str(tmp_path / "cache"),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    env.pop("NEURON_COMPILE_HOST_CODE", None)
    results = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", _FIRST_COMPILES], env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    cold, warm = results
    assert (cold["hits"], warm["hits"]) == (0, 2)
    assert warm["grad"] == cold["grad"]
    assert sorted(set(_INDUCTOR) & set(warm["imported"])) == []


@pytest.mark.fixed_host_code
def test_aten_cache_hit_reuses_the_stored_kernel_plans(tmp_path, monkeypatch) -> None:
    """A hit of the compile cache on the "aten" host code traces again (the AOT graph is its host code) but takes
    the entry's kernel plans instead of planning again."""
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path))
    planned = []
    plan_kernels = passes.plan_kernels
    monkeypatch.setattr(passes, "plan_kernels", lambda gm, *args: planned.append(gm) or plan_kernels(gm, *args))
    x = torch.randn(16, device="neuron")
    results = []
    for _ in range(2):
        torch._dynamo.reset()
        torch.neuron.reset_dynamo_metrics()
        results.append(torch.compile(lambda t: (t * 7 - 2).exp(), backend="neuron",
                                     options={"host_code": "aten"})(x).cpu())
    assert metrics.counters()["cache_hits"] == 1
    assert len(planned) == 1
    torch.testing.assert_close(results[1], results[0], rtol=0, atol=0)


@pytest.mark.fixed_host_code  # sets and removes the variable itself
def test_host_code_option_and_environment_variable(monkeypatch) -> None:
    assert CompileSettings.resolve(options={"host_code": "inductor"}).host_code == "inductor"
    monkeypatch.setenv("NEURON_COMPILE_HOST_CODE", "inductor")
    assert CompileSettings.resolve().host_code == "inductor"
    assert CompileSettings.resolve(options={"host_code": "aten"}).host_code == "aten"
    monkeypatch.delenv("NEURON_COMPILE_HOST_CODE")
    assert CompileSettings.resolve().host_code == "aten"
    with pytest.raises(ValueError, match="host_code"):
        CompileSettings.resolve(options={"host_code": "c++"})
    assert (CompileSettings.resolve(options={"host_code": "aten"}).cache_fields()
            != CompileSettings.resolve(options={"host_code": "inductor"}).cache_fields())


def _nodes(gm: torch.fx.GraphModule) -> list[tuple]:
    """What a graph is made of, node by node: op, name, target, arguments (their nodes by name, their containers'
    types) and type."""
    def described(value):
        if isinstance(value, torch.fx.Node):
            return ("node", value.name)
        if isinstance(value, (tuple, list)):
            return (type(value).__name__, [described(item) for item in value])
        if isinstance(value, dict):
            return (type(value).__name__, {key: described(item) for key, item in value.items()})
        return (type(value).__name__, repr(value))

    return [(node.op, node.name, node.target, described(node.args), described(node.kwargs), node.type)
            for node in gm.graph.nodes]


def _stored_and_loaded(gm: torch.fx.GraphModule) -> tuple[str, torch.fx.GraphModule]:
    """An `AtenHostCode` of `gm` as AOTAutograd's cache stores and loads it: its form and the loaded graph."""
    from neuron_compile.output_code import AtenHostCode

    stored = copy.copy(AtenHostCode(gm, passes.KernelPlan([], 0), "inference"))
    stored.prepare_for_serialization()
    loaded = pickle.loads(pickle.dumps(stored))
    loaded.post_compile([], None, None)
    return stored._serialized_form, loaded._graph_module


def _graph_pickler_loaded(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    from torch.fx._graph_pickler import GraphPickler, Options

    from neuron_compile.output_code import _no_metadata

    loaded = GraphPickler.loads(GraphPickler.dumps(gm, Options(ops_filter=None, node_metadata_key_filter=_no_metadata)),
                                torch._subclasses.FakeTensorMode())
    loaded.recompile()
    return loaded


@pytest.mark.fixed_host_code
def test_a_stored_graph_loads_as_graph_pickler_loaded_it(monkeypatch) -> None:
    """The "aten" host code's graph is stored in a compact form (C pickle, operators by name) where it can be, not
    with `GraphPickler` (dill's pure-Python pickler, 20 times slower on an 80-layer graph): loaded, it is the graph
    `GraphPickler` gave back, node for node, with the same code. Over a decoder's forward and backward graphs, and
    one with every kind of argument it stores (dtypes, devices, layouts, memory formats, slices, nested lists,
    keyword arguments, `getitem`); a graph with a tensor among its arguments is written by `GraphPickler`."""
    from neuron_compile import output_code

    graphs = []
    init = output_code.AtenHostCode.__init__
    monkeypatch.setattr(output_code.AtenHostCode, "__init__",
                        lambda self, gm, *args, **kwargs: (graphs.append(gm), init(self, gm, *args, **kwargs))[1])
    model = torch.compile(decoder("llama", layers=2).to("neuron"), backend="neuron", fullgraph=True, dynamic=False,
                          options={"host_code": "aten"})
    _step(model, torch.randint(0, 64, (2, 8), device="neuron"))
    monkeypatch.setattr(output_code.AtenHostCode, "__init__", init)
    assert len(graphs) == 2, "a forward and a backward graph"

    def arguments(x: torch.Tensor) -> tuple:
        zeros = torch.ops.aten.new_zeros(x, [2, 3], dtype=torch.bfloat16, layout=torch.strided, device="cpu")
        first, second = torch.split(x, [1, 3])
        wide = x.reshape(1, 1, 4, 4).contiguous(memory_format=torch.channels_last)
        return zeros, first[:, 1::2] * 2.5, torch.stack([second, second.flip(0)]).sum([0, 1], keepdim=True), wide
    graphs.append(make_fx(arguments)(torch.randn(4, 4)))

    for gm in graphs:
        form, loaded = _stored_and_loaded(gm)
        expected = _graph_pickler_loaded(gm)
        assert form == "compact"
        assert _nodes(loaded) == _nodes(expected)
        assert loaded.code == expected.code

    with_tensor = make_fx(lambda x: x + 1)(torch.randn(3))
    node = next(node for node in with_tensor.graph.nodes if node.op == "call_function")
    node.args = (node.args[0], torch.ones(3))
    with_tensor.recompile()
    form, loaded = _stored_and_loaded(with_tensor)
    assert form == "graph-pickler"
    assert [described[:3] for described in _nodes(loaded)] == [described[:3] for described in _nodes(with_tensor)]


@pytest.mark.fixed_host_code
def test_adaptive_eager_runs_call_each_op_through_one_global(monkeypatch) -> None:
    """The aten host code of an adaptive eager run (`fuser.fuse`) calls each op's C function by one global name
    (views through `torch.as_strided`): no `torch.ops.aten.<op>.<overload>` chain or `OpOverload` frame per node."""
    from neuron_compile import fuser

    monkeypatch.setenv("NEURON_COMPILE_HOST_CODE", "aten")
    graph = torch.fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    product = graph.call_function(torch.ops.aten.mul.Tensor, (x, y))
    view = graph.call_function(torch.ops.aten.as_strided.default, (product, (2, 8), (8, 1), 0))
    graph.output((graph.call_function(torch.ops.aten.add.Scalar, (view, 1.5)),))
    module = torch.fx.GraphModule(torch.nn.Module(), graph)
    run = fuser.fuse(module, [torch.randn(16), torch.randn(16)])
    a, b = torch.randn(16), torch.randn(16)
    (got,) = run(a, b)
    assert torch.equal(got, (a * b).view(2, 8) + 1.5)
    assert "torch.ops" not in module.code and "torch.as_strided(" in module.code


@pytest.mark.fixed_host_code
@pytest.mark.parametrize("host_code", ["aten", "inductor"])
def test_adaptive_eager_views_of_a_permuted_result_skip_the_relayout_in_aten_code(monkeypatch, host_code) -> None:
    """A view of a queued result laid out in another order than its sizes' (a transposed input's product) reads it
    through a relayout clone in the run's graph (`services.FUSE_RELAYOUT`): Inductor's code needs it, the aten host
    code runs eager's kernels, whose result already has that layout, and drops the copy. Results stay bitwise
    the CPU's."""
    from neuron_compile import fuser
    from neuron_device.adaptive_eager import queue as adaptive_eager

    monkeypatch.setenv("NEURON_COMPILE_HOST_CODE", host_code)
    monkeypatch.setattr(adaptive_eager, "_runs", {})  # the run is fused afresh in each host code
    fused: list[torch.fx.GraphModule] = []
    fuse = fuser.fuse
    monkeypatch.setattr(fuser, "fuse", lambda module, inputs: (fused.append(module), fuse(module, inputs))[1])

    def chain(x: torch.Tensor) -> torch.Tensor:
        y = x.transpose(1, 2) * 2  # the transposed input's layout: strides (12, 1, 4)
        return y[:, 1:, ::2] + y[:, :3, 1::2].neg()

    x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0))
    device_x = x.to("neuron")
    previous = adaptive_eager.set_enabled(True)
    try:
        for _ in range(3):  # the second run is fused, the third calls the fused form
            got = chain(device_x).cpu()
            assert torch.equal(got, chain(x)) if host_code == "aten" else torch.allclose(got, chain(x))
    finally:
        adaptive_eager.set_enabled(previous)
    (module,) = fused
    relayouts = [node for node in module.graph.nodes if node.meta.get(services.FUSE_RELAYOUT)]
    permutes = [node for node in module.graph.nodes if node.target is torch.ops.aten.permute.default]
    if host_code == "aten":
        assert not relayouts and not permutes and "clone" not in module.code
    else:
        assert len(relayouts) == 2 and len(permutes) == 2
