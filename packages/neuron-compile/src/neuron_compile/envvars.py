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
CACHE_DISABLED = _compile("TORCH_NEURONX_DISABLE_NEFF_CACHE", bool, False,
                          "`1`: no persistent compile cache (TorchNeuron's name; `TORCH_NEURONX_NEFF_DISABLE_CACHE` "
                          "is an alias)")
CACHE_DISABLED_ALIAS = _compile("TORCH_NEURONX_NEFF_DISABLE_CACHE", bool, False,
                                "alias of `TORCH_NEURONX_DISABLE_NEFF_CACHE` (the name this project read first)")
RETAIN_DEVICE = _compile("TORCH_NEURONX_RETAIN_DEVICE_MODE", bool, False,
                         "`1`: a compiled graph called with CPU inputs returns CPU outputs (and copies in-place "
                         "changes back to its CPU inputs); mixing CPU and `neuron` inputs is then an error")
METRICS_ENABLED = _compile("TORCH_NEURONX_METRICS_ENABLED", bool, True,
                           "`0`: no per-graph compile records (`get_dynamo_metrics()` stays empty, no metric tables)")
METRIC_TABLES = _compile("TORCH_NEURONX_ENABLED_METRIC_TABLES", str, "",
                         "comma-separated metric tables written as CSV at exit, e.g. `graph_stats` "
                         "(`metric_table_graph_stats_rank{RANK}.csv`)")
METRICS_DIR = _compile("TORCH_NEURONX_METRICS_DIR", str, "/tmp", "directory of the metric-table CSV files")
CACHE_LOCK_TIMEOUT = _compile("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT", float, 600.0,
                              "seconds to wait for another process compiling the same graph")
XDG_CACHE_HOME = _compile("XDG_CACHE_HOME", str, None, "base of the default compile cache directory")
XDG_CONFIG_HOME = _compile("XDG_CONFIG_HOME", str, None,
                           "base of the directory of the compile cache's signing key (default `~/.config`)")
RANK = _compile("RANK", str, "0", "names per-rank subdirectories of the debug dir")
HOST_CODE = _compile("NEURON_COMPILE_HOST_CODE", str, "aten",
                     "host code of compiled graphs when `options` has no `host_code`: `aten` (default: the graph "
                     "runs its ATen CPU kernels, no C++ compiler, compiles in seconds) or `inductor` (Inductor's C++ "
                     "code generation: minutes to compile, faster host code for long runs)",
                     choices=("aten", "inductor"))
LAYER_REGIONS = _compile("NEURON_COMPILE_LAYER_REGIONS", bool, True,
                         "`0`: Dynamo traces every transformers decoder layer of a graph (default: a repeated layer is "
                         "traced once and its trace reused, `layer_regions`; the compiled graph is the same)")
AOT_REGIONS = _compile("NEURON_COMPILE_AOT_REGIONS", bool, True,
                       "`0`: nested compile regions are inlined before AOTAutograd (default: a graph whose regions "
                       "all qualify keeps them through AOTAutograd, which traces each region once per pass, and "
                       "inlines them after it, `aot_regions`; the compiled graph is the same)")
INDUCTOR_CACHE_DIR = _compile("TORCHINDUCTOR_CACHE_DIR", str, None,
                              "Inductor's own variable: pointed into the compile cache while a graph compiles, then "
                              "restored")

SHAPE_BUCKETS = _compile("TORCH_NEURONX_SHAPE_BUCKETS", str, None,
                         "buckets of `torch_neuronx.pad_to_buckets` when it is given none: `seq_len=` and/or `batch=` "
                         "a list or the powers of two in a range, separated by `;`, e.g. "
                         "`seq_len=pow2:16-2048;batch=1,2,4,8`")

# Documented TorchNeuron variables of the real compiler: accepted with a one-time note that they have no effect.
NO_EFFECT: tuple[EnvVar, ...] = (
    _compile("NEURON_CC_FLAGS", str, None, "accepted, no effect here: there is no neuronx-cc; graphs compile to host "
             "code (see NEURON_COMPILE_HOST_CODE)"),
    _compile("NEURON_COMPILER_OPT_LEVEL", str, None, "accepted, no effect here: there is no neuronx-cc to optimise"),
    _compile("TORCH_NEURONX_COMPLEX_DECOMPOSE", str, None, "accepted, no effect here: complex ops compile to the "
             "host's complex kernels, with the same results either way"),
    _compile("TORCH_NEURONX_NEURONX_CC_TIMEOUT", str, None, "accepted, no effect here: there is no neuronx-cc "
             "subprocess to time out"),
)

VARIABLES: tuple[EnvVar, ...] = (
    FALLBACK_DISABLED, AUTOCOPY_DISABLED, DEBUG_DIR, PRESERVE_ARTIFACTS, CACHE_DIR, CACHE_DISABLED,
    CACHE_DISABLED_ALIAS, CACHE_LOCK_TIMEOUT, XDG_CACHE_HOME, XDG_CONFIG_HOME, RANK, INDUCTOR_CACHE_DIR, RETAIN_DEVICE,
    METRICS_ENABLED, METRIC_TABLES, METRICS_DIR, HOST_CODE, LAYER_REGIONS, AOT_REGIONS,
    SHAPE_BUCKETS,
    *NO_EFFECT,
)
