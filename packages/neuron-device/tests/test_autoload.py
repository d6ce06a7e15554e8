"""Registration: `import torch` alone makes `neuron` usable; with autoload off, `import torch_neuronx` does."""

from __future__ import annotations

import importlib.util

import pytest

# `import torch` loads every installed wheel's plugin: checked alone and with all of them (all session)
pytestmark = pytest.mark.all_wheels

RANDN = "import torch; print(torch.randn(2, device='neuron').device)"


def test_import_torch_alone_registers_the_device(python):
    result = python(RANDN, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "neuron:0"


def test_autoload_off_needs_an_explicit_import(python):
    off = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    result = python(RANDN, env=off)
    assert result.returncode != 0
    assert "neuron" in result.stderr
    for module in ("torch_neuronx", "neuron_device"):
        result = python(f"import torch, {module}; print(torch.randn(2, device='neuron').device)", env=off)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "neuron:0"


def test_autoload_stays_light(python):
    # torch is half-imported while the entry point runs: registering must not pull in the compiler stack.
    # fresh: what `import torch` imports (a forked child has its server's modules too)
    code = "import sys, torch; print(sorted(m for m in ('torch._dynamo', 'torch._inductor') if m in sys.modules))"
    result = python(code, fresh=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_compat_module_is_discoverable():
    # transformers, accelerate and diffusers probe for TorchNeuron this way.
    assert importlib.util.find_spec("torch_neuronx") is not None


def test_aws_stack_installed_alongside_is_reported(python, tmp_path):
    dist_info = tmp_path / "torch_neuronx-2.14.3.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch-neuronx\nVersion: 2.14.3.0\n")
    result = python("import torch", env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode != 0
    assert "AWS's torch-neuronx 2.14.3.0 is installed next to neuron-device" in result.stderr


def test_our_metadata_only_torch_neuronx_is_no_clash(python, tmp_path):
    # packages/torch-neuronx: the distribution name diffusers looks up, with our local version label
    dist_info = tmp_path / "torch_neuronx-2.13.0+neuronsim.0.1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch-neuronx\nVersion: 2.13.0+neuronsim.0.1.0\n")
    code = "import importlib.metadata as m, torch; print(m.version('torch_neuronx'), torch.ones(1, device='neuron').device)"
    result = python(code, env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["2.13.0+neuronsim.0.1.0", "neuron:0"]
    # another local label is not ours: still the clash
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch-neuronx\nVersion: 2.13.0+other\n")
    assert "AWS's torch-neuronx 2.13.0+other is installed" in python("import torch", env={"PYTHONPATH": str(tmp_path)}).stderr


def test_importing_ours_before_torch_works(python):
    for env in ({"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}):
        # fresh: ours imported before torch (a forked child has torch imported)
        result = python("import neuron_device, torch; print(torch.ones(2, device='neuron').device)", env=env, fresh=True)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "neuron:0"


@pytest.mark.parametrize(
    "variable, value",
    [
        ("NEURON_SIM_REPORT", "bogus"),
        ("TORCH_NEURONX_DOWNCAST_64BIT", "maybe"),
        ("TORCH_NEURONX_ENABLE_CONCATENATION", "perhaps"),
        ("TORCH_NEURONX_CONCATENATION_BUFFER_SIZE_LIMIT", "abc"),
        ("TORCH_NEURONX_CONCATENATION_QUEUE_LOW_THRESHOLD", "-3"),
        ("NEURON_RT_NUM_CORES", "zz"),
    ],
)
def test_a_bad_env_value_never_breaks_import_torch(python, variable, value):
    """Issue 19, item 11: a program that does not use `neuron` imports and runs torch; the first use of the device
    raises, naming the variable."""
    result = python(
        "import torch\n"
        "assert torch.equal(torch.ones(2) + 1, torch.full((2,), 2.0))\n"
        "print('imported')\n"
        "try:\n"
        "    torch.ones(2, device='neuron')\n"
        "except Exception as error:\n"
        "    print('first use:', type(error).__name__, error)\n",
        env={variable: value},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "imported" in result.stdout
    assert f"first use: EnvVarError {variable}=" in result.stdout, result.stdout
