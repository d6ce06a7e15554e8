"""torchtitan's trainer on the host CPU with Gloo: the reference the `neuron` runs are checked against.

torchtitan 0.2.2 has no CPU device: it trains on `torch._utils._get_available_device_type()`, or on "cuda" when that
finds no accelerator, and reads its memory statistics from the device module (`torch.cuda`'s API). This launcher,
run by torchrun in place of `-m torchtitan.train`, names "cpu" as the device before torchtitan is imported and gives
it a device module that is `torch.cpu` plus the calls torchtitan makes: the device's name and memory size from the
host, and no memory statistics (an empty `memory_stats()`, which torchtitan reports as -1). And Gloo has no
`PREMUL_SUM`, which FSDP2 reduce-scatters gradients with when torchtitan sets their divide factor to 1.0 (it divides
the loss by the global token count instead): FSDP2's `set_force_sum_reduction_for_comms` makes that the same plain
SUM. Nothing else changes: the same configuration, data loader, model, parallelisms, Gloo as the process group's
backend ("cpu" maps to it).
"""

from __future__ import annotations

import os
import platform
import sys
import types

import torch
import torch._utils


def _host_device_module() -> types.ModuleType:
    """`torch.cpu` with the device-module calls torchtitan makes of its accelerator."""
    module = types.ModuleType("torchtitan_host_device")
    module.__dict__.update({name: getattr(torch.cpu, name) for name in dir(torch.cpu) if not name.startswith("__")})
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    module.current_device = lambda: 0  # an index, as `torch.distributed.barrier(device_ids=...)` takes
    module.get_device_name = lambda device=None: platform.processor() or platform.machine()
    module.get_device_properties = lambda device=None: types.SimpleNamespace(total_memory=memory)
    module.memory_stats = lambda device=None: {}
    module.reset_peak_memory_stats = lambda device=None: None
    module.empty_cache = lambda: None
    return module


def _sum_reduction_on_gloo() -> None:
    """FSDP2 modules whose gradient divide factor is set reduce with SUM instead of `PREMUL_SUM(1 / factor)`."""
    from torch.distributed.fsdp import FSDPModule

    set_factor = FSDPModule.set_gradient_divide_factor

    def set_gradient_divide_factor(self: FSDPModule, factor: float) -> None:
        set_factor(self, factor)
        self.set_force_sum_reduction_for_comms(True)

    FSDPModule.set_gradient_divide_factor = set_gradient_divide_factor


def main() -> None:
    host = _host_device_module()
    torch._utils._get_available_device_type = lambda: "cpu"
    get_device_module = torch._utils._get_device_module
    torch._utils._get_device_module = lambda device_type: host if device_type == "cpu" else get_device_module(device_type)
    _sum_reduction_on_gloo()
    from torchtitan.train import Trainer
    from torchtitan.train import main as train

    sys.argv[0] = "torchtitan.train"
    train(Trainer)


if __name__ == "__main__":
    main()
