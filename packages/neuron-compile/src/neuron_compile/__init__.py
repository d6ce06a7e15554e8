"""neuron-compile: the graph compiler behind `torch.compile(backend="neuron")` for the simulated Trainium device.

Dynamo -> AOTAutograd (forward and backward) with the Neuron decomposition table -> Neuron FX passes (kernel
partitioning and fusion, NKI kernel substitution) -> Inductor's C++ host codegen registered for the `neuron` device.
Modules: `backend` (the Dynamo backend and TorchNeuron's contract), `compiler` (the pipeline), `inductor_device`
(Inductor/Dynamo registration of `neuron`), `host_runtime` (what generated code calls), `passes`, `nki_substitution`,
`decompositions`, `cache` (persistent compile cache), `artifacts` (debug dumps), `metrics`, `settings` (env vars),
`runtime` (the compiled callable), `plugin` (the `neuron_device.plugins` hooks).

Importing this package stays light: the torch._dynamo / torch._inductor parts load when a graph is compiled.
"""

__version__ = "0.1.0"
