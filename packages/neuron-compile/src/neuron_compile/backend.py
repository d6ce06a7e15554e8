"""`torch.compile(backend="neuron")`: TorchNeuron's compile contract around the `compiler` pipeline.

* static shapes: `dynamic=True` is rejected with the alternatives; a new input shape compiles a new graph (with
  Dynamo's automatic dynamic shapes, the symbolic graph is specialised per concrete shape here) and is counted in
  `torch.neuron.get_dynamo_metrics()`;
* `mode` other than "default" warns and compiles as default;
  `options={"model_name": ..., "fallback_execution": ..., "host_code": ...}`;
* a compile failure raises `NeuronCompileError`, unless fallback execution is enabled
  (`TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0` or `options={"fallback_execution": True}`): then the graph runs
  eagerly on `neuron`, with a warning;
* the persistent compile cache (`cache`) and the debug artifacts (`artifacts`).
"""

from __future__ import annotations

import copy
import logging
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from neuron_device import services

from . import _patches, aot_regions, cache, compiler, dynamo_device, envvars, layer_regions, metrics
from .artifacts import ArtifactWriter
from .compiled_graph import CompiledGraph
from .passes import KernelPlan
from .settings import CompileSettings

__all__ = ["DynamicShapesNotSupported", "NeuronCompileError", "neuron_backend"]

log = logging.getLogger(__name__)
dynamo_device.register()  # before Dynamo traces anything for this backend (it handles neuron's streams)

class NeuronCompileError(RuntimeError):
    """A graph failed to compile for `neuron` (and fallback execution is disabled)."""

class DynamicShapesNotSupported(NeuronCompileError):
    """The graph has symbolic shapes, which TorchNeuron's compiler does not support."""

_DYNAMIC_MESSAGE = (  # TorchNeuron's text first (its dynamic-shape analysis pass), then what to do instead
    "Dynamic shapes detected in the model, but torch-neuronx requires static shapes. Found {count} dynamic "
    "dimension(s): {dims}. "
    'torch.compile(backend="neuron") compiles static shapes only. '
    "dynamic=True is not supported. Alternatives: leave `dynamic` unset or pass dynamic=False (each new input shape "
    "then compiles its own graph, counted in torch.neuron.get_dynamo_metrics()); pad or bucket inputs to a few fixed "
    "shapes to bound the number of compilations."
)

# The fake-tensor errors Dynamo turns into a graph break when a backend raises them (as it does under Inductor): a
# data-dependent output shape met while tracing the joint graph, e.g. the backward of a boolean-mask assignment
# `x[ids == k] = v` (T5Gemma2's embeddings), which indexes with the mask. Wrapped in NeuronCompileError, they would
# fail the compile instead.
_GRAPH_BREAKS = torch._dynamo.exc.exceptions_allowed_to_be_fallback

def _symbolic_dims(inputs: Sequence[Any]) -> list[str]:
    found = []
    for position, value in enumerate(inputs):
        if isinstance(value, torch.SymInt):
            found.append(f"input {position}")
        elif isinstance(value, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in value.shape):
            found.append(f"input {position} shape {tuple(value.shape)}")
    return found

def _device_index(inputs: Sequence[Any]) -> int:
    for value in inputs:
        if isinstance(value, torch.Tensor) and value.device.type == "neuron":
            return value.device.index
    return torch.neuron.current_device()

def _compile_id() -> tuple[str, bool]:
    """A name for this compile (Dynamo's frame and compile ids) and whether it recompiles an already compiled frame."""
    compile_id = torch._guards.CompileContext.current_compile_id()
    if compile_id is None or compile_id.frame_id is None:
        return "0", False
    return f"{compile_id.frame_id}_{compile_id.frame_compile_id}", bool(compile_id.frame_compile_id)

def _has_collectives(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph calls a functional collective (TorchNeuron's `has_collectives` metric)."""
    return any(node.op == "call_function" and getattr(node.target, "namespace", "") in ("_c10d_functional", "c10d")
               for node in gm.graph.nodes)

def _eager(gm: torch.fx.GraphModule) -> Callable:
    def run(*args: Any) -> Any:
        return gm(*args)

    return run

def _compile_static(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    settings: CompileSettings,
    *,
    name: str,
    recompile: bool,
    traced: bool = True,
    regioned: torch.fx.GraphModule | None = None,
) -> CompiledGraph:
    started = time.perf_counter()
    metrics.record("compilations")
    if recompile:
        metrics.record("recompilations")
    has_cpu = compiler.has_cpu_tensor_inputs(example_inputs)
    if has_cpu and not settings.autocopy:
        index = next(i for i, v in enumerate(example_inputs) if isinstance(v, torch.Tensor) and v.device.type == "cpu")
        raise NeuronCompileError(  # TorchNeuron's text, then why and which graph
            f"Input tensor at index {index} is on cpu device, expected neuron. Move tensor to Neuron device first "
            f"with tensor.to('neuron') (graph {name!r}; auto-copy of CPU inputs is disabled by "
            f"{envvars.AUTOCOPY_DISABLED.name}=1)"
        )
    # Compile time: what compiling runs on the device (example inputs copied there, Inductor's pattern examples and
    # constant folding) is the compiler's, which on Trainium runs on the host: it charges the program nothing, and
    # a compile served from a cache, which skips it, plans and runs with the same figures.
    with services.compiling():
        graph_inputs = compiler.to_neuron(example_inputs) if has_cpu else list(example_inputs)
        autocopy = has_cpu
        index = _device_index(graph_inputs)
        artifacts = ArtifactWriter(settings.debug_dir, name)
        plans: dict[str, KernelPlan] = {}
        original = copy.deepcopy(gm) if settings.fallback_execution else None  # compiling rewrites `gm`
        record = metrics.NeuronCompilationMetrics(graph_id=name, graph_name=name, model_name=settings.model_name or "",
                                                  has_collectives=_has_collectives(gm),
                                                  graph_node_count=len(gm.graph.nodes), timestamp=metrics.now())
        try:
            with cache.entry(gm, graph_inputs, settings) as entry, metrics.graph(record):
                record.graph_id = entry.key or name
                if entry.hit:
                    metrics.record("cache_hits")
                    plans.update(entry.plans)
                else:
                    metrics.record("cache_misses")
                fn = compiler.compile_graph(gm, graph_inputs, artifacts=artifacts, plans=plans, traced=traced,
                                            cache_key=entry.key, host_code=settings.host_code,
                                            regioned=regioned)
                if not entry.hit:
                    entry.store(plans)
        except (DynamicShapesNotSupported, *_GRAPH_BREAKS):
            raise
        except Exception as error:
            metrics.record("failures")
            log.debug("neuron compilation of graph %s failed", name, exc_info=True)
            if not settings.fallback_execution:
                raise NeuronCompileError(
                    f"neuron compilation of graph {name!r} failed: {type(error).__name__}: {error}. To run failing "
                    f"graphs eagerly instead, set {envvars.FALLBACK_DISABLED.name}=0 or pass "
                    "options={'fallback_execution': True}."
                ) from error
            warnings.warn(
                f"neuron compilation of graph {name!r} failed ({type(error).__name__}: {error}); running it eagerly on "
                "'neuron' (fallback execution is enabled).",
                RuntimeWarning,
                stacklevel=2,
            )
            metrics.record("fallbacks")
            return CompiledGraph(_eager(original), autocopy=autocopy, index=index, forward_seconds=0.0,
                                 backward_seconds=0.0, retain_device=settings.retain_device)
        finally:
            metrics.record("compilations", 0, seconds=time.perf_counter() - started)
    forward = plans.get("forward") or plans.get("inference")
    backward = plans.get("backward")
    return CompiledGraph(
        fn,
        autocopy=autocopy,
        index=index,
        forward_seconds=forward.seconds if forward else 0.0,
        backward_seconds=backward.seconds if backward else 0.0,
        forward_workspace=forward.workspace_bytes if forward else 0,
        backward_workspace=backward.workspace_bytes if backward else 0,
        retain_device=settings.retain_device,
        forward_parts=forward.parts() if forward else None,
        backward_parts=backward.parts() if backward else None,
        constant_bytes=forward.constant_bytes if forward else 0,
    )

class _PerShape:
    """A graph Dynamo made symbolic (automatic dynamic shapes) compiled statically for each concrete shape it meets."""

    def __init__(self, gm: torch.fx.GraphModule, settings: CompileSettings, name: str) -> None:
        self.gm = gm
        self.settings = settings
        self.name = name
        self.compiled: dict[tuple, CompiledGraph] = {}

    @staticmethod
    def _signature(args: Sequence[Any]) -> tuple:
        return tuple(
            (tuple(a.shape), a.stride(), a.dtype, a.device, a.requires_grad) if isinstance(a, torch.Tensor) else a
            for a in args
        )

    def __call__(self, *args: Any) -> Any:
        key = self._signature(args)
        found = self.compiled.get(key)
        if found is None:
            from torch.utils._python_dispatch import _disable_current_modes

            name = f"{self.name}_s{len(self.compiled)}"
            # compiled as Dynamo compiles a frame, with the caller's dispatch modes off: under a mode that sees
            # every op (a plan's fake mode and charger) AOTAutograd's functional tensors met that mode and failed
            with _disable_current_modes():
                found = _compile_static(copy.deepcopy(self.gm), list(args), self.settings, name=name,
                                        recompile=True, traced=False)
            self.compiled[key] = found
        return found(*args)

def _inlined_regions(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`gm` with the subgraphs of its nested compile regions (`layer_regions`'s, a user's
    `torch.compiler.nested_compile_region`) inlined: Dynamo traced each region once and stamped it out, which is
    what saves the trace; the compiler gets the graph an unmarked trace gives (neither AOTAutograd's subclass
    tracing of DTensors nor the host code run an `invoke_subgraph`). Its AOTAutograd traces the regions kept
    instead when they qualify (`aot_regions`)."""
    return aot_regions.inlined(gm)


def neuron_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    mode: str | None = None,
    options: dict[str, Any] | None = None,
) -> Callable:
    """The Dynamo backend registered as "neuron" (entry point `torch_dynamo_backends`)."""
    regioned = aot_regions.prepared(gm) if envvars.AOT_REGIONS.read() else None
    gm = _inlined_regions(gm)
    settings = CompileSettings.resolve(mode, options)
    suffix, recompile = _compile_id()
    name = f"{settings.model_name or 'graph'}_{suffix}"
    dims = _symbolic_dims(example_inputs)
    if dims:
        if not torch._dynamo.config.assume_static_by_default:  # dynamic=True
            raise DynamicShapesNotSupported(_DYNAMIC_MESSAGE.format(count=len(dims), dims=", ".join(dims)))
        return _PerShape(gm, settings, name)
    return _compile_static(gm, example_inputs, settings, name=name, recompile=recompile, regioned=regioned)


# transformers' decoder layers are traced once each kind while Dynamo traces for this backend (`layer_regions`).
_patches.while_tracing_for(lambda backend: backend is neuron_backend, layer_regions.tracing, layer_regions.not_tracing)
# Dynamo's fallback to eager at its recompile limit warns for graphs of this backend (see `_patches`; the outer
# wrapper, so the warning points at Dynamo's caller).
_patches.warn_on_recompile_limit(lambda backend: backend is neuron_backend)
