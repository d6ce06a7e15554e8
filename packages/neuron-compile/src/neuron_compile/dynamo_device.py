"""Teach Dynamo the `neuron` device: its device interface (device selection, counts, streams) and the patches of
Dynamo's tracing that `neuron` needs (`_patches`). This is what `torch.compile(backend="neuron")` needs before Dynamo
traces anything; Inductor's code generation for `neuron` is registered apart (`inductor_device`), only when a graph
is lowered by Inductor, so the default "aten" host code never imports it.

This module imports `torch._dynamo`; it is imported lazily (never during `import torch`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch._dynamo.device_interface import CpuInterface, register_interface_for_device

from . import _patches

__all__ = ["NeuronInterface", "register", "register_once"]

DEVICE = _patches.DEVICE


class NeuronInterface(CpuInterface):
    """Dynamo's view of the device. `CpuInterface` supplies what Inductor asks of a host-memory device (properties
    with a processor count, a host-timed Event); device selection and counts come from `torch.neuron`."""

    class Worker(CpuInterface.Worker):
        @staticmethod
        def current_device() -> int:
            return torch.neuron.current_device()

    @staticmethod
    def current_device() -> int:
        return torch.neuron.current_device()

    @staticmethod
    def set_device(device: Any) -> None:
        torch.neuron.set_device(device)

    @staticmethod
    def device_count() -> int:
        return torch.neuron.device_count()

    @staticmethod
    def synchronize(device: Any = None) -> None:
        torch.neuron.synchronize(device)


def register_once(function: Callable[[], None]) -> Callable[[], None]:
    """`function` run once per process, thread-safe: registering a device with Dynamo or Inductor is global and must
    not run twice (two threads compiling at once); a registration that raised runs again on the next call."""
    lock = threading.Lock()
    done = False

    @functools.wraps(function)
    def run_once() -> None:
        nonlocal done
        if done:
            return
        with lock:
            if not done:
                function()
                done = True

    return run_once


@register_once
def register() -> None:
    """Register `neuron` with Dynamo (idempotent, thread-safe)."""
    register_interface_for_device(DEVICE, NeuronInterface)
    for index in range(torch.neuron.device_count()):
        register_interface_for_device(f"{DEVICE}:{index}", NeuronInterface)
    _patches.register_stream_functions()
    _patches.lazy_trace_log_headers()
    _patches.linear_guard_cse()
    _patches.source_clone_keeps_unchanged_sources()
