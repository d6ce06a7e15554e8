"""Our ports of the classic NKI tutorial kernels to the current API (tested against NumPy in tests/)."""
