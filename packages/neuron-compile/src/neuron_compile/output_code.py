"""The "aten" host code as an Inductor `OutputCode`, so that AOTAutograd's cache stores it and a warm process loads
it instead of compiling.

torch's AOTAutograd cache saves a graph only for a compiler that returns an `OutputCode` it can serialise; with
`torch._functorch.config.bundled_autograd_cache` the `OutputCode` itself is pickled into the AOTAutograd entry
(`BundledAOTAutogradResult`), next to the runtime wrappers and the view/mutation metadata AOTAutograd needs to call
it. A hit then skips AOTAutograd's tracing and partitioning, the Neuron passes and the planning: what is left is
Dynamo, the key and the load. (Inductor's own host code hits the same way, through its `CompiledFxGraph`.)

`AtenHostCode` holds the AOT graph as the Neuron passes left it (the graph the host runs node by node on ATen CPU
kernels) and the kernel plan made from it (simulated time and workspace). The graph is serialised with torch's
`GraphPickler` without node metadata (the fake tensors of the trace are not needed to run it) and rebuilt on load
with `recompile`. The plan is pickled with it, and a load hands it to the compile that loaded it (`collecting`), so
the simulated figures always belong to the code that runs, whichever cache entry it came from.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, MutableMapping, Sequence
from typing import Any

import torch
from torch._inductor.output_code import OutputCode

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
        """Called on a shallow copy about to be pickled: keep the graph as `GraphPickler` bytes only."""
        if self._graph_module is None:
            return
        from torch.fx._graph_pickler import GraphPickler, Options

        self._serialized = GraphPickler.dumps(self._graph_module,
                                              Options(ops_filter=None, node_metadata_key_filter=_no_metadata))
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
        from torch._guards import detect_fake_mode
        from torch.fx._graph_pickler import GraphPickler

        fake_mode = detect_fake_mode(example_inputs) or torch._subclasses.FakeTensorMode()
        gm = GraphPickler.loads(self._serialized, fake_mode)
        if not isinstance(gm, torch.fx.GraphModule):
            raise RuntimeError(f"a stored AtenHostCode holds a {type(gm).__name__}, not a GraphModule")
        gm.recompile()
        return gm

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        """No Triton kernels in host code."""
