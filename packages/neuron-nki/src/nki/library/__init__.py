"""The NKI kernel library (current API, torch-free): flash attention forward/backward, RMSNorm, LayerNorm,
softmax and matmul. ``nki.torch.native`` makes them the ``neuron`` kernels of the matching aten ops."""
