"""`repr`/`str` of `neuron` tensors, parameters, storages and modules: the same text as on CPU plus the device.

Printing reads device memory through many small ops (summaries, slicing, `item`), so each check runs in a process
of its own: a crash is a test failure, not a dead session."""

from __future__ import annotations

from crash_support import run_checked

# Compares repr(neuron tensor), with its device suffix removed, to repr of the same values on CPU.
_SAME_AS_CPU = """
    import re
    import torch

    def same_as_cpu(cpu, device="neuron:0"):
        on_device = cpu.to(device)
        text = repr(on_device)
        assert f"device='{device}'" in text, text
        stripped = re.sub(r",\\s*device='" + device + "'", "", text)
        assert " ".join(stripped.split()) == " ".join(repr(cpu).split()), (text, repr(cpu))
        assert str(on_device) == text
"""


_DTYPES = (
    "float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool",
    "complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64",
)


def test_every_dtype_prints_like_cpu():
    run_checked(_SAME_AS_CPU + f"""
    for name in {_DTYPES!r}:
        dtype = getattr(torch, name)
        values = torch.tensor([[0.0, 1.5, -2.25], [3.0, 100.0, 0.125]])
        if dtype.is_complex:
            values = torch.complex(values, -values)
        if dtype == torch.bool:
            cpu = values > 1
        elif name.startswith("uint"):
            cpu = values.abs().to(torch.int64).to(dtype)
        else:
            cpu = values.to(dtype)
        same_as_cpu(cpu)
        same_as_cpu(cpu[0, 1])  # 0-dim
        same_as_cpu(cpu[:0])  # empty
        same_as_cpu(cpu, "neuron:2")
    """)


def test_special_values_and_layouts_print_like_cpu():
    run_checked(_SAME_AS_CPU + """
    same_as_cpu(torch.tensor([float("nan"), float("inf"), -float("inf"), 1e-30, 1e30]))
    same_as_cpu(torch.tensor([1e-8, 1.0]))  # scientific notation
    same_as_cpu(torch.tensor(7))
    same_as_cpu(torch.empty(0, 3))  # size=(0, 3) suffix
    same_as_cpu(torch.arange(24.0).reshape(2, 3, 4).transpose(0, 2))  # non-contiguous
    same_as_cpu(torch.arange(10.0)[::3])
    same_as_cpu(torch.tensor([1 + 2j, 3 - 4j]).conj())
    same_as_cpu(torch.randn(3, 3, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16))
    """)


def test_huge_tensors_are_summarised():
    run_checked(_SAME_AS_CPU + """
    big = torch.arange(4_000_000, dtype=torch.float32).reshape(2000, 2000)
    same_as_cpu(big)
    assert "..." in repr(big.to("neuron"))
    same_as_cpu(torch.arange(5000))
    same_as_cpu(torch.ones(1001, dtype=torch.bool))
    same_as_cpu((torch.arange(2000.0) + 1j).to(torch.complex64))
    """)


def test_autograd_tensors_parameters_and_modules_print():
    run_checked("""
    import torch
    x = torch.ones(2, device="neuron", requires_grad=True)
    assert repr(x) == "tensor([1., 1.], device='neuron:0', requires_grad=True)"
    y = x * 2
    assert repr(y) == "tensor([2., 2.], device='neuron:0', grad_fn=<MulBackward0>)"
    p = torch.nn.Parameter(torch.zeros(2, device="neuron:1"))
    assert repr(p) == "Parameter containing:\\ntensor([0., 0.], device='neuron:1', requires_grad=True)"
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2), torch.nn.Linear(3, 1))
    cpu_text = repr(model)
    model.to("neuron")
    assert repr(model) == cpu_text
    text = str(list(model.parameters()))
    assert text.count("device='neuron:0'") == 6
    state = repr(model.state_dict())
    assert "running_mean" in state and "num_batches_tracked" in state
    """)


def test_storages_print():
    run_checked("""
    import warnings
    import torch
    warnings.simplefilter("ignore")
    t = torch.tensor([1.0, 2.0], device="neuron:1")
    untyped = repr(t.untyped_storage())
    assert untyped.endswith("[torch.storage.UntypedStorage(device=neuron:1) of size 8]"), untyped
    assert untyped.split()[:8] == [str(b) for b in torch.tensor([1.0, 2.0]).untyped_storage().tolist()]
    typed = repr(t.storage())
    assert typed.split()[:2] == ["1.0", "2.0"] and "dtype=torch.float32, device=neuron:1" in typed, typed
    assert repr(torch.empty(0, device="neuron").untyped_storage()).endswith("of size 0]")
    """)
