"""The `neuron` kernels: `registry` (how a kernel joins the dispatcher), `catalogue` (which engine runs each op and
its work), `call` (the record of each overload every path reads, and the common call's argument walk), the kernels
themselves (`minimal`, `matmul`, `attention`, `rnn_cells`, `cpu_exact`) and `fastpath` (the
direct call of common ops). Everything without a kernel goes to the CPU fallback (`neuron_device.fallback`)."""
