"""`torch.neuron.amp`: `torch.cuda.amp`'s twin, so scripts written against that module run after "cuda" becomes
"neuron". Deprecated as `torch.cuda.amp` is: each name warns and points to `torch.amp` with device "neuron".

`autocast()` without a dtype takes the device's autocast dtype (bfloat16 on `neuron`, see `neuron_device.autocast`),
as `torch.cuda.amp.autocast()` takes CUDA's float16.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch

__all__ = ["GradScaler", "autocast", "custom_bwd", "custom_fwd"]

_DEVICE = "neuron"


def _deprecated(name: str, replacement: str) -> None:
    warnings.warn(f"`torch.neuron.amp.{name}(args...)` is deprecated. Please use `{replacement}` instead.",
                  FutureWarning, stacklevel=3)


class autocast(torch.amp.autocast_mode.autocast):
    """See `torch.autocast`. Deprecated: use `torch.amp.autocast("neuron", args...)`."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype | None = None, cache_enabled: bool = True) -> None:
        _deprecated("autocast", "torch.amp.autocast('neuron', args...)")
        super().__init__(_DEVICE, enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """See `torch.amp.GradScaler`. Deprecated: use `torch.amp.GradScaler("neuron", args...)`."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        _deprecated("GradScaler", "torch.amp.GradScaler('neuron', args...)")
        super().__init__(
            _DEVICE,
            init_scale=init_scale,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            enabled=enabled,
        )


def custom_fwd(fwd: Callable | None = None, *, cast_inputs: torch.dtype | None = None) -> Callable:
    """See `torch.amp.custom_fwd`, with `device_type="neuron"`."""
    _deprecated("custom_fwd", "torch.amp.custom_fwd(args..., device_type='neuron')")
    return functools.partial(torch.amp.custom_fwd, device_type=_DEVICE)(fwd=fwd, cast_inputs=cast_inputs)


def custom_bwd(bwd: Callable) -> Callable:
    """See `torch.amp.custom_bwd`, with `device_type="neuron"`."""
    _deprecated("custom_bwd", "torch.amp.custom_bwd(args..., device_type='neuron')")
    return functools.partial(torch.amp.custom_bwd, device_type=_DEVICE)(bwd)
