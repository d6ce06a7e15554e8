"""The "aten" host code as an Inductor `OutputCode`, so that AOTAutograd's cache stores it and a warm process loads
it instead of compiling.

torch's AOTAutograd cache saves a graph only for a compiler that returns an `OutputCode` it can serialise; with
`torch._functorch.config.bundled_autograd_cache` the `OutputCode` itself is pickled into the AOTAutograd entry
(`BundledAOTAutogradResult`), next to the runtime wrappers and the view/mutation metadata AOTAutograd needs to call
it. A hit then skips AOTAutograd's tracing and partitioning, the Neuron passes and the planning: what is left is
Dynamo, the key and the load. (Inductor's own host code hits the same way, through its `CompiledFxGraph`.)

`AtenHostCode` holds the AOT graph as the Neuron passes left it (the graph the host runs node by node on ATen CPU
kernels) and the kernel plan made from it (simulated time and workspace). The graph is stored without node metadata
(the fake tensors of the trace are not needed to run it), in a compact form of its nodes where it can be, else with
torch's `GraphPickler` (`_stored_graph`), and rebuilt on load with `recompile`. The plan is pickled with it, and a
load hands it to the compile that loaded it (`collecting`), so the simulated figures always belong to the code that
runs, whichever cache entry it came from.
"""

from __future__ import annotations

import contextlib
import contextvars
import pickle
from collections.abc import Iterator, MutableMapping, Sequence
from typing import Any

import torch
from torch._inductor.output_code import OutputCode
from torch._subclasses import FakeTensorMode
from torch.fx.immutable_collections import immutable_dict, immutable_list

from neuron_device import services

from . import host_runtime
from .passes import KernelPlan

__all__ = ["AtenHostCode", "collecting"]

_loaded_plans: contextvars.ContextVar[MutableMapping[str, KernelPlan] | None] = contextvars.ContextVar(
    "neuron_compile_loaded_plans", default=None)


@contextlib.contextmanager
def collecting(plans: MutableMapping[str, KernelPlan]) -> Iterator[None]:
    """While a graph compiles, `AtenHostCode` loaded from a cache puts its plan into `plans` under its stage."""
    token = _loaded_plans.set(plans)
    try:
        yield
    finally:
        _loaded_plans.reset(token)


def _no_metadata(key: str) -> bool:
    return False


class AtenHostCode(OutputCode):
    """A planned AOT graph run as host code (boxed: called with the list of its inputs), with its plan and its stage
    ("forward", "backward" or "inference"). `device_arguments`: it is called with `neuron` tensors (an AOT graph
    traced on the device, see `compiler`), which cross to the host and back here."""

    def __init__(self, gm: torch.fx.GraphModule, plan: KernelPlan, stage: str, *,
                 device_arguments: bool = False) -> None:
        super().__init__()
        self._boxed_call = True
        self.plan = plan
        self.stage = stage
        self.device_arguments = device_arguments
        self._graph_module: torch.fx.GraphModule | None = gm
        self._serialized: bytes | None = None
        self._serialized_form = ""  # how `_serialized` is written: "compact" or "graph-pickler"
        # kept apart from the graph, whose node metadata is not stored: what a plan's out-of-memory names
        self.output_sources = host_runtime.output_sources(gm) if device_arguments else None

    def __call__(self, inputs: Sequence[Any]) -> Any:
        assert self._graph_module is not None, "AtenHostCode called before post_compile"
        if not self.device_arguments:
            outputs = self.run_graph(inputs)
            if self.stage == "forward":  # the activations saved for the backward are among them (`host_runtime`)
                host_runtime.charge_results(outputs, inputs)
            return outputs
        hosts = host_runtime.to_host(inputs)
        with services.running_host_code(host_runtime.device_index(inputs)):  # e.g. a backward's collectives
            outputs = self.run_graph(hosts)
        return type(outputs)(host_runtime.to_device(outputs, inputs, hosts, self.output_sources))

    def run_graph(self, args: Sequence[Any]) -> Any:
        """The graph run node by node on `args` (host tensors, or the inputs themselves): the one place its ops run,
        which plan mode replaces for a call that repeats an earlier one (neuron-distributed's `plan_replay`)."""
        return self._graph_module.forward(*args)

    def prepare_for_serialization(self) -> None:
        """Called on a shallow copy about to be pickled: keep the graph in its stored form only."""
        if self._graph_module is None:
            return
        self._serialized_form, self._serialized = _stored_graph(self._graph_module)
        self._graph_module = None

    def post_compile(self, example_inputs: Sequence[Any], constants: Any, graph_kwargs: Any) -> None:
        """On a cache hit: rebuild the graph module (a failure here makes AOTAutograd compile the graph afresh) and
        hand the plan to the compile that loaded it."""
        if self._graph_module is None:
            self._graph_module = self._load(example_inputs)
        plans = _loaded_plans.get()
        if plans is not None:
            plans[self.stage] = self.plan

    def _load(self, example_inputs: Sequence[Any]) -> torch.fx.GraphModule:
        if self._serialized is None:
            raise RuntimeError("AtenHostCode has neither a graph module nor its serialised form")
        if self._serialized_form == "compact":
            gm = _graph_from_compact(self._serialized)
        else:
            from torch._guards import detect_fake_mode
            from torch.fx._graph_pickler import GraphPickler

            gm = GraphPickler.loads(self._serialized, detect_fake_mode(example_inputs) or FakeTensorMode())
        if not isinstance(gm, torch.fx.GraphModule):
            raise RuntimeError(f"a stored AtenHostCode holds a {type(gm).__name__}, not a GraphModule")
        gm.recompile()
        return gm

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        """No Triton kernels in host code."""


class _NotCompact(Exception):
    """A graph holds something the compact form does not store (it is written with `GraphPickler` then)."""


class _NodeRef:
    """A node among a stored node's arguments: its position in the graph."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


_LEAF_TYPES = frozenset({int, float, bool, complex, str, bytes, type(None), type(...), torch.dtype, torch.device,
                         torch.layout, torch.memory_format})


def _encoded(value: Any, index_of: dict[torch.fx.Node, int]) -> Any:
    """A node's argument with its nodes as `_NodeRef`s and FX's immutable containers as plain ones (`create_node`
    makes them immutable again); raises `_NotCompact` for any other kind of value (tensors, symbolic sizes, ...)."""
    kind = type(value)
    if kind in _LEAF_TYPES:
        return value
    if kind is torch.fx.Node:
        return _NodeRef(index_of[value])
    if kind is tuple:
        return tuple(_encoded(item, index_of) for item in value)
    if kind is immutable_list or kind is list:
        return [_encoded(item, index_of) for item in value]
    if kind is immutable_dict or kind is dict:
        if not all(type(key) is str for key in value):
            raise _NotCompact("a dict with keys other than strings")
        return {key: _encoded(item, index_of) for key, item in value.items()}
    if kind is slice:
        return slice(*(_encoded(item, index_of) for item in (value.start, value.stop, value.step)))
    raise _NotCompact(kind.__name__)


def _decoded(value: Any, nodes: list[torch.fx.Node]) -> Any:
    kind = type(value)
    if kind is _NodeRef:
        return nodes[value.index]
    if kind is tuple:
        return tuple(_decoded(item, nodes) for item in value)
    if kind is list:
        return [_decoded(item, nodes) for item in value]
    if kind is dict:
        return {key: _decoded(item, nodes) for key, item in value.items()}
    if kind is slice:
        return slice(*(_decoded(item, nodes) for item in (value.start, value.stop, value.step)))
    return value


def _stored_graph(gm: torch.fx.GraphModule) -> tuple[str, bytes]:
    """The graph module without node metadata, as bytes, and their form. Compact where it can be: each node's op,
    name, target (an operator by its name, any other target by reference), arguments and type, written with
    Python's C pickler. `GraphPickler` writes the same nodes through dill's pure-Python pickler and a callback per
    object, 1.3 s of CPU for an 80-layer decode graph (9,600 nodes), where this takes a tenth of it; its loads
    were as slow. A graph holding anything else (a tensor or a symbolic size among the arguments, a target or
    module state the C pickler cannot name) is written by `GraphPickler`, as before."""
    from torch.fx._graph_pickler import GraphPickler, Options

    try:
        return "compact", _compact(gm)
    except _NotCompact:
        return "graph-pickler", GraphPickler.dumps(gm, Options(ops_filter=None, node_metadata_key_filter=_no_metadata))


_REMADE_ON_LOAD = frozenset({"_graph", "_code", "_lineno_map", "_prologue_start"})


def _compact(gm: torch.fx.GraphModule) -> bytes:
    # the module's state without its graph and the code made from it, which a load makes again (`recompile`)
    state = {key: value for key, value in vars(gm).items() if key not in _REMADE_ON_LOAD}
    graph = gm.graph
    index_of: dict[torch.fx.Node, int] = {}
    targets: dict[Any, int] = {}
    nodes = []
    for index, node in enumerate(graph.nodes):
        index_of[node] = index
        target = node.target
        key = ("op", torch.fx.Node._pretty_print_target(target)) if isinstance(target, torch._ops.OpOverload) else (
            "object", target)
        if key[0] == "object" and not (isinstance(target, str) or callable(target)):
            raise _NotCompact(type(target).__name__)
        number = targets.setdefault(key, len(targets))
        nodes.append((node.op, node.name, number, _encoded(node.args, index_of), _encoded(node.kwargs, index_of),
                      node.type))
    try:  # what the C pickler cannot name (a local function as a target, unpicklable module state)
        return pickle.dumps((state, graph._tracer_cls, graph._tracer_extras, graph._codegen, list(targets), nodes),
                            protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        raise _NotCompact(f"{type(error).__name__}: {error}") from error


def _operator(name: str) -> torch._ops.OpOverload:
    """An operator by the name `Node._pretty_print_target` gives it ("torch.ops.aten.view.default")."""
    found: Any = torch
    for part in name.split(".")[1:]:
        found = getattr(found, part)
    if not isinstance(found, torch._ops.OpOverload):
        raise RuntimeError(f"a stored graph's operator {name} is a {type(found).__name__}")
    return found


def _graph_from_compact(data: bytes) -> torch.fx.GraphModule:
    state, tracer_cls, tracer_extras, codegen, keys, stored = pickle.loads(data)
    targets = [_operator(value) if kind == "op" else value for kind, value in keys]
    gm = torch.fx.GraphModule.__new__(torch.fx.GraphModule)
    gm.__dict__ = state
    graph = torch.fx.Graph(gm, tracer_cls, tracer_extras)
    nodes: list[torch.fx.Node] = []
    for op, name, target, args, kwargs, kind in stored:
        nodes.append(graph.create_node(op, targets[target], _decoded(args, nodes), _decoded(kwargs, nodes), name,
                                       kind))
    graph._codegen = codegen
    gm._graph = graph
    return gm
