"""The compile pipeline of one graph: AOTAutograd (forward and backward) with the Neuron decomposition table, the
Neuron FX passes on each AOT graph, then the graph's host code, one of two (`CompileSettings.host_code`):

* "aten" (default): the AOT graph after the passes is the host code: its Python calls each node's ATen CPU kernel
  on host tensors. No code generation and no C++ compiler, so a compile costs Dynamo + AOTAutograd + our passes
  (seconds); each node pays one dispatcher call at run time.
* "inductor": Inductor's C++ code generation and compiler for the same graph (tens of seconds per graph, cached):
  fused loops, faster host code for long runs.

Both run the graph the passes planned, so the kernel plan (simulated device time) is the same for both.

The graph is compiled as a *host* graph: device memory is host memory, so a `neuron` graph is lowered exactly as
the same graph on CPU tensors, and run on zero-copy host aliases of its `neuron` arguments (`boundary`). This takes
Inductor's CPU path as it is tested upstream; registering `neuron` as an Inductor device of its own
(`inductor_device`, used by plain `torch.compile`) meets CPU-only heuristics keyed on `device.type == "cpu"` across
Inductor (loop reindexing, indirect-indexing asserts) that fail for another device name.

A graph that meets tensor subclasses (DTensor parameters or activations of tensor parallelism, a `DeviceMesh`)
crosses at the AOT graphs instead: AOTAutograd traces it on its `neuron` inputs as they are, desugaring each subclass
into its inner tensors (as `aot_eager` does), and each AOT graph, on plain tensors, is the host graph, called with
host aliases of its `neuron` arguments (`host_runtime`). A host alias of a DTensor as a whole would lose the subclass
(its local shard and mesh), and a host DTensor would not do either: DTensor moves host tensors to its mesh's device.

Inputs on the CPU are copied to `neuron` at run time: TorchNeuron's auto-copy (see `runtime`).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from . import _patches, aot_regions, boundary, envvars, metrics, nki_substitution, passes, rms_norm, rng
from .artifacts import ArtifactWriter
from .decompositions import neuron_decompositions
from .host_runtime import OutputSource, output_sources
from .output_code import AtenHostCode, collecting

__all__ = ["HostGraph", "compile_graph", "has_cpu_tensor_inputs", "to_neuron"]

_DEVICE = "neuron"


def has_cpu_tensor_inputs(inputs: Sequence[Any]) -> bool:
    """Whether any argument is a CPU tensor (which auto-copy moves to `neuron`)."""
    return any(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in inputs)


def to_neuron(inputs: Sequence[Any]) -> list[Any]:
    """CPU tensors copied to the current `neuron` device (differentiably); everything else unchanged."""
    return [v.to(_DEVICE) if isinstance(v, torch.Tensor) and v.device.type == "cpu" else v for v in inputs]


def _retarget_devices_to_host(gm: torch.fx.GraphModule) -> None:
    """Tensors the graph creates on `neuron` (or moves there) are host tensors of the host graph."""
    changed = False
    for node in gm.graph.nodes:
        for key, value in list(node.kwargs.items()):
            if isinstance(value, (torch.device, str)) and key == "device" and torch.device(value).type == _DEVICE:
                node.update_kwarg(key, torch.device("cpu"))
                changed = True
        if node.op == "call_method" and node.target == "to":
            args = [torch.device("cpu") if isinstance(a, (torch.device, str)) and str(a).startswith(_DEVICE) else a
                    for a in node.args]
            if args != list(node.args):
                node.args = tuple(args)
                changed = True
    if changed:
        gm.recompile()


_HISTC = (torch.histc, torch.ops.aten.histc.default, torch.ops.aten.histc)


def _integer_histc_in_float(gm: torch.fx.GraphModule) -> None:
    """`histc` of an integer tensor (CUDA and eager `neuron` take it; transformers' MoE load-balancing loss counts
    expert ids so on accelerators) is refused by the CPU `histc` of a host graph, already while AOTAutograd traces
    it: count in float32 and return the input dtype, as eager `neuron` does."""
    changed = False
    for node in list(gm.graph.nodes):
        is_histc = (node.op == "call_function" and node.target in _HISTC) or (
            node.op == "call_method" and node.target == "histc")
        source = node.args[0] if is_histc and node.args else None
        value = source.meta.get("example_value") if isinstance(source, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor) or value.is_floating_point():
            continue
        with gm.graph.inserting_before(node):
            as_float = gm.graph.call_method("float", (source,))
        with gm.graph.inserting_after(node):
            counts = gm.graph.call_method("to", (node, value.dtype))
        node.replace_all_uses_with(counts, delete_user_cb=lambda user, counts=counts: user is not counts)
        node.replace_input_with(source, as_float)
        changed = True
    if changed:
        gm.recompile()


def _with_device_autocast(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> torch.fx.GraphModule | None:
    """The graph with `torch.autocast("neuron")`'s casts written in (`_to_copy` nodes), or None when autocast for
    `neuron` is off.

    Why: the graph is traced as a host graph on CPU tensors, where `neuron`'s autocast (AutocastPrivateUse1) never
    fires, so a model compiled under `torch.autocast("neuron")` computed in fp32 where eager computes in bf16. Mirroring
    the state onto CPU autocast would not do: CPU autocast's op lists differ (softmax, layer_norm, exp, sum stay
    bf16 there, and go to fp32 on `neuron` as on CUDA). Retracing the Dynamo graph on `neuron` fake tensors under the
    caller's autocast state applies `neuron`'s own policy, as eager does."""
    if not torch.is_autocast_enabled(_DEVICE):
        return None
    from torch.fx.experimental.proxy_tensor import make_fx

    retraced = make_fx(gm, tracing_mode="fake")(*example_inputs)
    _keep_dynamo_inputs(gm, retraced)
    return retraced


def _keep_dynamo_inputs(dynamo: torch.fx.GraphModule, retraced: torch.fx.GraphModule) -> None:
    """Give a retrace of a Dynamo graph the Dynamo metadata of its inputs (the graph's compile id, its parameters'
    sources, each placeholder's source and static-input mark), which AOTAutograd reads to tell parameters and
    buffers from other inputs (`static_input_indices`): without it, an autocast graph's weights would be inputs like
    any other, and an inference graph would not fold them (`passes.frozen_inputs`). The retrace has the same
    placeholders in the same order."""
    if "dynamo_compile_id" not in dynamo.meta or not hasattr(dynamo, "_param_name_to_source"):
        return
    old, new = (list(g.graph.find_nodes(op="placeholder")) for g in (dynamo, retraced))
    for before, after in zip(old, new, strict=True):
        after._dynamo_source = before._dynamo_source  # Dynamo gives every placeholder one (AOTAutograd asserts it)
        if "tensor_dict" in before.meta:
            after.meta["tensor_dict"] = before.meta["tensor_dict"]
    retraced.meta["dynamo_compile_id"] = dynamo.meta["dynamo_compile_id"]
    retraced._param_name_to_source = dynamo._param_name_to_source


def _host_example(value: Any, traced: Any) -> Any:
    """The host counterpart of an example input. Under Dynamo, `traced` is the fake tensor Dynamo traced the input
    as: its CPU counterpart is made in the same fake mode, so AOTAutograd sees no new (sourceless) symbols, with the
    same strides as the host alias the graph runs on (a copy would make an expanded input contiguous, and the
    compiled graph would then refuse the real one). Outside Dynamo, a real `neuron` input is aliased to the host.
    An input with autograd history gets some here too, as Dynamo's fake tensors do: AOTAutograd applies the graph's
    mutation of a leaf input hidden from autograd, so a leaf example would drop the gradient of what the graph wrote
    into a non-leaf input (Longformer's `attn_output[mask] = ...`)."""
    if not isinstance(value, torch.Tensor) or value.device.type != _DEVICE:
        return value
    if isinstance(traced, torch._subclasses.FakeTensor):
        with traced.fake_mode:
            host = torch.empty_strided(traced.shape, traced.stride(), dtype=traced.dtype, device="cpu")
    else:
        host = boundary.enter([value.detach()])[0]
    host.requires_grad_(value.requires_grad)
    if value.requires_grad and not value.is_leaf:
        with torch.enable_grad():  # an identity with a grad_fn, as Dynamo's fakes get (`MetaConverter`)
            host = torch._C._functions.DelayedError("backward through a compile-time example input", 1)(host)
    return host


def _meets_tensor_subclasses(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Whether the graph takes or makes a tensor subclass (DTensor): it then crosses to the host at its AOT graphs."""
    values = [*example_inputs, *(node.meta.get("example_value") for node in gm.graph.nodes)]
    return any(is_traceable_wrapper_subclass(v) for v in values if isinstance(v, torch.Tensor))


class HostGraph:
    """A graph compiled for the host, called with `neuron` arguments; `sources`: its outputs' nodes in the Dynamo
    graph (`host_runtime.output_sources`)."""

    __slots__ = ("fn", "sources")

    def __init__(self, fn: Callable, sources: list[OutputSource] | None = None) -> None:
        self.fn = fn
        self.sources = sources

    def __call__(self, *args: Any) -> Any:
        hosts = boundary.enter(args)
        return boundary.leave(self.fn(*hosts), args, hosts, self.sources)


def _inner_compile(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *args: Any,
    artifacts: ArtifactWriter,
    plans: dict[str, passes.KernelPlan],
    host_code: str,
    on_device: bool,
    **kwargs: Any,
) -> Any:
    """Neuron FX passes on one AOT graph and its kernel plan (into `plans`), then its host code (see the module
    doc). `on_device`: the AOT graph was traced on `neuron` tensors (a graph with tensor subclasses), so it is made
    a host graph here, called with `neuron` arguments."""
    stage = "backward" if kwargs.get("is_backward") else ("inference" if kwargs.get("is_inference") else "forward")
    with metrics.phase("fx_passes"):
        if torch.ops.aten._fused_rms_norm.default in nki_substitution.substitutable_ops():
            rms_norm.fuse_rms_norm(gm)
        nki_substitution.substitute(gm)
        rng.seed_from_device(gm)
        # an inference graph's parameters and buffers are constants of the compiled graph (`passes.frozen_inputs`)
        frozen = passes.frozen_inputs(gm, kwargs.get("static_input_idxs", ())) if stage == "inference" else set()
        plans[stage] = passes.plan_kernels(gm, frozen)
    artifacts.write_graph(stage, gm)
    with metrics.phase("lower"):
        if host_code == "aten":
            rng.seeded_host_random(gm)
            if on_device:
                _retarget_devices_to_host(gm)
            gm.recompile()
            artifacts.write_code(stage, gm.code)
            return AtenHostCode(gm, plans[stage], stage, device_arguments=on_device)
        from torch._inductor.compile_fx import compile_fx_inner

        compiled = compile_fx_inner(gm, example_inputs, *args, **kwargs)
    artifacts.write_code(stage, getattr(compiled, "source_code", None))
    return compiled


def compile_graph(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    artifacts: ArtifactWriter,
    plans: dict[str, passes.KernelPlan],
    traced: bool = True,
    cache_key: str = "",
    host_code: str = "aten",
    regioned: torch.fx.GraphModule | None = None,
) -> Callable:
    """Compile a Dynamo graph of `neuron` tensors with static shapes to a callable taking the same arguments;
    `plans` receives the kernel plan of each AOT graph compiled ("forward", "backward" or "inference"; on an
    AOTAutograd cache hit, the "aten" host code's stored plans, and none for Inductor's). `traced=False` compiles from the concrete `example_inputs` alone (a graph Dynamo traced
    with symbolic shapes, specialised outside Dynamo). `cache_key`: the compile cache's key of this graph ("" when
    the cache is disabled), which Inductor's own caches are keyed on too. `host_code`: "aten" or "inductor" (see
    the module doc). `regioned`: `gm` with its nested compile regions kept (`aot_regions.prepared`), which
    AOTAutograd traces in its place (the "aten" host code; not a graph retraced under autocast)."""
    artifacts.write_graph("dynamo", gm)
    autocast = _with_device_autocast(gm, example_inputs)
    if autocast is not None:  # a retraced graph: its placeholders carry no Dynamo fake tensors
        gm, traced = autocast, False
    on_device = _meets_tensor_subclasses(gm, example_inputs)
    if on_device:  # AOTAutograd traces the `neuron` inputs as they are; the host crossing is at its graphs
        inputs = list(example_inputs)
    else:
        _retarget_devices_to_host(gm)
        fakes = [node.meta.get("example_value") for node in gm.graph.find_nodes(op="placeholder")]
        if not traced or len(fakes) != len(example_inputs):
            fakes = [None] * len(example_inputs)
        inputs = [_host_example(v, t) for v, t in zip(example_inputs, fakes)]
    _integer_histc_in_float(gm)
    traced_gm = gm
    if regioned is not None and autocast is None and host_code == "aten":
        traced_gm = regioned  # `gm`'s rewrites above, on it and its regions
        for module in regioned.modules():
            if isinstance(module, torch.fx.GraphModule):
                if not on_device:
                    _retarget_devices_to_host(module)
                _integer_histc_in_float(module)
        artifacts.write_graph("dynamo_regions", regioned)
    inner = functools.partial(_inner_compile, artifacts=artifacts, plans=plans, host_code=host_code,
                              on_device=on_device)
    nki_substitution.define_replacements()  # code loaded from Inductor's caches calls them by name
    rng.define_device_ops()
    # The backward graph is compiled now, not at the first backward: failures surface at compile time, and the
    # compile cache and the debug artifacts see both graphs.
    with (torch._functorch.config.patch(force_non_lazy_backward_lowering=True),
          _patches.rng_states_saved_as_tensors(),
          _patches.async_collective_inputs_keep_requires_grad(),
          _patches.device_mesh_state_without_its_hash(),
          _patches.dense_metadata_from_first_pass(),
          _inductor_caches(cache_key, host_code),
          collecting(plans)):
        if host_code != "aten":
            compiled = _inductor(gm, inputs, inner)
        elif traced_gm is gm:
            compiled = _aot_autograd(gm, inputs, inner)
        else:
            try:
                compiled = _aot_autograd(traced_gm, inputs, inner)
            except aot_regions.RegionNotSupported as error:  # found while tracing: nothing was compiled yet
                warnings.warn(f"{error}: graph compiled with its regions inlined before AOTAutograd (as "
                              f"{envvars.AOT_REGIONS.name}=0 does for every graph)", RuntimeWarning, stacklevel=2)
                compiled = _aot_autograd(gm, inputs, inner)
    return compiled if on_device else HostGraph(compiled, output_sources(gm))


def _inductor(gm: torch.fx.GraphModule, inputs: Sequence[Any], inner: Callable) -> Callable:
    """Inductor's `compile_fx` (its passes before and on the joint graph, AOTAutograd, the partitioner) with our
    `inner` compile, which hands the planned graphs to Inductor's code generation. Our decomposition table reaches
    Inductor as the function `neuron_decompositions` in place of its `select_decomp_table`: passed as a dict
    (`decompositions=`), it would be wrapped in an object Inductor's FX-graph cache cannot key, and every graph would
    bypass that cache."""
    from torch._inductor import compile_fx as compile_fx_module

    from . import inductor_device

    inductor_device.register()  # an AOT graph traced on `neuron` (tensor subclasses) is lowered for `neuron`
    _patches.pattern_matches_need_their_targets()
    _patches.inductor_forward_results_charged()
    with _patches.inductor_decompositions(neuron_decompositions):
        return compile_fx_module.compile_fx(gm, inputs, inner_compile=inner)


def _aot_autograd(gm: torch.fx.GraphModule, inputs: Sequence[Any], inner: Callable) -> Callable:
    """The "aten" host code's AOTAutograd, called directly (as `aot_eager` does) with the graph going through
    Inductor's passes exactly as `compile_fx` runs them: its pre-grad passes, its joint-graph passes and partitioner
    for a training graph, its joint-graph passes for an inference graph, our decompositions; each AOT graph is given
    to `inner` with the keyword arguments it reads of Inductor's (`is_inference`, `is_backward`,
    `static_input_idxs`). The difference is when Inductor's modules load: its passes (and, through its pattern
    matcher, its lowering and code generators, about 2 s) are imported only when AOTAutograd's cache misses; on a hit
    (a warm compile cache) nothing is traced and nothing of them is imported. `compile_fx` imported them, and its
    backend registration, before looking at the cache. The compilers are `SerializableAOTDispatchCompiler`s, so
    AOTAutograd's cache stores and loads the `AtenHostCode` they return."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.utils import get_inputs_devices
    from torch._functorch.aot_autograd import SerializableAOTDispatchCompiler
    from torch._guards import TracingContext, detect_fake_mode, tracing
    from torch._inductor.output_code import OutputCode
    from torch._inductor.utils import num_fw_fixed_arguments
    from torch._inductor.virtualized import V
    from torch.fx._lazy_graph_module import _use_lazy_graph_module

    def pre_grad_passes(graph: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> torch.fx.GraphModule:
        from torch._inductor.compile_fx import run_pre_grad_passes

        return run_pre_grad_passes(graph, example_inputs)

    def partition(joint: torch.fx.GraphModule, joint_inputs: Sequence[Any], **kwargs: Any) -> Any:
        from torch._inductor.compile_fx import partition_fn

        _patches.pattern_matches_need_their_targets()
        return partition_fn(joint, joint_inputs, **kwargs)

    def forward(graph: torch.fx.GraphModule, example_inputs: Sequence[Any], *, is_inference: bool) -> Any:
        graph = aot_regions.inlined_after_aot(graph)
        if is_inference:  # a training graph's joint-graph passes ran in `partition`
            from torch._inductor.compile_fx import _recursive_joint_graph_passes

            _patches.pattern_matches_need_their_targets()
            graph = _recursive_joint_graph_passes(graph,
                                                  input_device=next(iter(get_inputs_devices(example_inputs, graph))))
        context = TracingContext.try_get()
        if context is not None and context.fw_metadata:  # Dynamo's parameters and buffers
            static = context.fw_metadata.static_input_indices
        else:
            static = list(range(num_fw_fixed_arguments(len(inputs), len(example_inputs))))
        return inner(graph, example_inputs, static_input_idxs=static, is_inference=is_inference)

    def backward(graph: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        return inner(graph, example_inputs, is_backward=True)

    fake_mode = detect_fake_mode(inputs) or torch._subclasses.FakeTensorMode(allow_non_fake_inputs=True)
    with (_use_lazy_graph_module(torch._dynamo.config.use_lazy_graph_module),  # the context `compile_fx` sets
          enable_python_dispatcher(),
          torch.fx.traceback.preserve_node_meta(torch._inductor.config.trace.provenance_tracking_level == 1),
          V.set_fake_mode(fake_mode),
          tracing(TracingContext.try_get() or TracingContext(fake_mode)),
          _patches.aot_cache_key_without_inductor_backends(),
          torch._functorch.config.patch(unlift_effect_tokens=True,
                                        selective_decompose=torch._inductor.config.selective_decompose)):
        return aot_autograd(
            fw_compiler=SerializableAOTDispatchCompiler(OutputCode, functools.partial(forward, is_inference=False)),
            bw_compiler=SerializableAOTDispatchCompiler(OutputCode, backward),
            inference_compiler=SerializableAOTDispatchCompiler(OutputCode, functools.partial(forward,
                                                                                              is_inference=True)),
            decompositions=neuron_decompositions(),
            partition_fn=partition,
            keep_inference_input_mutations=True,
            pre_grad_passes=pre_grad_passes,
        )(gm, inputs)


@contextlib.contextmanager
def _inductor_caches(cache_key: str, host_code: str) -> Iterator[None]:
    """Key AOTAutograd's cache (and Inductor's FX-graph cache) on our compile-cache key as well.

    Both host codes are stored by AOTAutograd's cache: Inductor's as its FX-graph cache records, the "aten" host code
    bundled into the AOTAutograd entry (`output_code.AtenHostCode`). A process starts with an empty private cache
    directory (`cache.private_inductor_dir`), into which only verified entries of our cache are copied; so on a hit
    of our cache, AOTAutograd hits the entry's records and nothing is traced, planned or lowered again, and on a miss
    it traces. Our key covers every setting that changes the graph or its plan (AOTAutograd's does not, e.g. the
    model name or the Neuron passes' code), so tagging AOTAutograd's key with it makes its hits ours. Without our
    cache (disabled), neither cache is used: keyed without us, they could serve code compiled by another version of
    neuron-compile."""
    if not cache_key:
        with (torch._functorch.config.patch(enable_autograd_cache=False),
              torch._inductor.config.patch(fx_graph_cache=False)):
            yield
        return
    tag = torch.compiler.config.cache_key_tag
    with (torch.compiler.config.patch(cache_key_tag=f"{tag}+neuron-compile:{cache_key}" if tag else cache_key),
          torch._functorch.config.patch(bundled_autograd_cache=host_code == "aten")):
        yield
