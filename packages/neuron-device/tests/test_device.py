"""`torch.neuron` device management and the `neuron` device type, compared with what `torch.cuda` does."""

from __future__ import annotations

import sys

import pytest
import torch

import neuron_device


def test_registered_as_privateuse1():
    assert torch._C._get_privateuse1_backend_name() == "neuron"
    assert torch.get_device_module("neuron") is torch.neuron
    assert torch.device("neuron:1") == torch.device("neuron", 1)
    assert torch.device("privateuseone:0").type == "neuron"


def test_submodules_import_by_their_torch_names():
    """`import torch.neuron.memory` (as code imports `torch.cuda.memory`) gives the loaded module, not a second copy
    (which failed to import: its relative imports resolved against `torch`)."""
    import torch.neuron.amp
    import torch.neuron.comm
    import torch.neuron.memory
    import torch.neuron.random
    import torch.neuron.streams
    from torch.neuron.memory import memory_allocated

    assert torch.neuron.memory.memory_allocated is memory_allocated is torch.neuron.memory_allocated
    assert torch.neuron.streams.Stream is torch.neuron.Stream
    assert {torch.neuron.amp, torch.neuron.comm, torch.neuron.random} <= set(sys.modules.values())


def test_register_is_idempotent():
    neuron_device.register()
    neuron_device.register()
    assert torch.neuron.is_available()


def test_device_count_follows_target_topology():
    # trn2: 8 physical cores per chip, logical core size 2 by default -> 4 devices on one chip.
    assert torch.neuron.device_count() == 4


def test_properties_name_the_chip():
    props = torch.neuron.get_device_properties(0)
    assert props.name == "trn2"
    assert props.total_memory == 96 * 1024**3 // 4
    assert "trn2" in repr(props)
    assert torch.neuron.get_device_name(1) == "neuron:1"


def test_set_device_and_context_manager():
    assert torch.neuron.current_device() == 0
    with torch.neuron.device(2):
        assert torch.neuron.current_device() == 2
        assert torch.empty(1, device="neuron").device == torch.device("neuron:2")
        with torch.neuron.device("neuron:1"):
            assert torch.neuron.current_device() == 1
        assert torch.neuron.current_device() == 2
    assert torch.neuron.current_device() == 0
    torch.neuron.set_device("neuron:3")
    try:
        assert torch.neuron.current_device() == 3
    finally:
        torch.neuron.set_device(0)


def test_device_of_tensor():
    t = torch.ones(1, device="neuron:1")
    with torch.neuron.device_of(t):
        assert torch.neuron.current_device() == 1
    assert torch.neuron.current_device() == 0


@pytest.mark.parametrize("bad", [4, 99, "neuron:7"])
def test_invalid_index_is_a_clear_error(bad):
    with pytest.raises(RuntimeError, match="Invalid device index"):
        torch.neuron.set_device(bad)
    with pytest.raises(RuntimeError, match="Invalid device index"):
        torch.empty(2, device=torch.device(bad) if isinstance(bad, str) else torch.device("neuron", bad))


def test_wrong_device_type_rejected():
    with pytest.raises(ValueError, match="Expected a neuron device"):
        torch.neuron.set_device("cpu")


def test_tensor_methods_generated():
    t = torch.arange(4.0)
    n = t.neuron()
    assert n.is_neuron and not t.is_neuron
    assert n.device == torch.device("neuron:0")
    assert t.to("neuron:1").device == torch.device("neuron:1")
    assert torch.equal(n.cpu(), t)
    assert n.untyped_storage().is_neuron


def test_module_to_keeps_parameter_objects():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    params = list(model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model.to("neuron")
    assert [p is q for p, q in zip(params, model.parameters())] == [True] * len(params)
    assert all(p.device.type == "neuron" for p in model.parameters())
    assert all(b.device.type == "neuron" for b in model.buffers())
    before = [p.detach().cpu().clone() for p in params]
    # (y - 1)^2, not y^2: the batch-norm bias gradient of sum(y^2) is 0 up to rounding (the output has zero mean)
    model(torch.randn(5, 4, device="neuron")).sub(1).pow(2).sum().backward()
    optimizer.step()
    assert all(not torch.equal(b, p.detach().cpu()) for b, p in zip(before, model.parameters()))
    model.neuron(1)
    assert all(p.device == torch.device("neuron:1") for p in model.parameters())


def test_cross_device_ops_raise_like_cuda():
    a = torch.ones(3, device="neuron")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.ones(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.ones(3, device="neuron:1")
    # A 0-dim CPU tensor is a scalar, as on CUDA.
    assert torch.equal((a + torch.tensor(2.0)).cpu(), torch.full((3,), 3.0))


def test_amp_and_bf16_queries():
    assert torch.neuron.is_bf16_supported()
    assert torch.bfloat16 in torch.neuron.get_amp_supported_dtype()


def test_synchronize_validates_device():
    torch.neuron.synchronize()
    torch.neuron.synchronize("neuron:1")
    with pytest.raises(RuntimeError, match="Invalid device index"):
        torch.neuron.synchronize(9)


def test_accelerator_reports_neuron():
    assert torch.accelerator.current_accelerator().type == "neuron"
    assert torch.accelerator.device_count() == torch.neuron.device_count()
    assert torch.accelerator.is_available()


def test_current_device_starts_at_local_rank(python):
    result = python("import torch; print(torch.neuron.current_device())", env={"LOCAL_RANK": "2"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2"


def test_set_device_initialises_like_cuda(python):
    # DeviceMesh reads is_initialized() as "a device was chosen", fake tensors take current_device() only then
    code = """
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
torch.neuron.set_device(1)
with FakeTensorMode():
    print(torch.neuron.is_initialized(), torch.empty(1, device="neuron").device)
"""
    result = python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "neuron:1"]


def test_use_after_fork_raises_spawn_error(python):
    code = """
import os, torch
torch.ones(1, device="neuron")
pid = os.fork()
if pid == 0:
    try:
        torch.ones(1, device="neuron")
    except RuntimeError as e:
        os._exit(0 if "'spawn' start method" in str(e) else 2)
    os._exit(1)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""
    result = python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"


def test_exit_cleanups_are_the_registering_processs_own(python):
    """`services.at_exit`: a cleanup runs once, in the process that registered it, at its exit or when a forked
    child's `os._exit` path calls `services.run_at_exit`; a forked child, which inherits its parent's `atexit`
    handlers, never runs its parent's cleanups (a private directory the parent still uses)."""
    code = """
import os
from neuron_device import services
services.at_exit(os.write, 1, b"parent's\\n")
pid = os.fork()
if pid == 0:
    services.at_exit(os.write, 1, b"child's\\n")
    services.run_at_exit()
    services.run_at_exit()
    os._exit(0)
os.waitpid(pid, 0)
if os.fork() == 0:
    raise SystemExit  # the interpreter's exit
os.wait()
os.write(1, b"parent ends\\n")
"""
    result = python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["child's", "parent ends", "parent's"]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"NEURON_PLATFORM_TARGET_OVERRIDE": "trn9"}, "NEURON_PLATFORM_TARGET_OVERRIDE"),
        ({"NEURON_LOGICAL_NC_CONFIG": "3"}, "NEURON_LOGICAL_NC_CONFIG"),
    ],
)
def test_bad_topology_env_is_a_clear_error(python, env, message):
    result = python("import torch; torch.neuron.device_count()", env=env)
    assert result.returncode != 0
    assert message in result.stderr


def test_target_override_changes_properties(python):
    code = "import torch; p = torch.neuron.get_device_properties(); print(p.name, torch.neuron.device_count())"
    result = python(code, env={"NEURON_PLATFORM_TARGET_OVERRIDE": "trn1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["trn1", "2"]


def test_torch_accelerator_device_index_is_the_neuron_current_device():
    """`torch.accelerator`'s index functions read the C++ guard, which said 0 and ignored changes (CUDA's follow
    `torch.cuda.set_device`); transformers sets the local rank's device through `set_device_index`."""
    with torch.neuron.device(1):
        assert torch.accelerator.current_device_index() == 1
        torch.accelerator.set_device_index(2)
        assert torch.neuron.current_device() == 2 and torch.accelerator.current_device_index() == 2
        with torch.accelerator.device_index(3):
            assert torch.neuron.current_device() == 3
            assert torch.ones(1).to("neuron").device == torch.device("neuron:3")
        assert torch.neuron.current_device() == 2
        with torch.accelerator.device_index(None):
            assert torch.neuron.current_device() == 2
        torch.accelerator.set_device_index(-1)  # negative: no change, as documented
        assert torch.neuron.current_device() == 2
        torch.accelerator.set_device_index("neuron:1")
        assert torch.neuron.current_device() == 1
    assert torch.accelerator.current_device_index() == torch.neuron.current_device()


def test_unindexed_neuron_means_the_current_device():
    with torch.neuron.device(1):
        expected = torch.device("neuron:1")
        assert torch.ones(2, device="neuron").device == expected
        assert torch.ones(2).to("neuron").device == expected
        assert torch.ones(2).to(torch.device("neuron")).device == expected
        assert torch.ones(2).to(device="neuron", dtype=torch.float64).device == expected
        assert torch.nn.Linear(2, 2).to("neuron").weight.device == expected
        assert torch.ones(2).neuron().device == expected
        assert torch.ones(2).to("neuron:2").device == torch.device("neuron:2")  # an explicit index wins
    assert torch.ones(2).to("neuron").device == torch.device("neuron:0")
