"""@nki.jit kernels called with torch tensors: neuron and CPU, outputs, in-place writes, dtypes, device time."""

from __future__ import annotations

import collections

import pytest
import torch

import nki
import nki.isa as nisa
import nki.language as nl
import torch_neuronx
from neuron_device import timeline
from nki.torch import adapter, kernel_log, record_launches, to_numpy


@nki.jit
def add_kernel(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    s = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=s, data1=nl.load(a), data2=nl.load(b), op=nl.add)
    nl.store(out, s)
    return out


@nki.jit
def sin_kernel(x, out):
    s = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.activation(dst=s, op=nl.sin, data=nl.load(x))
    nl.store(out, s)


@pytest.mark.parametrize("device", ["neuron", "cpu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_returned_outputs_on_the_callers_device(device: str, dtype: torch.dtype) -> None:
    a = torch.randn(128, 96, dtype=dtype)
    b = torch.randn(128, 96, dtype=dtype)
    out = add_kernel(a.to(device), b.to(device))
    assert out.device.type == device and out.dtype == dtype and out.shape == a.shape
    torch.testing.assert_close(out.cpu(), a + b)


def test_in_place_write_lands_in_the_callers_neuron_tensor() -> None:
    x = torch.randn(64, 32)
    out = torch.zeros(64, 32, device="neuron")
    sin_kernel(x.to("neuron"), out)
    torch.testing.assert_close(out.cpu(), x.sin(), atol=1e-5, rtol=1e-5)


def test_strided_view_is_zero_copy() -> None:
    t = torch.randn(8, 16, device="neuron").t()
    view = to_numpy(t)
    assert view.shape == (16, 8) and view.strides == (4, 64)
    view[0, 0] = 42.0
    assert t[0, 0].item() == 42.0


def test_launch_is_charged_to_the_current_stream_and_tracked() -> None:
    a = torch.randn(128, 64, device="neuron")
    torch_neuronx.clear_op_tracking()
    stream = torch_neuronx.Stream()
    line = timeline.timeline(0)
    with torch_neuronx.stream(stream), record_launches() as launches:
        start = line.ready(stream.stream_id)
        default_before = line.clocks.get(0, 0.0)
        add_kernel(a, a)
    assert [launch.name for launch in launches] == ["nki::add_kernel"]
    assert launches[0].latency_ns > 0
    assert line.clocks[stream.stream_id] == pytest.approx(start + launches[0].latency_ns * 1e-9)
    assert line.clocks.get(0, 0.0) == default_before  # nothing charged to the default stream
    assert "nki::add_kernel" in torch_neuronx.get_executed_ops()


def test_kernel_log_keeps_the_newest_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long eager run must not grow the process-wide log without bound; `record_launches` still sees every one."""
    assert adapter._all_launches.maxlen == adapter.KERNEL_LOG_SIZE
    monkeypatch.setattr(adapter, "_all_launches", collections.deque(maxlen=3))
    a = torch.randn(128, 8, device="neuron")
    with record_launches() as launches:
        for _ in range(5):
            add_kernel(a, a)
    assert len(launches) == 5
    assert kernel_log() == launches[-3:]


def test_mixed_devices_are_rejected() -> None:
    with pytest.raises(RuntimeError, match="one device"):
        add_kernel(torch.ones(128, 4, device="neuron"), torch.ones(128, 4))
