"""Every environment variable neuron-compile reads, declared once (name, type, default, doc): TorchNeuron's names.

How to declare a variable and how values are parsed: `neuron_spec.env`. The docs table
``docs/environment-variables.md`` is checked against `VARIABLES` (``tests/test_docs_env_vars.py``).
"""

from __future__ import annotations

from neuron_spec.env import EnvVar


def _compile(name: str, type: type, default: object, doc: str, **extra: object) -> EnvVar:
    return EnvVar(name, type, default, doc, owner="compile", **extra)


FALLBACK_DISABLED = _compile("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION", bool, True,
                             "default `1`: a compile failure raises; `0`: the graph runs eagerly on `neuron` with a "
                             "warning")
AUTOCOPY_DISABLED = _compile("TORCH_NEURONX_DYNAMO_DISABLE_CPU_AUTOCOPY", bool, False,
                             "`1`: CPU inputs of a compiled graph are not copied to `neuron`")
DEBUG_DIR = _compile("TORCH_NEURONX_DEBUG_DIR", str, None,
                     "directory for compilation artifacts (with `TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS=1`)")
PRESERVE_ARTIFACTS = _compile("TORCH_NEURONX_PRESERVE_COMPILATION_ARTIFACTS", bool, False,
                              "`1`: keep graphs, kernel plans and generated code in the debug dir")
CACHE_DIR = _compile("TORCH_NEURONX_NEFF_CACHE_DIR", str, None, "persistent compile cache directory")
CACHE_DISABLED = _compile("TORCH_NEURONX_NEFF_DISABLE_CACHE", bool, False, "`1`: no persistent compile cache")
CACHE_LOCK_TIMEOUT = _compile("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT", float, 600.0,
                              "seconds to wait for another process compiling the same graph")
XDG_CACHE_HOME = _compile("XDG_CACHE_HOME", str, None, "base of the default compile cache directory")
RANK = _compile("RANK", str, "0", "names per-rank subdirectories of the debug dir")
INDUCTOR_CACHE_DIR = _compile("TORCHINDUCTOR_CACHE_DIR", str, None,
                              "Inductor's own variable: pointed into the compile cache while a graph compiles, then "
                              "restored")

VARIABLES: tuple[EnvVar, ...] = (
    FALLBACK_DISABLED, AUTOCOPY_DISABLED, DEBUG_DIR, PRESERVE_ARTIFACTS, CACHE_DIR, CACHE_DISABLED,
    CACHE_LOCK_TIMEOUT, XDG_CACHE_HOME, RANK, INDUCTOR_CACHE_DIR,
)
