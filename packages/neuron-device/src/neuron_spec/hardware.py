"""Every hardware figure of every Trainium target and instance the simulator knows, with its source.

The one table: the device's topology and cost model (``neuron_device``), the NKI simulator's limits and costs
(``nki``), compiled-graph estimates (``neuron_compile``) and collective times (``neuron_distributed``) all read it.
NumPy- and torch-free on purpose: the ``nki`` core imports it and stays NumPy-only.

Sources (``shared/calibration.md`` §1 and ``shared/reference/hardware.md`` in the project, both citing the AWS
Neuron SDK docs): per-core figures from the NKI architecture guides (``nki/guides/architecture/
trainium_inferentia2_arch.rst``, ``trainium2_arch.rst``, ``trainium3_arch.rst``), chip and instance figures from
``about-neuron/arch/neuron-hardware/trn{1,2,3}-arch.rst``, DMA figures from ``nki/deep-dives/
nki-dma-bandwidth-guide.rst``. Each field's comment says where its value comes from; "assumption" marks the figures
no reference gives.

Target names and aliases (the same in every wheel): ``trn1`` (also ``inf2``, ``gen2``: NeuronCore-v2), ``trn2``
(``gen3``: NeuronCore-v3), ``trn3`` (``gen4``: NeuronCore-v4).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ALIASES",
    "DEFAULT_TARGET",
    "INSTANCE_TYPES",
    "TARGETS",
    "Instance",
    "Target",
    "resolve_target",
]

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

PARTITIONS = 128  # SBUF/PSUM partitions and Tensor-engine rows, every generation (architecture guides)
DMA_FIXED_NS = 1300.0  # semaphore-to-start cost of one DMA, every generation (nki-dma-bandwidth-guide.rst)


@dataclass(frozen=True)
class Target:
    """Figures of one Trainium generation: per physical NeuronCore unless the name says per chip.

    Engine rates are lanes x clock; "narrow" lanes apply to the dtypes named in the matching ``*_narrow_dtypes``
    (dtype names as torch and NumPy spell them, so this module needs neither).
    """

    name: str  # trn1 / trn2 / trn3
    nc_version: int  # 2 / 3 / 4 (NeuronCore-vN)
    physical_cores_per_chip: int
    default_lnc: int  # physical cores per logical core unless NEURON_LOGICAL_NC_CONFIG says otherwise
    lnc_options: tuple[int, ...]
    hbm_bytes_per_chip: int
    hbm_bandwidth_per_chip: float  # bytes/s
    # Tensor engine (128 x 128 PE array)
    tensor_ghz: float
    tensor_tflops_bf16: float
    tensor_tflops_fp32: float
    tensor_tflops_fp8: float
    moving_fmax: int  # nc_matmul moving free size limit (fp32 dst)
    pe_tile_rows: tuple[int, ...]  # supported PE row tile sizes
    # Vector, Scalar, GpSimd engines
    vector_ghz: float
    vector_lanes: int  # elements/cycle for 32-bit types
    vector_narrow_lanes: int
    vector_narrow_dtypes: frozenset[str]
    scalar_ghz: float
    scalar_lanes: int
    scalar_narrow_lanes: int
    scalar_narrow_dtypes: frozenset[str]
    gpsimd_ghz: float
    gpsimd_lanes: int
    # On-chip memories (per partition)
    sbuf_partition_bytes: int
    psum_partition_bytes: int
    psum_bank_bytes: int
    psum_num_banks: int
    # DMA
    dma_engines: int
    dma_bytes_per_ns_per_engine: float
    dma_fixed_ns: float  # semaphore-to-start latency of one DMA
    # Links
    neuronlink_bytes_per_second: float  # chip-to-chip, per chip
    host_link_bytes_per_second: float  # host memory <-> one device

    @property
    def core_version(self) -> str:
        """``v2`` / ``v3`` / ``v4``, as neuron-ls prints it."""
        return f"v{self.nc_version}"

    @property
    def sbuf_bytes(self) -> int:
        return PARTITIONS * self.sbuf_partition_bytes

    @property
    def hbm_bytes_per_second_per_core(self) -> float:
        """One physical core's share of the chip's HBM bandwidth (trn2: 2.9 TB/s / 8 = 362.5 GB/s)."""
        return self.hbm_bandwidth_per_chip / self.physical_cores_per_chip

    @property
    def hbm_bytes_per_ns(self) -> float:
        """The same share in bytes per nanosecond (the NKI cost model's unit)."""
        return self.hbm_bytes_per_second_per_core / 1e9


_16BIT = frozenset({"bfloat16", "float16"})
_8BIT = frozenset({"float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3"})

TARGETS: dict[str, Target] = {
    # trainium_inferentia2_arch.rst; trn1-arch.rst (2 cores, 32 GiB at 820 GB/s, NeuronLink-v2 384 GB/s per chip).
    # Vector 128 lanes at 1.12 GHz, Scalar 128 at 1.4 GHz, GpSimd 8 cores x 16 fp32 lanes at 1.4 GHz.
    # DMA 16 engines x 17 B/ns (DMA guide), ~1.3 us fixed.
    "trn1": Target(
        name="trn1", nc_version=2, physical_cores_per_chip=2, default_lnc=1, lnc_options=(1,),
        hbm_bytes_per_chip=32 * GiB, hbm_bandwidth_per_chip=0.82e12,
        tensor_ghz=2.8, tensor_tflops_bf16=92.0, tensor_tflops_fp32=23.0, tensor_tflops_fp8=92.0,
        moving_fmax=512, pe_tile_rows=(128, 64),
        vector_ghz=1.12, vector_lanes=128, vector_narrow_lanes=128, vector_narrow_dtypes=frozenset(),
        scalar_ghz=1.4, scalar_lanes=128, scalar_narrow_lanes=128, scalar_narrow_dtypes=frozenset(),
        gpsimd_ghz=1.4, gpsimd_lanes=128,
        sbuf_partition_bytes=192 * KiB, psum_partition_bytes=16 * KiB, psum_bank_bytes=2 * KiB, psum_num_banks=8,
        dma_engines=16, dma_bytes_per_ns_per_engine=17.0, dma_fixed_ns=DMA_FIXED_NS,
        neuronlink_bytes_per_second=384e9,
        host_link_bytes_per_second=32e9,  # assumption: PCIe Gen4 x16 (no AWS figure in our references)
    ),
    # trainium2_arch.rst; trn2-arch.rst (8 cores, LNC=2 default, 96 GiB at 2.9 TB/s, NeuronLink-v3 1.28 TB/s).
    # Vector 512 bf16/fp16 or 256 other elem/cycle at 0.96 GHz, Scalar 128 at 1.2 GHz, GpSimd 1.2 GHz.
    "trn2": Target(
        name="trn2", nc_version=3, physical_cores_per_chip=8, default_lnc=2, lnc_options=(1, 2),
        hbm_bytes_per_chip=96 * GiB, hbm_bandwidth_per_chip=2.9e12,
        tensor_ghz=2.4, tensor_tflops_bf16=79.0, tensor_tflops_fp32=20.0, tensor_tflops_fp8=158.0,
        moving_fmax=512, pe_tile_rows=(128, 64, 32),
        vector_ghz=0.96, vector_lanes=256, vector_narrow_lanes=512, vector_narrow_dtypes=_16BIT,
        scalar_ghz=1.2, scalar_lanes=128, scalar_narrow_lanes=128, scalar_narrow_dtypes=frozenset(),
        gpsimd_ghz=1.2, gpsimd_lanes=128,
        sbuf_partition_bytes=224 * KiB, psum_partition_bytes=16 * KiB, psum_bank_bytes=2 * KiB, psum_num_banks=8,
        dma_engines=16, dma_bytes_per_ns_per_engine=23.0, dma_fixed_ns=DMA_FIXED_NS,
        neuronlink_bytes_per_second=1.28e12,
        host_link_bytes_per_second=64e9,  # assumption: PCIe Gen5 x16
    ),
    # trainium3_arch.rst; trn3-arch.rst (8 cores, 144 GiB at 4.9 TB/s — one guide says 4.7 —, NeuronLink-v4
    # 2.56 TB/s). Vector 512 (16/8-bit) or 256 at 1.2 GHz, Scalar 256 (16/8-bit) or 128 at 1.2 GHz, GpSimd 128 at
    # 1.2 GHz; SBUF 32 MiB = 128 x 256 KiB; DMA 16 x 33 B/ns.
    "trn3": Target(
        name="trn3", nc_version=4, physical_cores_per_chip=8, default_lnc=2, lnc_options=(1, 2),
        hbm_bytes_per_chip=144 * GiB, hbm_bandwidth_per_chip=4.9e12,
        tensor_ghz=2.4, tensor_tflops_bf16=79.0, tensor_tflops_fp32=20.0, tensor_tflops_fp8=315.0,
        moving_fmax=4096, pe_tile_rows=(128, 64, 32),
        vector_ghz=1.2, vector_lanes=256, vector_narrow_lanes=512, vector_narrow_dtypes=_16BIT | _8BIT,
        scalar_ghz=1.2, scalar_lanes=128, scalar_narrow_lanes=256, scalar_narrow_dtypes=_16BIT | _8BIT,
        gpsimd_ghz=1.2, gpsimd_lanes=128,
        sbuf_partition_bytes=256 * KiB, psum_partition_bytes=16 * KiB, psum_bank_bytes=2 * KiB, psum_num_banks=8,
        dma_engines=16, dma_bytes_per_ns_per_engine=33.0, dma_fixed_ns=DMA_FIXED_NS,
        neuronlink_bytes_per_second=2.56e12,
        host_link_bytes_per_second=64e9,  # assumption: PCIe Gen5 x16
    ),
}

DEFAULT_TARGET = "trn2"  # what TorchNeuron targets; the simulated device's default

# Other names of the targets (NKI's ``gen*`` NeuronCore generations; Inferentia2 has trn1's NeuronCore-v2).
ALIASES: dict[str, str] = {"inf2": "trn1", "gen2": "trn1", "gen3": "trn2", "gen4": "trn3"}
TARGET_FORMS = "trn1 (also inf2, gen2), trn2 (gen3) or trn3 (gen4)"


def resolve_target(name: str) -> Target:
    """The target called `name` or one of its aliases (case-insensitive); ValueError for an unknown name."""
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in TARGETS:
        raise ValueError(f"unknown NeuronCore target {name!r}; expected {TARGET_FORMS}")
    return TARGETS[key]


@dataclass(frozen=True)
class Instance:
    """An EC2 instance type: its chips, how they are linked, its network, and (when cited) its price."""

    name: str
    target: str
    chips: int
    efa_gbps: float | None  # EFA network bandwidth of the instance; None when our references give none
    chip_topology: str  # how the chips are linked
    # On-demand price in US dollars per hour. None: no price is cited in our references yet; a cost report asks
    # for it through `price_per_hour`, which refuses rather than guessing.
    usd_per_hour: float | None = None

    def price_per_hour(self) -> float:
        """The cited on-demand price (US dollars per hour); RuntimeError when none is recorded."""
        if self.usd_per_hour is None:
            raise RuntimeError(f"no price is recorded for {self.name}: add it, with its source, to neuron_spec.hardware")
        return self.usd_per_hour


# From calibration.md §1 and hardware.md (trn{1,2}-arch.rst): trn1.32xlarge 16 chips, EFA 800 Gbps (trn1n 1,600);
# trn2.48xlarge 16 chips in a 4x4 torus, EFAv3 3,200 Gbps; the 1-chip sizes from AWS's instance pages.
INSTANCE_TYPES: dict[str, Instance] = {
    "trn1.2xlarge": Instance("trn1.2xlarge", "trn1", 1, None, "single chip"),
    "trn1.32xlarge": Instance("trn1.32xlarge", "trn1", 16, 800.0, "2D torus"),
    "trn1n.32xlarge": Instance("trn1n.32xlarge", "trn1", 16, 1600.0, "2D torus"),
    "trn2.3xlarge": Instance("trn2.3xlarge", "trn2", 1, None, "single chip"),
    "trn2.48xlarge": Instance("trn2.48xlarge", "trn2", 16, 3200.0, "4x4 torus"),
    "trn2u.48xlarge": Instance("trn2u.48xlarge", "trn2", 16, 3200.0, "4x4 torus (UltraServer node)"),
}
