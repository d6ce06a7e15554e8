"""Simulation bookkeeping: what the chip would have done, beside the host execution that computes every result.

=============== ===================================================================================================
``costmodel``   an op's or kernel's device time: a roofline per engine plus a launch cost (`estimate_kernel`),
                from the hardware spec's figures (`neuron_spec.hardware`).
``ledger``      the op ledger: executed and fallback ops, kernels compiled per signature, each launch charged to
                the timeline (`charge`, `record_kernel`, `transfer`), compilation-cache counters; read by the
                report, the profiler, `torch_neuronx` and the live statistics (`launches`, `peek`, ...).
``report``      the simulation report (`torch_neuronx.simulation_report`, ``NEURON_SIM_REPORT`` at exit).
``profiler``    device rows of `torch.profiler` traces from the timeline (`NeuronProfiler`).
=============== ===================================================================================================
"""
