"""neuron-compile: the graph compiler behind `torch.compile(backend="neuron")` for the simulated Trainium device.

Dynamo -> AOTAutograd (forward and backward) with the Neuron decomposition table -> Neuron FX passes (kernel
partitioning and fusion, NKI kernel substitution) -> host code: the AOT graph's ATen CPU kernels ("aten", default)
or Inductor's C++ host codegen ("inductor").

================================= ================================================================================
the backend and its contract      `backend` (Dynamo backend), `settings` (mode, options, environment per compile),
                                  `dynamo_backend_api` (what `torch_neuronx.neuron_dynamo_backend` holds)
the pipeline                      `compiler`, `decompositions`, `passes` (kernel partitioning, fusion, cost of
                                  each fused kernel), `nki_substitution`, `rms_norm`, `rng`
Dynamo and Inductor for `neuron`  `dynamo_device` (Dynamo's device interface, at backend import),
                                  `inductor_device` (Inductor's codegen, only when Inductor lowers a graph),
                                  `_patches` (every patch of Dynamo/Inductor internals, with its reason),
                                  `layer_regions` (transformers' decoder layers traced once per kind),
                                  `aot_regions` (those regions kept through AOTAutograd, inlined after it)
running a compiled graph          `compiled_graph` (the callable Dynamo gets), `boundary` and `host_runtime`
                                  (device/host crossings; `host_runtime` is what generated code calls)
adaptive eager's fuser            `fuser`
cache, artifacts, metrics         `cache` (persistent compile cache), `output_code` (the "aten" host code as an
                                  `OutputCode`, which AOTAutograd's cache stores), `artifacts` (debug dumps),
                                  `metrics`
shape buckets                     `buckets` (`torch_neuronx.pad_to_buckets`: token inputs padded to a few shapes,
                                  masked, so serving many prompt lengths compiles one graph per bucket)
environment variables             `envvars`
joining the device                `plugin` (the `neuron_device.plugins` hooks; every Dynamo compile, any
                                  backend's, made compile time once Dynamo is imported); neuron-device is used
                                  through `neuron_device.services` only
================================= ================================================================================

Importing this package stays light: the torch._dynamo / torch._inductor parts load when a graph is compiled.
"""

__version__ = "0.1.0"
