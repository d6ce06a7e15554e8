"""Every environment variable neuron-device reads, declared once (name, type, default, doc).

The machine's variables (target, instance, chips, visible cores, device memory) are declared with their parser in
the hardware spec (`neuron_spec.machine`) and listed here too, so this module is the package's whole list.
How to declare a variable and how values are parsed: `neuron_spec.env`. The docs table
``docs/environment-variables.md`` is checked against `VARIABLES` (``tests/test_docs_env_vars.py``).
"""

from __future__ import annotations

from neuron_spec import machine as _machine
from neuron_spec.env import EnvVar, EnvVarError

TORCH_AUTOLOAD = EnvVar(
    "TORCH_DEVICE_BACKEND_AUTOLOAD", bool, True,
    "`0`: `import torch` does not register `neuron`; `import torch_neuronx` (or `neuron_device`) does it",
    owner="torch",  # read by torch, not by us; documented because it decides whether `import torch` registers us
)
LOCAL_RANK = EnvVar("LOCAL_RANK", str, None,
                    "under a launcher, the current device starts at `neuron:<LOCAL_RANK>`")
FALLBACK = EnvVar("NEURON_FALLBACK_ENABLED", bool, True,
                  "`0`/`false`: a CPU fallback raises instead of warning (check a workload runs natively)")
DOWNCAST_64BIT = EnvVar("TORCH_NEURONX_DOWNCAST_64BIT", bool, False,
                        "`1`: run 64-bit types in 32 bits, as the hardware does")
ADAPTIVE_EAGER = EnvVar("TORCH_NEURONX_ENABLE_CONCATENATION", bool, False,
                        "`1`/`true`: adaptive eager, queue eager ops and fuse repeated runs")
ADAPTIVE_EAGER_BUFFER_SIZE = EnvVar("TORCH_NEURONX_CONCATENATION_BUFFER_SIZE_LIMIT", int, 512,
                                    "adaptive eager: ops queued before the queue runs by itself", minimum=1)
ADAPTIVE_EAGER_LOW_THRESHOLD = EnvVar("TORCH_NEURONX_CONCATENATION_QUEUE_LOW_THRESHOLD", int, 2,
                                      "adaptive eager: runs of fewer ops always execute op by op, never fused",
                                      minimum=1)
STRICT_PLUGINS = EnvVar("NEURON_DEVICE_STRICT_PLUGINS", bool, False,
                        "`1`: a plugin that fails to load is an error instead of a warning")
REPORT = EnvVar("NEURON_SIM_REPORT", str, "0",
                "`1`/`text` or `json`: print the simulation report at exit; `0` or unset: off")
REPORT_FILE = EnvVar("NEURON_SIM_REPORT_FILE", str, None, "write the exit report to this file instead of stderr")
PROGRESS = EnvVar("NEURON_SIM_PROGRESS", bool, True,
                  "`0`: no progress line even on a terminal (it is never shown when stderr is not a terminal)")

RUNTIME_DIR = EnvVar("NEURON_SIM_RUNTIME_DIR", str, None,
                     "where processes publish their counters for `neuron-top`, `neuron-monitor` and `neuron-ls` "
                     "(default `$XDG_RUNTIME_DIR/neuron-sim`, else `<tmp>/neuron-sim-<uid>`)")
XDG_RUNTIME_DIR = EnvVar("XDG_RUNTIME_DIR", str, None, "base of the default runtime directory of the monitoring tools")
# TorchNeuron's eager-mode variables (its env-var reference, "General").
LAUNCH_BLOCKING = EnvVar("NEURON_LAUNCH_BLOCKING", bool, False,
                         "`1`: synchronous execution, the host waits for every op to finish on the simulated device "
                         "(no overlap of host and device time); read once per process, at the first op")
LOG_LEVEL = EnvVar("TORCH_NEURONX_LOG_LEVEL", str, None,
                   "level of the packages' loggers: `0` error, `1` warning, `2` info, `3` debug (or the level's "
                   "name); unset: Python's logging configuration decides",
                   choices=("0", "1", "2", "3", "error", "warning", "info", "debug"))
STACK_TRACE = EnvVar("TORCH_NEURONX_ENABLE_STACK_TRACE", bool, False,
                     "`1`: a CPU-fallback warning (and the error when fallback is disabled) carries the Python stack "
                     "of the call")
FALLBACK_ONLY_UNIMPLEMENTED = EnvVar(
    "TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS", bool, True,
    "accepted, no effect here: a native op runs the ATen CPU kernel on the device's host memory, so it never fails "
    "where a CPU fallback would succeed; only unimplemented ops fall back, which is the documented `1`")


def _no_effect(name: str, reason: str) -> EnvVar:
    return EnvVar(name, str, None, f"accepted, no effect here: {reason}")


# Documented TorchNeuron / Neuron Runtime variables that only matter to real hardware or the real runtime: each is
# accepted with a one-time note that it has no effect (`neuron_device.environment`).
NO_EFFECT: tuple[EnvVar, ...] = (
    FALLBACK_ONLY_UNIMPLEMENTED,
    _no_effect("TORCH_NEURONX_MLIR_ATEN_OPS", "eager ops are not lowered through torch-mlir to a NEFF; each runs its "
               "ATen kernel on the host"),
    _no_effect("TORCH_NEURONX_ENABLE_ASYNC_NRT", "there is no Neuron Runtime; the simulated timeline is always "
               "asynchronous until a synchronisation point (see `NEURON_LAUNCH_BLOCKING`)"),
    _no_effect("TORCH_NEURONX_LOG_FILE", "the packages log through Python's `logging`; configure a handler there"),
    _no_effect("NEURON_RT_LOG_LEVEL", "there is no Neuron Runtime (libnrt) to log"),
    _no_effect("NEURON_RT_LOG_LOCATION", "there is no Neuron Runtime (libnrt) to log"),
    _no_effect("NEURON_RT_DBG_ZEROCOPY", "the device's memory is host memory already"),
    _no_effect("NEURON_RT_ALLOW_LEGACY_NEFF", "nothing loads NEFF files"),
    _no_effect("NEURON_RT_EXEC_TIMEOUT", "ops run synchronously on the host; nothing can time out"),
    _no_effect("NEURON_RT_INSPECT_ENABLE", "device profiles come from `torch_neuronx.NeuronProfiler` instead"),
    _no_effect("NEURON_RT_INSPECT_OUTPUT_DIR", "device profiles come from `torch_neuronx.NeuronProfiler` instead"),
    _no_effect("NEURON_RT_STOCHASTIC_ROUNDING_EN", "results are the CPU's, rounded as the CPU rounds"),
)

VARIABLES: tuple[EnvVar, ...] = (
    TORCH_AUTOLOAD,
    *_machine.VARIABLES,
    LOCAL_RANK,
    FALLBACK,
    DOWNCAST_64BIT,
    ADAPTIVE_EAGER,
    ADAPTIVE_EAGER_BUFFER_SIZE,
    ADAPTIVE_EAGER_LOW_THRESHOLD,
    STRICT_PLUGINS,
    REPORT,
    REPORT_FILE,
    PROGRESS,
    RUNTIME_DIR,
    XDG_RUNTIME_DIR,
    LAUNCH_BLOCKING,
    LOG_LEVEL,
    STACK_TRACE,
    *NO_EFFECT,
)


# A bad value of a variable read while `import torch` runs (the autoload imports us) must not break `import torch`
# for a program that never uses `neuron`: the error waits here and is raised, naming the variable, at the device's
# first use (`neuron.lazy_init`).
_deferred: dict[str, EnvVarError] = {}


def defer(name: str, error: EnvVarError) -> None:
    """Keep `error` (about variable `name`) for the device's first use."""
    _deferred.setdefault(name, error)


def read_at_import(variable: EnvVar):
    """`variable.read()` for a setting fixed at import: on a bad value, the default now and the error at first use."""
    try:
        return variable.read()
    except EnvVarError as error:
        defer(variable.name, error)
        return variable.default


def raise_deferred() -> None:
    """Raise the first deferred error (see `read_at_import`), if any."""
    if _deferred:
        raise next(iter(_deferred.values()))
