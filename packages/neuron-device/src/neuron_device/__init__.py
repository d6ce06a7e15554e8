"""neuron-device: the `neuron` PyTorch device (AWS Trainium) on a NeuronCore simulator running on the host CPU.

`import torch` registers the device through the `torch.backends` entry point (`_autoload`); with
`TORCH_DEVICE_BACKEND_AUTOLOAD=0`, `import neuron_device` or `import torch_neuronx` registers it.

Where each concept lives (one file per runtime concept, as PyTorch's OpenReg does):

====================== ==============================================================================================
start-up               `_registration` (the phases of `register()`), `hooks` (PrivateUse1 hooks),
                       `environment` (start-up checks of the environment), `neuron/_lazy` (lazy init, fork rule)
device, guard, index   `device` (current device per thread, `set_device`, `device`/`device_of`, `NeuronGuard`)
machine and figures    `topology` (this process's machine), the hardware spec `neuron_spec.hardware` / `.machine`
memory                 `allocator` (caching allocator per device, HBM capacity, stats), `storage` (adopting CPU
                       memory as device storage, host aliases)
streams and clocks     `neuron/streams` (`Stream`, `Event`), `timeline` (a simulated clock per stream)
compile time           `compile_time` (a compiler's work on the device charges no time, ledger entry or memory)
random numbers         `neuron/random` (one generator per device; CUDA's (seed, offset) state), `ops/seeded` (how a
                       random op runs on its device's generator)
kernels                `ops/registry` (registration), `ops/catalogue` (engine and work per op), `ops/call` (the
                       record of each op overload that every path reads, the common call's argument walk),
                       `ops/minimal`, `ops/matmul`, `ops/attention`, `ops/flex_attention`, `ops/rnn_cells`,
                       `ops/cpu_exact` (kernels), `ops/fastpath` (the direct call of common ops)
CPU fallback           `fallback` (the policy: which ops fall back, `NEURON_FALLBACK_ENABLED`; the boxed run of any
                       op on host aliases)
simulated cost         `simulation/costmodel` (an op's device time), `simulation/ledger` (the op ledger: charging,
                       compile cache, counters, `executed_ops`), `simulation/planned` (plan mode's charges), `simulation/report`,
                       `simulation/profiler`
adaptive eager         `barrier` (the flush barrier: a leaf the lowest modules call), `adaptive_eager/queue`
                       (queue and fusion)
numerics, autocast     `numerics` (the policy), `ops/host_numerics` (its host execution: 64-bit ops in 32 bits,
                       IEEE float32 host matmuls), `autocast`, `neuron/amp`
torch.neuron           `neuron/` (the `torch.cuda`-shaped facade), `neuron/memory`, `neuron/comm`, `neuron/legacy` (FloatTensor, …)
patches of torch       `_patches` (each with its reason)
environment variables  `envvars` (declared once; parser in `neuron_spec.env`)
other wheels           `plugins` (hooks they implement), `services` (all they may import of this package), `memos`
                       (a plugin's costly estimates, handed back by a forked planned rank to its zygote), `exits`
                       (a process's own cleanups, run at its end, a forked child's `os._exit` too)
command-line tools     `cli` (`neuron-ls`), `monitor` (`neuron-monitor`, `neuron-top`), `livestats` (the counters a
                       process publishes for them), `progress` (one-line progress of long operations)
====================== ==============================================================================================
"""

from __future__ import annotations

__version__ = "0.1.0"


def _autoload() -> None:
    """Entry point called by `import torch`. torch is half-imported here, so only the registration runs."""
    register()


def register() -> None:
    """Register the `neuron` device (idempotent)."""
    from ._registration import register as _register

    _register()


# Importing torch first lets its autoload run `register()` while torch is half-imported, as it does when torch is
# imported first; registering from here, before `import torch` finished, would re-enter our half-run modules.
import torch  # noqa: E402, F401

register()
