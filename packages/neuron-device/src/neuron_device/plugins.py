"""The plugin seam: other wheels (neuron-compile, neuron-distributed, neuron-nki, or a user's package) join the
device through pluggy hooks, discovered from the entry point group `neuron_device.plugins`.

A plugin's entry point names a module or object carrying `@hookimpl` functions. Loading must stay cheap because it
happens while `import torch` runs: a plugin imports its heavy parts inside its hooks. A plugin that fails to load or
whose hook raises is reported by name in a warning and skipped, so one broken package cannot break `import torch`;
`NEURON_DEVICE_STRICT_PLUGINS=1` turns that into an error instead.
"""

from __future__ import annotations

import warnings
from importlib.metadata import entry_points
from typing import Any

import pluggy

from . import envvars

__all__ = [
    "ENTRY_POINT_GROUP",
    "RELAYOUT",
    "PluginLoadError",
    "fuse",
    "hookimpl",
    "hookspec",
    "load_plugins",
    "loaded_plugins",
    "report_graphs",
    "torch_neuronx_export",
]

PROJECT = "neuron_device"
RELAYOUT = "neuron_relayout"  # `neuron_fuse`'s graphs: the meta key of a clone that only lays a result out
ENTRY_POINT_GROUP = "neuron_device.plugins"
STRICT_ENV = envvars.STRICT_PLUGINS.name

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class PluginLoadError(RuntimeError):
    """A `neuron_device.plugins` entry point could not be loaded or its hook failed."""


class NeuronDeviceSpec:
    """Hooks a plugin may implement. neuron-device calls them once, right after the device is registered."""

    @hookspec
    def neuron_register(self, registry: Any) -> None:
        """Contribute kernels: `registry.register("ns::op.overload", fn)` makes `fn` the op's `neuron` kernel."""

    @hookspec
    def neuron_device_ready(self, device_module: Any) -> None:
        """The device is usable: `device_module` is `torch.neuron`. Register backends, interfaces, etc. here."""

    @hookspec(firstresult=True)
    def neuron_report_graphs(self) -> dict[str, Any] | None:
        """This process's compiled-graph counters for the simulation report (neuron-compile's dynamo metrics), or
        None. Called when the report is made."""

    @hookspec
    def neuron_torch_neuronx_exports(self) -> dict[str, Any]:
        """Names the plugin adds to `torch_neuronx` (e.g. neuron-nki's `nki`, `nki_op`, `wrap_nki`): name -> a
        callable of no arguments that returns the object, called on first access (so nothing heavy loads early)."""

    @hookspec(firstresult=True)
    def neuron_fuse(self, graph_module: Any, example_inputs: list) -> Any:
        """Compile a run of queued eager ops (adaptive eager) into one callable, or return None.

        `graph_module` is an FX graph of ATen ops on CPU tensors returning a tuple; `example_inputs` are the CPU
        tensors (host aliases) of its first call. The callable is called with tensors of the same sizes, strides and
        dtypes and must return the graph's outputs (values equal to the graph's, any strides). The first plugin
        returning a callable wins; with none, runs execute op by op. A `clone` node whose `meta` holds
        `RELAYOUT` copies a permuted result only so that the `as_strided` views reading it find the layout the CPU
        kernel gave the result: a host code calling the same CPU kernels as eager may read the permute's input.
        """


_manager: pluggy.PluginManager | None = None
loaded_plugins: dict[str, str] = {}  # plugin name -> "ok" or the error that disabled it


def _strict() -> bool:
    return envvars.STRICT_PLUGINS.read()


def _report(name: str, stage: str, error: BaseException) -> None:
    message = (
        f"neuron_device plugin {name!r} failed to {stage}: {type(error).__name__}: {error}. "
        f"The plugin is disabled; set {STRICT_ENV}=1 to make this an error."
    )
    loaded_plugins[name] = message
    if _strict():
        raise PluginLoadError(message) from error
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def _call_each(manager: pluggy.PluginManager, hook: str, **kwargs: Any) -> None:
    """Call one hook on every plugin separately, so a failing plugin is reported by name and the rest still run."""
    for impl in getattr(manager.hook, hook).get_hookimpls():
        try:
            impl.function(**kwargs)
        except Exception as error:
            _report(impl.plugin_name, f"run its {hook} hook", error)


def report_graphs() -> dict[str, Any] | None:
    """Compiled-graph counters from the first plugin that has them (`neuron_report_graphs`), or None."""
    if _manager is None:
        return None
    return _manager.hook.neuron_report_graphs()


def torch_neuronx_export(name: str) -> Any:
    """The object a plugin adds to `torch_neuronx` under `name` (`neuron_torch_neuronx_exports`); AttributeError if
    no plugin does."""
    for exports in ([] if _manager is None else _manager.hook.neuron_torch_neuronx_exports()):
        if name in exports:
            return exports[name]()
    raise AttributeError(name)


def fuse(graph_module: Any, example_inputs: list) -> Any:
    """The compiled form of `graph_module` from the first plugin that fuses it (`neuron_fuse`), or None."""
    if _manager is None:
        return None
    return _manager.hook.neuron_fuse(graph_module=graph_module, example_inputs=example_inputs)


def load_plugins(registry: Any, device_module: Any) -> pluggy.PluginManager:
    """Discover the installed plugins, then call `neuron_register` and `neuron_device_ready` on each."""
    global _manager
    if _manager is not None:
        return _manager
    manager = pluggy.PluginManager(PROJECT)
    manager.add_hookspecs(NeuronDeviceSpec)
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            plugin = entry_point.load()
            manager.register(plugin, name=entry_point.name)
        except Exception as error:
            _report(entry_point.name, f"load (entry point {entry_point.value!r})", error)
            continue
        loaded_plugins[entry_point.name] = "ok"
    _call_each(manager, "neuron_register", registry=registry)
    _call_each(manager, "neuron_device_ready", device_module=device_module)
    _manager = manager
    return manager
