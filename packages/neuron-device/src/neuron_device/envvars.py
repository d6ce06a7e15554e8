"""Every environment variable neuron-device reads, declared once (name, type, default, doc).

The machine's variables (target, instance, chips, visible cores, device memory) are declared with their parser in
the hardware spec (`neuron_spec.machine`) and listed here too, so this module is the package's whole list.
How to declare a variable and how values are parsed: `neuron_spec.env`. The docs table
``docs/environment-variables.md`` is checked against `VARIABLES` (``tests/test_docs_env_vars.py``).
"""

from __future__ import annotations

from neuron_spec import machine as _machine
from neuron_spec.env import EnvVar

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
)
