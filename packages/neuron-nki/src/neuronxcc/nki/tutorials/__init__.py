"""Our ports of the classic NKI 0.1 tutorial kernels, written against the legacy ``neuronxcc.nki`` API the way the
public tutorials are (``nl.arange``/``nl.mgrid`` indexing, ``mask=``, ``nl.par_dim``, SPMD grids). Each module's
kernels are checked against NumPy in ``tests/legacy/test_tutorials.py``."""
