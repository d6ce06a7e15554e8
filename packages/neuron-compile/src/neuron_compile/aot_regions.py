"""Nested compile regions kept through AOTAutograd, inlined after it (`NEURON_COMPILE_AOT_REGIONS`, on by default).

Dynamo traces each repeated decoder layer once (`layer_regions`: an `invoke_subgraph` stamped out per layer), but
AOTAutograd cannot run an `invoke_subgraph` on DTensor operands (no HOP rule for DTensor), and a region writing its
inputs (the KV cache) would be auto-functionalized, which changes the graph; inlined before AOTAutograd, each of its
three passes (metadata, metadata of the subclass-unwrapped graph, the trace) runs every op of every layer through
DTensor, functionalization, proxy and fake modes. Here each `invoke_subgraph` node of a Dynamo graph whose regions
all qualify (`prepared`: tensor operands, plain or DTensor over a plain local, sharing no storage and needing no
gradient; others are inlined first, as before) becomes a call of `region`, which AOTAutograd runs as any function.
It unwraps DTensor operands to their local tensors and looks up a FUNCTIONAL graph of them (`_local_graph`, traced
once per region, operand layouts and specs, and decomposition table: the locals wrapped back into DTensors with
their specs, the region run under functionalization as AOTAutograd runs a graph, its outputs unwrapped, then the
new values of the operands it wrote). The graph's results are new tensors, so tensors of their layouts stand for
them; the trace records the `invoke_subgraph` node of the local graph as torch's rules for it would (`_record`).
DTensor outputs are rewrapped, an output that is an operand (`cumulative_length.to(device)`) is that operand, and
each written operand takes its new value as functionalization gives an in-place op's (`replace`, `commit_update`,
`sync`: no copy in the graph). The compiler inlines the nodes after AOTAutograd (`inlined_after_aot`), before any pass sees
the graph, which is then the graph of the regions inlined before it, node for node.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from . import __version__

__all__ = ["RegionNotSupported", "inlined", "inlined_after_aot", "prepared", "region"]

_HOP = torch.ops.higher_order.invoke_subgraph


class RegionNotSupported(RuntimeError):
    """A region AOTAutograd met does what its local graph cannot express (seen only while tracing it); the
    compiler then compiles the graph with its regions inlined before AOTAutograd, warning."""

_identifiers = itertools.count()
# per Dynamo subgraph: (operand metadata, decomposition table) -> (local graph, identifier, output specs, written)
_graphs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a build without distributed
        return None
    return DTensor


def _storage(value: torch.Tensor) -> Any:
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(value.untyped_storage())


def _leaves(value: torch.Tensor, dtensor: type | None) -> list[torch.Tensor] | None:
    """`value`'s tensors under at most one DTensor wrapper, or None if it is another subclass or nests one."""
    if dtensor is not None and type(value) is dtensor:
        local = value._local_tensor
        return None if is_traceable_wrapper_subclass(local) else [local]
    return None if is_traceable_wrapper_subclass(value) else [value]


def _qualifies(gm: torch.fx.GraphModule, node: torch.fx.Node, dtensor: type | None) -> bool:
    """Whether `node`'s region can go through AOTAutograd as a `region` call: a subgraph without regions of its own,
    tensor operands (plain or DTensor over a plain local) that share no storage and need no gradient, tensor outputs
    that alias no operand."""
    if len(node.args) < 2 or not isinstance(node.args[0], torch.fx.Node) or node.args[0].op != "get_attr":
        return False
    subgraph = getattr(gm, str(node.args[0].target), None)
    if not isinstance(subgraph, torch.fx.GraphModule) or any(
            inner.target is _HOP for inner in subgraph.graph.nodes):
        return False
    storages = set()
    for operand in node.args[2:]:
        value = operand.meta.get("example_value") if isinstance(operand, torch.fx.Node) else operand
        if not isinstance(value, torch.Tensor):
            if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                return False
            continue  # an opaque object (a DeviceMesh) or a constant: a constant of the local graph
        if value.requires_grad and torch.is_grad_enabled():
            return False
        leaves = _leaves(value, dtensor)
        if leaves is None:
            return False
        for leaf in leaves:
            if leaf.storage_offset():  # the local graph's inputs are fresh tensors of the operands' layout
                return False
            storage = _storage(leaf)
            if storage in storages:
                return False
            storages.add(storage)
    placeholders = [p.meta.get("example_value") for p in subgraph.graph.find_nodes(op="placeholder")]
    inputs = {_storage(leaf) for value in placeholders if isinstance(value, torch.Tensor)
              for leaf in (_leaves(value, dtensor) or [value])}
    outputs = subgraph.graph.find_nodes(op="output")[0].args[0]
    if not isinstance(outputs, (tuple, list)):
        return False
    for output in outputs:
        value = output.meta.get("example_value") if isinstance(output, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor):
            return False
        leaves = _leaves(value, dtensor)
        if leaves is None or any(_storage(leaf) in inputs for leaf in leaves):
            return False
    return True


def prepared(gm: torch.fx.GraphModule) -> torch.fx.GraphModule | None:
    """A copy of Dynamo's graph `gm` with each `invoke_subgraph` node a `region` call, or None if it has none or
    one of them does not qualify (that graph is inlined before AOTAutograd, as with this off)."""
    nodes = [node for node in gm.graph.find_nodes(op="call_function", target=_HOP)]
    if not nodes:
        return None
    dtensor = _dtensor_type()
    if any(node.target is _HOP for module in gm.modules() if module is not gm and isinstance(module, torch.fx.GraphModule)
           for node in module.graph.nodes) or not all(_qualifies(gm, node, dtensor) for node in nodes):
        return None
    graph = torch.fx.Graph()
    nodes = {}
    graph.output(graph.graph_copy(gm.graph, nodes))  # the nodes with their meta (Dynamo's example values)
    for node, copy in nodes.items():  # what AOTAutograd reads of Dynamo's (its static inputs: parameters, buffers)
        if hasattr(node, "_dynamo_source"):
            copy._dynamo_source = node._dynamo_source
    copied = torch.fx.GraphModule(gm, graph)  # shares the submodules
    copied.meta.update(gm.meta)
    for name, value in vars(gm).items():  # Dynamo's other attributes (`_param_name_to_source`)
        if name not in vars(copied):
            setattr(copied, name, value)
    for node in graph.find_nodes(op="call_function", target=_HOP):
        node.target = region
        # cacheable by AOTAutograd (`autograd_cache.check_node_safe`), whose key the compile cache's key tags
        node.meta.update(is_wrapped=True, user_cache_hash=f"{__name__}:{__version__}")
    copied.recompile()
    return copied


_NO_DECOMPOSITIONS: dict = {}
_OPERAND, _OUTPUT = "operand", "output"  # a region output: its operand of this index, or a local graph output
_CONSTANT = "constant"  # the spec of an operand that is not a tensor


def _flattened(value: Any) -> tuple[Any, tuple | None]:
    """A DTensor's local tensor and what rebuilds the DTensor around another one (`_rebuilt`): its flatten context,
    its other inner attributes (its mesh, an opaque object), size and stride; spec None if it has other tensors."""
    names, context = value.__tensor_flatten__()
    others = {name: getattr(value, name) for name in names if name != "_local_tensor"}
    if "_local_tensor" not in names or any(isinstance(other, torch.Tensor) for other in others.values()):
        return None, None
    return value._local_tensor, (context, tuple(others.items()), value.size(), value.stride())


def _rebuilt(dtensor: type, local: torch.Tensor, spec: tuple) -> Any:
    context, others, size, stride = spec
    return dtensor.__tensor_unflatten__({"_local_tensor": local, **dict(others)}, context, size, stride)


def _object_key(value: Any) -> int:
    """An opaque object by the object it stands for: AOTAutograd's passes give each DTensor and graph input its own
    fake of the one DeviceMesh (`FakeScriptObject.real_obj`)."""
    return id(getattr(value, "real_obj", value))


def _spec_key(spec: tuple | str | None) -> Any:
    if spec is None or spec is _CONSTANT:
        return spec
    context, others, _, _ = spec
    return context, tuple((name, _object_key(other)) for name, other in others)


def _unwrapped(operands: Sequence[Any], dtensor: type | None) -> tuple[list, list] | None:
    """(the operands' local tensors, or the operand itself if not a tensor; each operand's spec: its DTensor
    flatten context, size and stride, None for a plain tensor, `_CONSTANT`), if every tensor operand is a
    functional tensor or a DTensor over one (AOTAutograd's passes); None otherwise (an eager call)."""
    from torch._subclasses.functional_tensor import FunctionalTensor

    locals_, specs = [], []
    for operand in operands:
        if not isinstance(operand, torch.Tensor):
            locals_.append(operand)
            specs.append(_CONSTANT)
            continue
        if dtensor is not None and type(operand) is dtensor:
            local, spec = _flattened(operand)
            if spec is None:
                return None
            specs.append(spec)
        else:
            local = operand
            specs.append(None)
        if not isinstance(local, FunctionalTensor):
            return None
        locals_.append(local)
    return locals_, specs


def _meta(value: torch.Tensor) -> tuple:
    return tuple(value.shape), value.stride(), value.storage_offset(), value.dtype, value.device


def _local_graph(subgraph: torch.fx.GraphModule, locals_: list, specs: list, dtensor: type | None) -> tuple:
    """The functional local graph of `subgraph` for operands of these local tensors and specs (see the module doc):
    (graph, identifier, what each region output is, indices of the operands it writes, the graph's result layouts)."""
    from torch._functorch._aot_autograd.functional_utils import (
        from_fun,
        has_data_mutation,
        has_metadata_mutation,
        to_fun,
    )
    from torch._guards import detect_fake_mode
    from torch._subclasses.functional_tensor import FunctionalTensorMode
    from torch.fx.experimental import proxy_tensor
    from torch.utils._python_dispatch import _disable_current_modes

    tracing = proxy_tensor.get_proxy_mode()  # AOTAutograd's trace of its graph; none in its metadata passes
    table = tracing.decomposition_table if tracing is not None else _NO_DECOMPOSITIONS
    key = (tuple(_object_key(local) if spec is _CONSTANT else _meta(local) for local, spec in zip(locals_, specs)),
           tuple(_spec_key(spec) for spec in specs), id(table))
    known = _graphs.setdefault(subgraph, {})
    if key in known and known[key][0] is table:
        return known[key][1]
    fake_mode = detect_fake_mode()
    outputs: list = []
    written: list[int] = []

    tensors = [index for index, spec in enumerate(specs) if spec is not _CONSTANT]

    def run(*plain: torch.Tensor) -> list[torch.Tensor]:
        functional = [to_fun(value) for value in plain]
        operands = list(locals_)
        for index, value in zip(tensors, functional):
            spec = specs[index]
            operands[index] = value if spec is None else _rebuilt(dtensor, value, spec)
        with torch.fx.traceback.preserve_node_meta():
            results = torch.fx.Interpreter(subgraph).run(*operands)
        flat = []
        outputs.clear()
        storages = {_storage(value) for value in functional}
        for result in results:
            same = [index for index, operand in enumerate(operands) if result is operand]
            if same:  # the operand itself (`cache.cumulative_length.to(device)`), after the region's writes
                outputs.append((_OPERAND, same[0]))
                continue
            local, spec = (result, None) if dtensor is None or type(result) is not dtensor else _flattened(result)
            if type(result) is dtensor and spec is None:
                raise RegionNotSupported("a neuron AOT region returned a DTensor of more than one tensor")
            if _storage(local) in storages or any(local is other for other in flat):
                raise RegionNotSupported("a neuron AOT region returned a view of an input or one tensor twice")
            outputs.append((_OUTPUT, spec))
            flat.append(local)
        written.clear()
        for index, (before, after) in enumerate(zip(plain, functional)):
            if has_metadata_mutation(after, before, check_only_storage_mutation=False):
                raise RegionNotSupported("a neuron AOT region changed an input's metadata")
            if has_data_mutation(after):
                written.append(tensors[index])
        return [from_fun(value) for value in (*flat, *(functional[tensors.index(i)] for i in written))]

    # as AOTAutograd traces a graph (`graph_capture._create_graph`)
    with _disable_current_modes(), fake_mode:
        fakes = [torch.empty_strided(locals_[i].shape, locals_[i].stride(), dtype=locals_[i].dtype,
                                     device=locals_[i].device) for i in tensors]
    with _disable_current_modes(), fake_mode, FunctionalTensorMode(_allow_token_discovery=True):
        graph = proxy_tensor.make_fx(run, decomposition_table=table, record_module_stack=True)(*fakes)
    results = graph.graph.find_nodes(op="output")[0].args[0]
    layouts = [(tuple(value.shape), value.stride(), value.dtype, value.device)
               for value in (node.meta["val"] for node in results)]
    found = (graph, f"neuron_aot_region_{next(_identifiers)}", list(outputs), list(written), layouts)
    known[key] = (table, found)
    return found


def _record(tracing: Any, graph: torch.fx.GraphModule, identifier: str, operands: list, results: list) -> None:
    """Record `invoke_subgraph(graph, identifier, *operands)` with `results` in AOTAutograd's trace, as torch's rules
    do (`invoke_subgraph`'s functionalization rule: the operands' current values; its proxy rule: the node, the graph
    a submodule of the traced root, the results tracked as its items)."""
    from torch._subclasses.functional_tensor import FunctionalTensor
    from torch.fx.experimental.proxy_tensor import track_tensor_tree

    tracer = tracing.tracer
    registered = tracer.__dict__.setdefault("_neuron_aot_regions", set())
    if identifier not in registered:
        tracer.root.register_module(tracer.get_fresh_qualname("repeated_subgraph"), graph)
        registered.add(identifier)
    values = [FunctionalTensor.from_functional(operand) for operand in operands]
    proxy = tracer.create_proxy("call_function", _HOP,
                                (graph, identifier, *(tracer.unwrap_proxy(value) for value in values)), {})
    track_tensor_tree(results, proxy, constant=None, tracer=tracer)


def region(subgraph: torch.fx.GraphModule, identifier: str, *operands: Any) -> tuple:
    """A nested compile region's call in a graph AOTAutograd traces (see the module doc); called outside its passes
    (an eager run of the graph), the region's own call."""
    from torch._guards import detect_fake_mode
    from torch._subclasses.functional_tensor import (
        FunctionalTensor,
        PythonFunctionalizeAPI,
        mb_unwrap_functional_tensor,
    )
    from torch.fx.experimental import proxy_tensor
    from torch.utils._python_dispatch import _disable_current_modes

    dtensor = _dtensor_type()
    mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FUNCTIONAL)
    found = _unwrapped(operands, dtensor) if mode is not None else None
    if found is None:
        return subgraph(*operands)
    locals_, specs = found
    graph, name, outputs, written, layouts = _local_graph(subgraph, locals_, specs, dtensor)
    # The local graph's results are new tensors (none aliases an operand): tensors of their layouts stand for them.
    # AOTAutograd's metadata passes read only those layouts and which operands were written; its trace records the
    # `invoke_subgraph` node as torch's functionalization and proxy rules for it do. Calling the operator instead
    # runs the local graph on fake tensors at every layer (under functionalization too in the metadata passes):
    # the fake-tensor cache keeps no subgraph with a collective.
    with _disable_current_modes(), detect_fake_mode():
        fresh = [torch.empty_strided(shape, stride, dtype=dtype, device=device)
                 for shape, stride, dtype, device in layouts]
    tracing = proxy_tensor.get_proxy_mode()
    if tracing is not None:
        _record(tracing, graph, name, [local for local, spec in zip(locals_, specs) if spec is not _CONSTANT], fresh)
    results = [FunctionalTensor.to_functional(value) for value in fresh]
    count = sum(kind == _OUTPUT for kind, _ in outputs)
    api = PythonFunctionalizeAPI(mode)
    for index, value in zip(written, results[count:]):
        target = locals_[index]
        api.replace(target, mb_unwrap_functional_tensor(value))
        api.commit_update(target)
        api.sync(target)
    given = iter(results[:count])
    returned = []
    for kind, spec in outputs:
        if kind == _OPERAND:
            returned.append(operands[spec])
        else:
            value = next(given)
            returned.append(value if spec is None else _rebuilt(dtensor, value, spec))
    return tuple(returned)


def _has_regions(gm: torch.fx.GraphModule) -> bool:
    return any(node.target is _HOP for module in gm.modules() if isinstance(module, torch.fx.GraphModule)
               for node in module.graph.nodes)


def inlined(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`gm` (a Dynamo graph) with its `invoke_subgraph` nodes inlined (itself when it has none)."""
    if not _has_regions(gm):
        return gm
    from torch._higher_order_ops.passes.inline_invoke_subgraph import inline_invoke_subgraph

    gm = inline_invoke_subgraph(gm)
    gm.delete_all_unused_submodules()
    gm.recompile()
    return gm


def inlined_after_aot(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """An AOT graph with the `invoke_subgraph` nodes of `region`'s calls inlined, their lifted constants included
    (`_constants_moved_up`)."""
    if not _has_regions(gm):
        return gm
    _constants_moved_up(gm)
    gm = inlined(gm)
    for node in gm.graph.find_nodes(op="get_attr"):  # a region graph's, left without its calls
        if not node.users and isinstance(getattr(gm, str(node.target), None), torch.nn.Module):
            gm.graph.erase_node(node)
    gm.delete_all_unused_submodules()
    gm.recompile()
    return gm


def _constants_moved_up(gm: torch.fx.GraphModule) -> None:
    """The tensor constants of `gm`'s region graphs made attributes of `gm`, which the inlined `get_attr` nodes read
    (the inliner moves submodules only). A local graph's trace lifts a tensor the region makes from constants, as
    AOTAutograd's trace of the inlined layers lifts each layer's own: each call after the first gets a copy of the
    region graph with copies of its constants; a name `gm` has for another tensor is renamed."""
    from torch.utils._python_dispatch import _disable_current_modes

    seen = set()
    for node in list(gm.graph.find_nodes(op="call_function", target=_HOP)):
        subgraph = getattr(gm, str(node.args[0].target))
        if not any(isinstance(getattr(subgraph, str(get.target), None), torch.Tensor)
                   for get in subgraph.graph.find_nodes(op="get_attr")):
            continue
        if subgraph in seen:
            graph = torch.fx.Graph()
            graph.output(graph.graph_copy(subgraph.graph, {}))
            subgraph = torch.fx.GraphModule(subgraph, graph)
            name = next(f"{node.args[0].target}_call{n}" for n in itertools.count()
                        if not hasattr(gm, f"{node.args[0].target}_call{n}"))
            gm.register_module(name, subgraph)
            with gm.graph.inserting_before(node):
                node.update_arg(0, gm.graph.get_attr(name))
            for get in subgraph.graph.find_nodes(op="get_attr"):
                value = getattr(subgraph, str(get.target))
                if isinstance(value, torch.Tensor):
                    with _disable_current_modes():  # a real constant; AOTAutograd's fake mode may be on
                        setattr(subgraph, str(get.target), value.clone())
        seen.add(subgraph)
        for get in subgraph.graph.find_nodes(op="get_attr"):
            value = getattr(subgraph, str(get.target), None)
            if not isinstance(value, torch.Tensor):
                continue
            name = str(get.target)
            if getattr(gm, name, value) is not value:
                name = next(f"_tensor_constant_region{n}" for n in itertools.count()
                            if not hasattr(gm, f"_tensor_constant_region{n}"))
                setattr(subgraph, name, value)
                get.target = name
            setattr(gm, name, value)
        subgraph.recompile()
