"""Start-up of the `neuron` device, in named phases (the table of contents of what `register()` does)."""

from __future__ import annotations

import importlib.metadata
import sys
import threading
import types

import torch

_registered = False
_lock = threading.Lock()

# Distributions of AWS's own stack that install modules under the same import names as ours.
_CONFLICTING_DISTRIBUTIONS = ("torch-neuronx", "neuronx-cc")
# The local version label of our own metadata-only `torch-neuronx` (packages/torch-neuronx): not AWS's, no clash.
OWN_TORCH_NEURONX_LABEL = "neuronsim"


def _check_no_aws_stack() -> None:
    for name in _CONFLICTING_DISTRIBUTIONS:
        for dist in importlib.metadata.distributions(name=name):
            version = dist.version
            if name == "torch-neuronx" and version.partition("+")[2].split(".")[0] == OWN_TORCH_NEURONX_LABEL:
                continue  # ours (packages/torch-neuronx): it only answers importlib.metadata.version("torch_neuronx")
            raise RuntimeError(
                f"AWS's {name} {version} is installed next to neuron-device. Both provide the `torch_neuronx` device "
                "backend under the same names; uninstall one of them (pip uninstall neuron-device or "
                f"pip uninstall {name})."
            )


def _register_device() -> None:
    from . import neuron
    from .device import NeuronGuard
    from .hooks import NeuronHooks

    torch.utils.rename_privateuse1_backend("neuron")
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )
    torch._register_device_module("neuron", neuron)
    # `import torch.neuron.memory` (as code does `import torch.cuda.memory`) must find the loaded submodule: Python
    # would otherwise load the file a second time as part of package `torch`, where its relative imports fail.
    for name, module in vars(neuron).items():
        if isinstance(module, types.ModuleType) and module.__name__ == f"{neuron.__name__}.{name}":
            sys.modules[f"torch.neuron.{name}"] = module
    torch._C._acc.register_python_privateuseone_hook(NeuronHooks())
    torch._C._acc.register_python_privateuseone_device_guard(NeuronGuard())


def _register_kernels() -> None:
    # Importing `minimal`, `cpu_exact`, `matmul`, `attention`, `flex_attention` and `rnn_cells` registers their kernels.
    from . import autocast, fallback
    from .ops import attention, cpu_exact, flex_attention, matmul, minimal, registry, rnn_cells  # noqa: F401

    registry.register_fallback(fallback.run_on_host)
    for sparse_key in ("SparsePrivateUse1", "SparseCsrPrivateUse1"):
        registry.register_fallback(fallback.refuse_sparse, sparse_key)
    for key, kind in (("QuantizedPrivateUse1", "quantized"), ("NestedTensorPrivateUse1", "nested")):
        registry.register_fallback(fallback.refusing(kind), key)
    registry.builtin.update(registry.kernels)
    autocast.register()


def _apply_patches() -> None:
    from . import _patches

    _patches.apply_all()


def _load_plugins() -> None:
    from . import plugins
    from .ops import registry

    plugins.load_plugins(registry, torch.neuron)


def _install_fast_path() -> None:
    from .adaptive_eager import queue as adaptive_eager
    from .ops import fastpath

    fastpath.install()  # last: only ops that neither neuron-device nor a plugin gave a direct kernel
    adaptive_eager.install()  # its recorder in front of the fast kernels, when switched on


def _install_exit_report() -> None:
    from neuron_spec.env import EnvVarError

    from . import envvars
    from .simulation import report  # light: the op tracker and allocator it reads are imported by then

    try:
        report.install_exit_report()
    except EnvVarError as error:  # `import torch` must not fail on it: raised at the device's first use instead
        envvars.defer(report.REPORT_ENV, error)


def _check_environment() -> None:
    """One-time notes on variables with no effect here, typo warnings, the log level (after the plugins loaded:
    their packages declare variables too)."""
    from . import environment

    environment.check()


def register() -> None:
    """Register the `neuron` device with torch (idempotent, thread-safe)."""
    global _registered
    if _registered:
        return
    with _lock:
        if _registered:
            return
        _check_no_aws_stack()
        _register_device()
        _register_kernels()
        _apply_patches()
        _registered = True
        _load_plugins()
        _check_environment()
        _install_fast_path()
        _install_exit_report()
