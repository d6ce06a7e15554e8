"""Ports of the public NKI tutorial kernels that ``benchmarks/calibration.py`` prices against AWS's measurements.

Written from the tutorials' text (legacy ``neuronxcc.nki`` API, the way the tutorials are), keeping each kernel's
loop structure, tile sizes and memory placement, since those decide what the chip does and what it costs.
"""
