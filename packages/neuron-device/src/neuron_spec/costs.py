"""The cost model's named parameters: AWS's documented per-instruction figures and the few fitted ones.

Why one module: the NKI instruction model (``nki._cost``), the eager and compiled op costs
(``neuron_device.costmodel``) and the collectives (``neuron_distributed.costs``) price the same chip, so they read
the same figures. Each figure says where it comes from; the fitted ones name the calibration points they were
fitted on (``shared/calibration.md`` §3, run by ``benchmarks/calibration.py``; ``docs/simulated-time.md`` has the
table). No parameter belongs to one model or kernel.
"""

from __future__ import annotations

__all__ = [
    "ACCESS_CYCLES",
    "DEPENDENT_STALL_CYCLES",
    "DMA_PARTITIONS_PER_ENGINE",
    "DMA_QUEUE_HEAD_NS",
    "DMA_ROW_NS",
    "EAGER_LAUNCH_SECONDS",
    "LOAD_STATIONARY_RATIO",
    "MATMUL_MOVING_FMAX",
    "MIN_II",
    "PE_SIZE",
    "STRIDE_PENALTY_BYTES",
]

# -- documented (SDK@2.23 general/nki/api/nki/isa/__init__.py; SDK@HEAD nki/deep-dives/nki_perf_guide.rst) ----------
PE_SIZE = 128  # the Tensor engine's systolic array is 128 x 128; stationary tiles have at most 128 columns
MATMUL_MOVING_FMAX = 512  # moving free size of one matmul pass (fp32 PSUM bank)
MIN_II = 64  # minimum initiation interval of a compute instruction, engine cycles
ACCESS_CYCLES = 60  # fixed cost of each SBUF/PSUM tensor access of a Vector/Scalar/GpSimd instruction
STRIDE_PENALTY_BYTES = 16  # a minor-dimension stride above this halves SBUF/PSUM bandwidth
LOAD_STATIONARY_RATIO = 4  # LoadStationary is ~4x faster than a matmul of the same free size
DMA_PARTITIONS_PER_ENGINE = 8  # a transfer is split into packets, one per DMA engine per group of partitions

# -- fitted ------------------------------------------------------------------------------------------------------
# K8: dependent 1-element Scalar activations issue every 189 ns = 264 cycles on NC-v2 = 64 + 2 x 60 + this.
DEPENDENT_STALL_CYCLES = 80
# K1 (the matmul tutorial's tiled, hoisted and blocked-free kernels on trn1, which are DMA-bound): a DMA queue
# keeps one transfer in flight, and each pays this head latency (descriptor fetch, semaphores, packet set-up)...
DMA_QUEUE_HEAD_NS = 750.0
# ... and this per partition row (one descriptor each): 256 B rows then run at ~40 % of an engine's bandwidth,
# 2 KiB rows at ~85 %, 4 KiB at ~92 % (the DMA guide: < 256 B overhead-bound, >= 2 KiB near peak).
DMA_ROW_NS = 22.0
# The eager runtime's cost of launching one op's kernel (instruction stream, semaphores), beside its DMA and
# compute. No public figure exists for TorchNeuron eager per-op costs (calibration.md); assumption, kept at the
# previous model's 2 us launch.
EAGER_LAUNCH_SECONDS = 2.0e-6
