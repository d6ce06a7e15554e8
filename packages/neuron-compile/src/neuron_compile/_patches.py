"""neuron-compile's patches of Dynamo and Inductor internals, in one place, each with its reason (as neuron-device
keeps its own in `neuron_device._patches`). They are applied when `neuron` registers with Dynamo
(`dynamo_device.register`) or Inductor (`inductor_device.register`) or, for the scoped ones, around one compile
(`compiler`).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.fx.graph import _FindNodesLookupTable

__all__ = ["aot_cache_key_without_inductor_backends", "async_collective_inputs_keep_requires_grad",
           "compile_time_of_every_frame", "dense_metadata_from_first_pass", "device_mesh_state_without_its_hash",
           "inductor_decompositions", "inductor_forward_results_charged",
           "lazy_trace_log_headers", "linear_guard_cse", "patch_current_backend", "patch_scheduler_host_check",
           "pattern_matches_need_their_targets", "register_stream_functions", "rng_states_saved_as_tensors",
           "source_clone_keeps_unchanged_sources", "warn_on_recompile_limit", "while_tracing_for"]

DEVICE = "neuron"


def patch_scheduler_host_check() -> None:
    """Inductor's scheduler asks `node.is_cpu()` to mean "scheduled as host C++ kernels" (it then skips GPU-only
    loop reindexing that the C++ backend cannot handle). `neuron` buffers are scheduled exactly so: say yes."""
    from torch._inductor.scheduler import BaseSchedulerNode

    def is_cpu(self: BaseSchedulerNode) -> bool:
        device = self.get_device()
        return device is not None and device.type in ("cpu", DEVICE)

    BaseSchedulerNode.is_cpu = is_cpu


def patch_current_backend() -> None:
    """Inductor's codegen asks `get_current_backend(device_type)` which kernel language a device's kernels are
    written in, and answers from a fixed list: every device that is not cpu, mps, xpu or tpu is "triton". `neuron`
    is scheduled by `CppScheduling` (C++ kernels), so codegen that branches on the answer (e.g. `index_expr`'s dtype
    propagation in `CSEProxy`) took the Triton branch for C++ code and failed (`torch.compile(create_block_mask)`
    on `neuron`: "assert index.dtype is not None" in `CppKernel.arange`). `neuron` answers "cpp"; the function is
    imported by name into the modules that call it, so each binding is replaced."""
    from torch._inductor import scheduler, utils
    from torch._inductor.codegen import common
    from torch._inductor.kernel import mm_common

    original = utils.get_current_backend
    if getattr(original, "_neuron", False):
        return

    def get_current_backend(device_type: str | None = None) -> str:
        if not device_type:
            from torch._inductor.virtualized import V

            device_type = V.graph.get_current_device_or_throw().type
        return "cpp" if device_type == DEVICE else original(device_type)

    get_current_backend._neuron = True  # type: ignore[attr-defined]
    for module in (utils, common, scheduler, mm_common):
        module.get_current_backend = get_current_backend


def register_stream_functions() -> None:
    """Dynamo traces `torch.cuda.current_stream()` / `torch.accelerator.current_stream()` as a stream of the graph
    (a handler of its own, by function identity). `torch.neuron.current_stream` (which diffusers and trl call as
    `<device module>.current_stream()`) gets the same handler; inlined instead, it graph-breaks in `torch.Stream`'s
    C constructor. And the frames of the stream functions themselves (neuron-device's routing of
    `torch.accelerator`'s, called when a compiled graph rebuilds the current stream) run as plain Python: tracing
    them as frames would graph-break there too."""
    from torch._dynamo import trace_rules
    from torch._dynamo.eval_frame import skip_code
    from torch._dynamo.variables.torch import TorchInGraphFunctionVariable

    handlers = TorchInGraphFunctionVariable._get_handlers()
    rules = trace_rules.get_torch_obj_rule_map()
    handlers.setdefault(torch.neuron.current_stream, handlers[torch.accelerator.current_stream])
    rules.setdefault(torch.neuron.current_stream, TorchInGraphFunctionVariable)
    for function in (torch.accelerator.current_stream, torch.neuron.current_stream):
        skip_code(function.__code__)


# neuron-device's eager machinery below the dispatcher: its Python kernels and what they call.
def lazy_trace_log_headers() -> None:
    """Dynamo writes, for every call it puts in a graph, the call's location into a debug log (the `trace_call`
    artifact, off unless `TORCH_LOGS` asks for it), and computes that location eagerly: its function name comes from
    tokenizing the whole source file (`funcname_cache`). Tracing transformers' Llama in `generate`, that is about
    0.1 s of CPU time per process (8 % of a warm compile cache's first `generate`, `benchmarks/compile.py`), spent
    on a log nobody reads. The location is a debug log's only: without the log on, it is given without the
    function name, which needs no tokenizing."""
    from torch._dynamo import symbolic_convert

    full_header = symbolic_convert.InstructionTranslatorBase.get_line_of_code_header
    logs = (symbolic_convert.trace_call_log, symbolic_convert.trace_source_log)

    def get_line_of_code_header(self: symbolic_convert.InstructionTranslatorBase, lineno: int | None = None) -> str:
        if any(log.isEnabledFor(logging.DEBUG) for log in logs):
            return full_header(self, lineno)
        depth = f" (inline depth: {self.inline_depth})" if self.inline_depth > 0 else ""
        return f"{self.f_code.co_filename}:{self.lineno if lineno is None else lineno} in {self.f_code.co_name}{depth}"

    symbolic_convert.InstructionTranslatorBase.get_line_of_code_header = get_line_of_code_header


class _ExpressionKeys:
    """Structural keys of AST nodes, each computed once from its children's keys (interned as ints, so a key hashes
    in constant time). Nodes are kept alive while keyed, so an id is never reused for another node."""

    def __init__(self) -> None:
        self.interned: dict[tuple, int] = {}
        self.seen: dict[int, tuple[Any, int]] = {}

    def __call__(self, node: Any) -> int:
        hit = self.seen.get(id(node))
        if hit is not None and hit[0] is node:
            return hit[1]
        if isinstance(node, ast.AST):
            shape: tuple = (type(node), *(self(getattr(node, field, None)) for field in node._fields))
        elif isinstance(node, list):
            shape = (list, *(self(item) for item in node))
        else:  # a constant's value, an attribute's or a keyword's name: by type and repr (so -0.0 is not 0.0)
            shape = (type(node), repr(node))
        key = self.interned.setdefault(shape, len(self.interned))
        self.seen[id(node)] = (node, key)
        return key


def linear_guard_cse() -> None:
    """Dynamo's common-subexpression pass over the Python guard expressions (`guards.PyExprCSEPass`, run when a
    frame's guards are built) keys each attribute, subscript and call by `ast.unparse` of its whole subtree, on every
    level of the tree: quadratic in an expression's depth (its own comment says so). A tensor-parallel model's guards
    are deep chains (`L['self']._modules['model']._modules['layers']._modules['15']...._local_tensor`), one set a
    layer: planning Llama-3.1-70B's TP 32 decode with 16 layers spent 3.7 s of its 35 s of CPU there. The same pass
    with each node keyed once from its children's keys is linear; the guard code it writes is unchanged (the
    emitted text is still `ast.unparse`'s, and two nodes share a key exactly when their trees are equal, which is
    when their unparsed texts are). Each expression is parsed and keyed once: `replace` rewrites the tree `count`
    parsed, whose keys it finds by identity (the 70B's 80-layer guards, mostly the DTensor weights' object-aliasing
    epilogue, spent 11 % of a warm plan's rank in this pass, half of it parsing and keying every expression again)."""
    from torch._dynamo import guards

    original = guards.PyExprCSEPass
    if getattr(original, "_neuron", False):
        return

    class LinearPyExprCSEPass(original):  # type: ignore[misc, valid-type]
        _neuron = True

        class Replacer(ast.NodeTransformer):
            def __init__(self, config: Any, gen_name: Callable[[], str], keys: _ExpressionKeys) -> None:
                super().__init__()
                self._config = config
                self._gen_name = gen_name
                self._keys = keys
                self.preface: list[str] = []

            def visit(self, node: ast.AST) -> Any:  # the original's, keyed by `_keys` instead of `ast.unparse`
                if isinstance(node, original.ALLOWED_NODE_TYPES):
                    key = self._keys(node)
                    if self._config.expr_count[key] > original.USE_THRESHOLD:
                        if key not in self._config.expr_to_name:
                            node_ = super().visit(node)
                            var_name = self._gen_name()
                            self.preface.append(f"{var_name} = {guards._ast_unparse(node_)}")
                            self._config.expr_to_name[key] = var_name
                        else:
                            var_name = self._config.expr_to_name[key]
                        return ast.Name(var_name, ast.Load())
                return super().visit(node)

        def __init__(self) -> None:
            super().__init__()
            self._keys = _ExpressionKeys()
            self._parsed: dict[str, list[ast.AST]] = {}

        def count(self, exprs: list[str]) -> None:
            counts, keys, allowed = self._config.expr_count, self._keys, original.ALLOWED_NODE_TYPES
            for expr in exprs:
                tree = ast.parse(expr)
                self._parsed.setdefault(expr, []).append(tree)
                for node in ast.walk(tree):
                    if isinstance(node, allowed):
                        counts[keys(node)] += 1

        def replace(self, expr: str) -> tuple[list[str], str]:
            # the tree `count` parsed and keyed, used once (the replacer rewrites it): its nodes' keys are known
            trees = self._parsed.get(expr)
            tree = trees.pop() if trees else ast.parse(expr)
            replacer = self.Replacer(self._config, self._new_var, self._keys)
            new_node = replacer.visit(tree)
            return replacer.preface, guards._ast_unparse(new_node)

    guards.PyExprCSEPass = LinearPyExprCSEPass


def _required_targets(pattern: Any) -> tuple[frozenset, ...]:
    """The call_function targets a match of `pattern` needs in the graph: one set per node of the pattern that
    calls a function (any one of the set's targets will do: a pattern's function may be several overloads). Only
    what every match needs: the arguments of a `CallFunction` and the outputs of a `MultiOutputPattern`, never what
    a pattern of lists or of variable arguments may match with no node."""
    from torch._inductor import pattern_matcher as pm

    required: list[frozenset] = []
    pending = [pattern]
    while pending:
        expr = pending.pop()
        if isinstance(expr, pm.MultiOutputPattern):
            pending.extend(output for output in expr.outputs if output is not None)
        elif isinstance(expr, pm._TargetExpr) and expr.op == "call_function":
            required.append(frozenset(expr.fns_set))
            if type(expr) is pm.CallFunction:
                pending.extend(arg for arg in expr.flat_args_kwargs[0] if isinstance(arg, pm.PatternExpr))
    return tuple(required)


def pattern_matches_need_their_targets() -> None:
    """Inductor's pattern passes (`PatternMatcherPass.apply`, the joint-graph passes our "aten" host code runs on
    each AOT graph as `compile_fx` does) try, at every node of a pattern's first function, each pattern registered
    for it, and a pattern is matched down its tree before it fails. The attention patterns (`fuse_attention`, 50
    or so, each a chain `view(bmm(view(expand(...))))`) are tried at every `view` of the graph: planning
    Llama-3.1-70B's TP 32 decode (80 layers, about 2,300 views), 6 s of the rank's CPU went to attention patterns
    that cannot match, the graph holding no `bmm` at all. A match needs, for each function of its pattern, a node
    of the graph calling it (FX keeps a table of the graph's nodes by target), so a pass tries at a node only the
    patterns whose functions all have a node. Checked again at each pattern and node, that check still took 9 % of
    a 16-layer 70B decode plan's rank (SIGPROF samples); the verdicts are now kept for each function's patterns
    until the graph gains or loses a node (`_PresentPatterns`). Matches and replacements are
    unchanged: a pattern is skipped only when the graph as it is then, after earlier replacements, lacks one of its
    functions."""
    from torch._inductor import pattern_matcher as pm

    if getattr(pm.PatternMatcherPass.apply, "_neuron", False):
        return
    apply = pm.PatternMatcherPass.apply

    @functools.wraps(apply)
    def applying_present_patterns(self: Any, gm: Any) -> int:
        graph = gm.graph if isinstance(gm, torch.fx.GraphModule) else gm
        table = getattr(graph, "_find_nodes_lookup_table", None)
        if not isinstance(graph, torch.fx.Graph) or type(table) is not _FindNodesLookupTable:
            return apply(self, gm)
        versioned = _VersionedLookupTable.of(table)
        patterns = self.patterns
        graph._find_nodes_lookup_table, self.patterns = versioned, _PresentPatterns(patterns, versioned)
        try:
            return apply(self, gm)
        finally:
            graph._find_nodes_lookup_table, self.patterns = table, patterns

    applying_present_patterns._neuron = True  # type: ignore[attr-defined]
    pm.PatternMatcherPass.apply = applying_present_patterns


class _VersionedLookupTable(_FindNodesLookupTable):
    """FX's table of a graph's nodes by target (the same dict), counting the nodes inserted and removed: a pattern
    pass's view of it while it runs (`pattern_matches_need_their_targets`)."""

    version = 0

    @classmethod
    def of(cls, table: _FindNodesLookupTable) -> _VersionedLookupTable:
        versioned = cls.__new__(cls)
        versioned.table = table.table
        return versioned

    def insert(self, node: torch.fx.Node) -> None:
        self.version += 1
        super().insert(node)

    def remove(self, node: torch.fx.Node) -> None:
        self.version += 1
        super().remove(node)


class _PresentPatterns:
    """A pattern pass's `patterns` (node op and target -> its pattern entries) while it runs on one graph, each
    entry listed only when every function its pattern calls has a node in the graph (`_required_targets`). The
    verdicts are kept for each key until the graph's lookup table changes, and an entry reached after a change is
    judged on the graph as it is then, as `PatternMatcherPass.apply` would match it."""

    def __init__(self, patterns: Any, table: Any) -> None:
        self._patterns = patterns
        self._table = table
        self._kept: dict[Any, tuple[int, list]] = {}

    def __bool__(self) -> bool:
        return bool(self._patterns)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._patterns)

    def __contains__(self, key: Any) -> bool:
        return key in self._patterns

    def __getitem__(self, key: Any) -> Iterator[Any]:
        return self._present(key)

    def _present(self, key: Any) -> Iterator[Any]:
        start = 0
        while True:
            version = self._table.version
            for index, entry in self._kept_at(key, version):
                if index < start:
                    continue
                yield entry
                start = index + 1
                if self._table.version != version:
                    break
            else:
                return

    def _kept_at(self, key: Any, version: int) -> list:
        kept = self._kept.get(key)
        if kept is None or kept[0] != version:
            present = self._table.table
            kept = self._kept[key] = (version, [
                (index, entry) for index, entry in enumerate(self._patterns[key])
                if all(any(present.get(("call_function", target)) for target in targets)
                       for targets in _pattern_targets(entry.pattern))])
        return kept[1]


def _pattern_targets(pattern: Any) -> tuple[frozenset, ...]:
    """`_required_targets(pattern)`, computed once for each pattern."""
    required = pattern.__dict__.get("_neuron_required_targets")
    if required is None:
        required = pattern._neuron_required_targets = _required_targets(pattern)
    return required


@contextlib.contextmanager
def inductor_decompositions(select_decomp_table: Callable[[], dict]) -> Iterator[None]:
    """Inductor takes our decomposition table as the function `select_decomp_table` of `compile_fx` while one graph
    compiles: passed as a dict (`decompositions=`), it would be wrapped in an object Inductor's FX-graph cache cannot
    key, and every graph would bypass that cache."""
    from unittest import mock

    from torch._inductor import compile_fx as compile_fx_module

    with mock.patch.object(compile_fx_module, "select_decomp_table", select_decomp_table):
        yield


def inductor_forward_results_charged() -> None:
    """The "inductor" host code of a training forward on plain tensors (`CompiledFxGraph`) returns, after the
    caller's outputs, the activations AOTAutograd saves for the backward: host buffers the device allocator never
    saw, which the "aten" host code charges as it returns them (`AtenHostCode`). Inductor's host code is its
    `CompiledFxGraph`, stored and loaded by Inductor's caches with no object of ours around it, so its call is where
    they are charged (`host_runtime.charge_results`): only for a forward a compiled `neuron` graph runs
    (`services.host_code_device()` set), never a backward, an inference graph or another backend's graph."""
    from torch._inductor.output_code import CompiledFxGraph

    from neuron_device import services

    from . import host_runtime

    original = CompiledFxGraph.__call__
    if getattr(original, "_neuron", False):
        return

    def __call__(self: CompiledFxGraph, inputs: Sequence[Any]) -> Any:
        if (services.host_code_device() is None or self.fx_kwargs.get("is_backward")
                or self.fx_kwargs.get("is_inference")):
            return original(self, inputs)
        hosts = list(inputs)  # the boxed call empties `inputs`
        outputs = original(self, inputs)
        host_runtime.charge_results(outputs, hosts)
        return outputs

    __call__._neuron = True
    CompiledFxGraph.__call__ = __call__


@contextlib.contextmanager
def aot_cache_key_without_inductor_backends() -> Iterator[None]:
    """AOTAutograd's cache key includes Inductor's FX-graph hash details, whose constructor first registers every
    Inductor backend (`init_backend_registration`: the C++, Triton, Halide, MPS... code generators, about 2 s of
    imports) to hash the custom passes and configs of the registered devices. The "aten" host code is no Inductor
    backend's code: neither the registry nor those passes change what it runs, and our compile-cache key, in the
    key's tag, covers what does. While an "aten" graph compiles, the key is made without registering the backends
    and with an empty registry (so it does not depend on whether this process used Inductor before)."""
    from unittest import mock

    from torch._inductor import codecache

    with (mock.patch.object(codecache, "init_backend_registration", lambda: None),
          mock.patch.object(codecache, "custom_backend_passes", {}),
          mock.patch.object(codecache, "custom_backend_codegen_configs", {})):
        yield


@contextlib.contextmanager
def device_mesh_state_without_its_hash() -> Iterator[None]:
    """A tensor-parallel graph takes its `DeviceMesh` as an opaque input, which AOTAutograd's cache key pickles whole
    (`FxGraphCachePickler._reduce_fake_script_object`), and `DeviceMesh.__getstate__` keeps `_hash`, the mesh's
    Python hash cached at its first use. That hash differs between processes (it hashes `None`s, whose hash is their
    address before Python 3.12, and strings, salted per process unless PYTHONHASHSEED is set) and is absent until
    the mesh is first hashed, so the key of a DTensor graph never matched another process's: every process, every
    planned rank and every plan of a script traced and compiled its graphs again (an 80-layer decode: about 40 % of
    a rank's plan). A record's unpickled mesh carried the other process's hash too, unequal to the hash of an equal
    mesh here. While a graph compiles (its key made, its record stored or loaded), a mesh is pickled without it;
    `__hash__` computes it again when asked. The rest of the state stays in the key (`_rank` among it: a rank's
    record is its own)."""
    from unittest import mock

    from torch.distributed.device_mesh import DeviceMesh

    original = DeviceMesh.__getstate__

    def __getstate__(self: DeviceMesh) -> dict:
        state = original(self)
        state.pop("_hash", None)
        return state

    with mock.patch.object(DeviceMesh, "__getstate__", __getstate__):
        yield


@contextlib.contextmanager
def rng_states_saved_as_tensors() -> Iterator[None]:
    """AOTAutograd's forward graph returns what it saves for the backward in a fixed order: tensors (those version
    counter-checked, then the others), opaque objects (a DTensor's `DeviceMesh`), symbolic ints; the runtime slices
    them by their counts from the end. With activation checkpointing inside a compiled graph, the partitioner's
    `functionalize_rng_ops` saves each recomputed random op's generator state (attention is one:
    `run_and_save_rng_state`) just before the symbolic ints, after the opaque objects, and takes it in the backward
    just before the gradients, after them. A block with both, a checkpointed tensor-parallel attention block as
    torchtitan compiles it, failed its first forward in `save_from_forward` ("expected all
    tensors_saved_with_vc_check to be Tensors, got types: [..., DeviceMesh]"; torch 2.13, with `aot_eager` too):
    the mesh was counted among the tensors and the state among the opaque objects. The states are tensors: they
    go after the checked tensors, in both graphs, while one graph compiles."""
    from unittest import mock

    from torch._functorch import partitioners

    original = partitioners.functionalize_rng_ops

    def after_checked_tensors(node: torch.fx.Node) -> bool:
        return partitioners.is_opaque_node(node) or node.meta.get("saved_tensor_with_no_vc_check", False)

    def functionalize_rng_ops(joint_module: torch.fx.GraphModule, fw_module: torch.fx.GraphModule,
                              bw_module: torch.fx.GraphModule, num_sym_nodes: int) -> tuple[Any, Any]:
        outputs = next(iter(fw_module.graph.find_nodes(op="output"))).args[0]
        saved = outputs[:len(outputs) - num_sym_nodes]
        trailing = 0
        while trailing < len(saved) and after_checked_tensors(saved[-1 - trailing]):
            trailing += 1
        before = {node.name for node in bw_module.graph.find_nodes(op="placeholder")}
        fw_module, bw_module = original(joint_module, fw_module, bw_module, num_sym_nodes + trailing)
        placeholders = list(bw_module.graph.find_nodes(op="placeholder"))
        first = next((node for node in placeholders if node.name in before and after_checked_tensors(node)), None)
        if first is not None:
            for node in placeholders:
                if node.name not in before:  # a generator state the original added before the gradients
                    first.prepend(node)
            bw_module.recompile()
        return fw_module, bw_module

    with mock.patch.object(partitioners, "functionalize_rng_ops", functionalize_rng_ops):
        yield


@contextlib.contextmanager
def async_collective_inputs_keep_requires_grad() -> Iterator[None]:
    """AOTAutograd's `process_inputs` replaces a graph input that is an `AsyncCollectiveTensor` by its waited inner
    tensor before making it fake (`trigger_wait()`, torch 2.13, so the ACT type stays out of the tangents' metadata).
    The ACT's autograd history is on the wrapper only: `DTensor.to_local()` of an async redistribute (the output of
    tensor parallelism's `RowwiseParallel` embedding, the input of torchtitan's first compiled block) is an ACT
    whose `_ToTorchTensor` node is the wrapper's while its inner tensor requires no gradient. The input was traced
    as not requiring one: the compiled graph returned no gradient for it, which the autograd engine made zeros, a
    plain tensor given to DTensor's `Redistribute.backward` ("'Tensor' object has no attribute '_local_tensor'";
    with `aot_eager` too, on 2 ranks; one rank has no collective). While a graph compiles, such an
    input's fake requires a gradient as the ACT did (upstream: pytorch/pytorch#191113). At run time AOTAutograd
    unwraps the ACT inside its autograd function, so the gradient reaches the wrapper's node."""
    from unittest import mock

    from torch._functorch import aot_autograd

    try:
        from torch.distributed._functional_collectives import AsyncCollectiveTensor
    except ImportError:  # a torch built without distributed: no such input (AOTAutograd's own guard)
        yield
        return
    original = aot_autograd.process_inputs

    def process_inputs(flat_args: list[Any], *args: Any, **kwargs: Any) -> Any:
        needing_grad = [index for index, arg in enumerate(flat_args)
                        if isinstance(arg, AsyncCollectiveTensor) and arg.requires_grad]
        fakes, act_input_indices = original(flat_args, *args, **kwargs)
        for index in needing_grad:
            if not fakes[index].requires_grad:  # the waited inner tensor: a leaf without autograd history
                fakes[index].requires_grad_(True)
        return fakes, act_input_indices

    with mock.patch.object(aot_autograd, "process_inputs", process_inputs):
        yield


def _innermost(backend: Any) -> Any:
    """The function behind a Dynamo backend: through Dynamo's wrappers (`_torchdynamo_orig_backend`), the
    `torch.compile` wrapper of a string backend (`compiler_fn`) and `functools.wraps` wrappers (`__wrapped__`)."""
    while True:
        inner = (getattr(backend, "_torchdynamo_orig_backend", None) or getattr(backend, "compiler_fn", None)
                 or getattr(backend, "__wrapped__", None))
        if inner is None or inner is backend:
            return backend
        backend = inner


def warn_on_recompile_limit(is_ours: Callable[[Any], bool]) -> None:
    """When Dynamo's recompile limit (`torch._dynamo.config.recompile_limit`, 8 per code object, or the accumulated
    limit) is hit, Dynamo runs the frame and every later variant of it eagerly, uncompiled, and says so only in a
    log record (one line that a logging setup can hide, among others). For frames compiled with a backend for which
    `is_ours` holds, that fallback also raises a `RuntimeWarning` naming the limit and how to raise it (as the
    backend's own fallbacks do). Nothing changes when the limit makes Dynamo raise instead
    (`fail_on_recompile_limit_hit`, `fullgraph=True`)."""
    from torch._dynamo import config, convert_frame

    def around(bound: dict[str, Any], compile_frame: Callable[[], Any]) -> Any:
        if (not config.fail_on_recompile_limit_hit and not bound.get("one_graph")
                and is_ours(_innermost(bound.get("compiler_fn")))):
            exceeded, limit = convert_frame.exceeds_recompile_limit(bound["cache_size"], bound["compile_id"])
            if exceeded:
                code = bound["code"]
                warnings.warn(
                    f"torch._dynamo hit config.{limit} ({getattr(config, limit)}) for '{code.co_name}' "
                    f"({code.co_filename}:{code.co_firstlineno}), compiled with backend 'neuron': this call and every "
                    "later new variant of it (input shapes, dtypes, other guards) run eagerly, not compiled. Raise "
                    f"torch._dynamo.config.{limit}, make the inputs take fewer shapes (pad or bucket them; "
                    'TORCH_LOGS="recompiles" lists why each recompile happened), or set '
                    "torch._dynamo.config.fail_on_recompile_limit_hit = True to make this an error.",
                    RuntimeWarning,
                    stacklevel=3,
                )
        return compile_frame()

    _around_dynamo_compile("_neuron_warns_on_recompile_limit", around)


def _around_dynamo_compile(marker: str, around: Callable[[dict[str, Any], Callable[[], Any]], Any]) -> None:
    """Dynamo's `convert_frame._compile` (the trace of one frame, then its backend's compile) wrapped once (`marker`)
    by `around(its bound arguments, the call of the original)`."""
    from torch._dynamo import convert_frame

    original = convert_frame._compile
    if getattr(original, marker, False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def _compile(*args: Any, **kwargs: Any) -> Any:
        return around(signature.bind_partial(*args, **kwargs).arguments, lambda: original(*args, **kwargs))

    setattr(_compile, marker, True)
    convert_frame._compile = _compile


def while_tracing_for(is_ours: Callable[[Any], bool], ours: Callable[[], Any], others: Callable[[], Any]) -> None:
    """Dynamo's trace of a frame (`convert_frame._compile`: the trace, then the backend's compile) runs inside the
    context manager `ours()` when `is_ours` holds for its backend, else inside `others()`: what traced code should do
    only for this backend (`layer_regions`) knows which backend it is traced for, and a frame compiled for another
    backend inside ours (or ours inside another's) says so again. `_compile` is the one place that has the frame's
    backend before its trace; the Python functions Dynamo traces do not."""

    def around(bound: dict[str, Any], compile_frame: Callable[[], Any]) -> Any:
        with (ours if is_ours(_innermost(bound.get("compiler_fn"))) else others)():
            return compile_frame()

    _around_dynamo_compile("_neuron_while_tracing_for", around)


def compile_time_of_every_frame(compiling: Callable[[], Any]) -> None:
    """Dynamo's compile of a frame, for any backend, and AOTAutograd's compile of a backward at its first call
    (`_AutogradBackwardCompiler.get_or_compile`, after the frame's compile ended) run inside `compiling()`: what a
    compiler runs on `neuron` (Inductor's pattern examples, its constant folding) is compile time, not the program's.
    Our backend marks its own compile so (`backend._compile_static`); Inductor's own `torch.compile` of `neuron`
    tensors charged it, its first call's device time about 4.7 times a later call's."""

    def around(bound: dict[str, Any], compile_frame: Callable[[], Any]) -> Any:
        _lazy_backward_compile_within(compiling)
        with compiling():
            return compile_frame()

    _around_dynamo_compile("_neuron_compile_time", around)


def _lazy_backward_compile_within(compiling: Callable[[], Any]) -> None:
    from torch._functorch._aot_autograd.runtime_wrappers import _AutogradBackwardCompiler

    original = _AutogradBackwardCompiler.get_or_compile
    if getattr(original, "_neuron_compile_time", False):
        return

    @functools.wraps(original)
    def get_or_compile(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.compiled_bw is not None:  # compiled already: every later backward, which pays no block's entry
            return original(self, *args, **kwargs)
        with compiling():
            return original(self, *args, **kwargs)

    get_or_compile._neuron_compile_time = True  # type: ignore[attr-defined]
    _AutogradBackwardCompiler.get_or_compile = get_or_compile


def source_clone_keeps_unchanged_sources() -> None:
    """A nested compile region's later call is checked by moving each source its first trace read (a weight's
    `L['self'].layers[0].mlp.up_proj.weight`, its DTensor mesh, ...) to the new call's arguments: `Source.clone`
    with a replacement function (`invoke_subgraph.is_reusable`). `ChainedSource.clone` rebuilt every link of every
    chain (`dataclasses.replace`), so each rebuilt link hashed its chain again for the replacement's lookup: at a
    70B decoder layer's 250 guards and 240 traced sources, half a second of CPU a stamped layer, more than what the
    reuse saved. A link whose base and other sources come back unchanged is now returned as it is (a frozen
    dataclass: the same value `replace` would build), its cached hash kept; the replacement function still sees
    every link. The sources of one check share most of their links (the mesh behind every weight), so a link's
    clone under one replacement function is computed once (sources are immutable, the function a fixed mapping)."""
    import dataclasses

    from torch._guards import ChainedSource, Source

    if getattr(ChainedSource.clone, "_neuron_keeps_unchanged", False):
        return
    source_fields: dict[type, tuple[str, ...]] = {}
    memo: dict[str, Any] = {"fn": None, "clones": {}}

    def clone(self: ChainedSource, transform_fn: Callable[[Source], Source] | None = None) -> Source:
        if transform_fn is not None:
            if memo["fn"] is not transform_fn:
                memo["fn"], memo["clones"] = transform_fn, {}
            known = memo["clones"].get(id(self))
            if known is not None and known[0] is self:
                return known[1]
        cls = type(self)
        names = source_fields.get(cls)
        if names is None:
            names = source_fields[cls] = tuple(field.name for field in dataclasses.fields(self)
                                               if field.name != "base")
        changed = {}
        base = self.base.clone(transform_fn)
        if base is not self.base:
            changed["base"] = base
        for name in names:
            value = getattr(self, name)
            if isinstance(value, Source):
                cloned = value.clone(transform_fn)
                if cloned is not value:
                    changed[name] = cloned
        result = dataclasses.replace(self, **changed) if changed else self
        if transform_fn is None:
            return result
        result = transform_fn(result)
        memo["clones"][id(self)] = (self, result)
        return result

    clone._neuron_keeps_unchanged = True
    ChainedSource.clone = clone


@contextlib.contextmanager
def dense_metadata_from_first_pass() -> Iterator[None]:
    """AOTAutograd analyses a graph with tensor subclasses twice: its metadata pass runs the graph on functional
    views of the inputs (`create_aot_state`), and `aot_dispatch_subclass` runs it all again, through DTensor, on the
    inputs unwrapped to their inner tensors, only to collect the same analysis for the dense -> dense function
    (`meta_updated`, which the compiled graph's input and output counts are read from). For an 80-layer
    tensor-parallel decode graph that second run is 6 % of a cold 70B plan: every op's sharding propagation again.
    The first pass already ran that dense function: a DTensor's ops run on its inner `_local_tensor`, a functional
    tensor of the first pass, which records the inner mutations and aliases the second run would record. So while a
    graph compiles, the first pass's functional inputs and outputs are kept, and the second analysis runs torch's own
    code over their inner tensors instead of running the graph again (its `to_fun` handing back the first pass's
    functional inner tensors, its function returning the first pass's inner outputs): the same code on the same
    functional state. It does so only where the two runs are the same function of the same tensors: every subclass
    among the inputs and outputs a DTensor (its inner tensor `_local_tensor`, its mesh an opaque input), the second
    run's inputs exactly the first run's inner tensors (so no symbolic sizes appended), output sizes static, no
    output requiring a gradient and, with grad mode on, no input requiring one (autograd would record the run), no
    effect tokens, no intermediate bases, no grad-mode change; otherwise the second run happens as in torch."""
    from unittest import mock

    from torch._functorch import aot_autograd
    from torch._functorch._aot_autograd import collect_metadata_analysis, graph_capture_wrappers

    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch built without distributed: no DTensor graph
        yield
        return
    original = collect_metadata_analysis.run_functionalized_fw_and_collect_metadata
    first: dict[str, Any] = {}

    def first_pass(f: Callable[..., Any], **kwargs: Any) -> Callable[..., Any]:
        seen: dict[str, Any] = {}

        @functools.wraps(f)
        def recorded(*functional_args: Any) -> Any:
            outputs = f(*functional_args)
            seen["functional_args"], seen["outputs"] = functional_args, outputs
            return outputs

        collect = original(recorded, **kwargs)

        def run(*flat_args: Any) -> Any:
            first.clear()
            meta = collect(*flat_args)
            if "outputs" in seen:
                first.update(seen, args=flat_args, meta=meta)
            return meta

        return run

    def dense_pass(f: Callable[..., Any], **kwargs: Any) -> Callable[..., Any]:
        collect = original(f, **kwargs)

        def run(*dense_args: Any) -> Any:
            replay = _first_pass_inner(first, dense_args, kwargs["keep_input_mutations"], DTensor)
            first.clear()
            if replay is None:
                return collect(*dense_args)
            functional, dense_outputs = replay

            def inner_outputs(*functional_args: Any) -> list[Any]:
                assert all(a is functional[id(d)] for a, d in zip(functional_args, dense_args, strict=True)
                           if isinstance(d, torch.Tensor)), "the dense analysis got other functional inputs"
                return dense_outputs()

            with mock.patch.object(collect_metadata_analysis, "to_fun", lambda t: functional[id(t)]):
                return original(inner_outputs, **kwargs)(*dense_args)

        return run

    with (mock.patch.object(aot_autograd, "run_functionalized_fw_and_collect_metadata", first_pass),
          mock.patch.object(graph_capture_wrappers, "run_functionalized_fw_and_collect_metadata", dense_pass)):
        yield


def _first_pass_inner(first: dict[str, Any], dense_args: Sequence[Any], keep_input_mutations: bool,
                      dtensor: type) -> tuple[dict[int, torch.Tensor], Callable[[], list[Any]]] | None:
    """For `dense_metadata_from_first_pass`: the first metadata pass's functional inner tensors by the id of the
    dense input they wrap, and a function unwrapping its outputs as the dense function does; None where the dense
    pass would not be the same run."""
    from torch._functorch._aot_autograd.descriptors import PlainAOTInput, PlainAOTOutput
    from torch._functorch._aot_autograd.subclass_utils import unwrap_tensor_subclasses
    from torch._subclasses.functional_tensor import FunctionalTensor
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if not first:
        return None
    meta, outputs = first["meta"], first["outputs"]
    if (meta.tokens or meta.num_intermediate_bases or meta.grad_enabled_mutation is not None
            or meta.keep_input_mutations != keep_input_mutations):
        return None
    values = [*first["args"], *first["functional_args"], *outputs]
    if any(is_traceable_wrapper_subclass(v) and type(v) is not dtensor for v in values):
        return None
    if torch.is_grad_enabled() and any(isinstance(v, torch.Tensor) and v.requires_grad for v in dense_args):
        return None  # autograd records the run: its graph (and the outputs' grad_fn) is not replayed
    if any(isinstance(v, torch.SymInt) for v in dense_args) or not all(
            isinstance(o, torch.Tensor) and not o.requires_grad
            and all(isinstance(s, int) for s in (*o.shape, *o.stride())) for o in outputs):
        return None

    def inner(wrapped: Sequence[Any]) -> list[Any]:
        return unwrap_tensor_subclasses(list(wrapped), [PlainAOTInput(i) for i in range(len(wrapped))],
                                        append_symints=True)[0]

    args, functional_args = inner(first["args"]), inner(first["functional_args"])
    if not len(args) == len(functional_args) == len(dense_args):
        return None
    functional = {}
    for arg, functional_arg, dense in zip(args, functional_args, dense_args, strict=True):
        if isinstance(arg, torch.Tensor) or isinstance(dense, torch.Tensor):
            if arg is not dense or not isinstance(functional_arg, FunctionalTensor):
                return None
            functional[id(dense)] = functional_arg

    def dense_outputs() -> list[Any]:  # the dense function's step 3 (`aot_dispatch_subclass.inner_fn`)
        return unwrap_tensor_subclasses(list(outputs), [PlainAOTOutput(i) for i in range(len(outputs))],
                                        append_symints=True)[0]

    return functional, dense_outputs
