"""``neuronxcc``: only the legacy NKI 0.1 API (``neuronxcc.nki``), running on the ``nki`` simulator core.

The real package is the Neuron compiler; here it exists so that public kernels written for Neuron 2.20–2.27
(``from neuronxcc import nki``; ``import neuronxcc.nki.language as nl``) run unchanged on the CPU simulator.
"""

__version__ = "2.27.0+sim"
