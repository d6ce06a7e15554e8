"""What the environment asks for at start-up, checked once per process when the device registers.

* A set variable that TorchNeuron documents but that only matters to real hardware, the real compiler or the real
  runtime (each package's ``envvars.NO_EFFECT``: `NEURON_CC_FLAGS`, `TORCH_NEURONX_MLIR_ATEN_OPS`, host CC, ...) is
  accepted with one note saying it has no effect here and why.
* A set `TORCH_NEURONX_*`, `NEURON_RT_*` or `NEURON_SIM_*` variable that no installed package declares is most likely
  a typo: one warning names the closest declared name.
* `TORCH_NEURONX_LOG_LEVEL` sets the level of the packages' loggers.

Nothing here raises: a bad value of one of these variables is a warning, and `import torch` goes on.
"""

from __future__ import annotations

import importlib
import logging
import warnings

from neuron_spec.env import EnvVar, EnvVarError, unknown_names

from . import envvars

__all__ = ["DECLARATIONS", "LOGGERS", "PREFIXES", "EnvironmentNote", "check", "declared"]

PREFIXES = ("TORCH_NEURONX_", "NEURON_RT_", "NEURON_SIM_")
DECLARATIONS = ("neuron_device.envvars", "neuron_compile.envvars", "neuron_distributed.envvars", "nki.envvars")
LOGGERS = ("neuron_device", "neuron_compile", "neuron_distributed", "nki", "torch_neuronx")
_LEVELS = {"0": logging.ERROR, "1": logging.WARNING, "2": logging.INFO, "3": logging.DEBUG,
           "error": logging.ERROR, "warning": logging.WARNING, "info": logging.INFO, "debug": logging.DEBUG}


class EnvironmentNote(UserWarning):
    """A variable is accepted but has no effect on the simulator, or looks like a typo of a declared one."""


def declared() -> tuple[list[EnvVar], list[EnvVar]]:
    """(every variable the installed packages declare, those of them accepted with no effect)."""
    variables: list[EnvVar] = []
    no_effect: list[EnvVar] = []
    for name in DECLARATIONS:
        try:
            module = importlib.import_module(name)
        except ImportError:  # that wheel is not installed
            continue
        variables += module.VARIABLES
        no_effect += getattr(module, "NO_EFFECT", ())
    return variables, no_effect


def _apply_log_level() -> None:
    try:
        level = envvars.LOG_LEVEL.read()
    except EnvVarError as error:
        warnings.warn(f"{error}; the log level is left as it is", EnvironmentNote, stacklevel=3)
        return
    if level is not None:
        for name in LOGGERS:
            logging.getLogger(name).setLevel(_LEVELS[level])


def check() -> None:
    """Warn once about variables with no effect and likely typos; apply the log level."""
    variables, no_effect = declared()
    for var in no_effect:
        if var.is_set():
            warnings.warn(f"{var.name} is set but has no effect on the simulated device: {var.doc.split(': ', 1)[-1]}",
                          EnvironmentNote, stacklevel=3)
    for name, closest in unknown_names({var.name for var in variables}, PREFIXES):
        hint = f"; did you mean {closest}?" if closest else ""
        warnings.warn(f"{name} is set but no installed neuron package reads it{hint}", EnvironmentNote, stacklevel=3)
    _apply_log_level()
