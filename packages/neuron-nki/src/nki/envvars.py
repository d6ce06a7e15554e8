"""Every environment variable neuron-nki (``nki`` and the legacy ``neuronxcc.nki``) reads, declared once.

The target and logical-core variables (``NEURON_PLATFORM_TARGET_OVERRIDE``, ``NEURON_LOGICAL_NC_CONFIG``) are the
device's, declared and parsed by the hardware spec (`neuron_spec.machine`), so an alias means the same on both.
How to declare a variable and how values are parsed: `neuron_spec.env`. The docs table is checked against
`VARIABLES` (``tests/test_docs_env_vars.py``).
"""

from __future__ import annotations

from neuron_spec.env import EnvVar

NATIVE_KERNELS = EnvVar(
    "NEURON_NKI_NATIVE_KERNELS", str, "1",
    "the NKI kernel library as the native implementation of attention, norms, softmax: `1` (default) simulate "
    "each kernel once per call signature for its latency and return torch's CPU result; `simulate` run every call "
    "in the simulator; `0` off", owner="nki",
)
PRECISE_FP = EnvVar("NKI_PRECISE_FP", bool, True,
                    "`1` (default for `nki`): narrow float dtypes stored exactly; `0`: stored as fp32 (the legacy "
                    "`neuronxcc.nki` default unless set)", owner="nki")
SIMULATOR = EnvVar("NKI_SIMULATOR", bool, False,
                   "`1`: a kernel called with another framework's CPU arrays runs on the simulator through DLPack",
                   owner="nki")
DMA_TRANSPOSE_AS_PE_TRANSPOSE = EnvVar("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE", bool, False,
                                       "`true`: kernels see 7 PSUM banks instead of 8 (one is taken by DMA "
                                       "transposes)", owner="nki")

VARIABLES: tuple[EnvVar, ...] = (NATIVE_KERNELS, PRECISE_FP, SIMULATOR, DMA_TRANSPOSE_AS_PE_TRANSPOSE)
