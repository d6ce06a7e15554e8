"""NKI kernel substitution through the plugin seam: a plugin (installed for the test as a real distribution with a
`neuron_device.plugins` entry point) registers a `neuron` kernel for `aten::native_layer_norm`; compiled graphs
then call that kernel as one node instead of lowering the op. neuron-nki's own native kernels (SDPA, norms,
softmax) take the same route when installed; they are switched off here so the test's kernel is the only one, and
they are exercised by the model tests of the all-packages session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.compiler, pytest.mark.multiprocess]

PLUGIN = '''
import torch
from neuron_device.storage import adopt, host_alias
from neuron_device.plugins import hookimpl

calls = []


def layer_norm(x, shape, weight=None, bias=None, eps=1e-5):
    calls.append(tuple(x.shape))
    out = torch.ops.aten.native_layer_norm.default(host_alias(x), shape, None if weight is None else host_alias(weight),
                                                   None if bias is None else host_alias(bias), eps)
    return tuple(adopt(t.contiguous(), x.device.index) for t in out)


@hookimpl
def neuron_register(registry):
    registry.register("aten::native_layer_norm", layer_norm)
'''

SCRIPT = '''
import json, torch, fake_nki_plugin
from neuron_compile import nki_substitution
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)).to("neuron").eval()
x = torch.randn(4, 8, device="neuron")
with torch.no_grad():
    compiled = torch.compile(model, backend="neuron", fullgraph=True)
    compiled(x)
    fake_nki_plugin.calls.clear()
    out = compiled(x)
    cpu = model.cpu()
    want = cpu(x.cpu())
print(json.dumps({"kernel_calls": len(fake_nki_plugin.calls), "substituted": nki_substitution.substituted_calls,
                  "error": (out.cpu() - want).abs().max().item()}))
'''


def test_registered_kernel_replaces_the_op_in_compiled_graphs(tmp_path) -> None:
    (tmp_path / "fake_nki_plugin.py").write_text(textwrap.dedent(PLUGIN))
    info = tmp_path / "fake_nki_plugin-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-nki-plugin\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text("[neuron_device.plugins]\nfake_nki = fake_nki_plugin\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "NEURON_DEVICE_STRICT_PLUGINS": "1", "NEURON_NKI_NATIVE_KERNELS": "0"}  # only the test's kernel
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["kernel_calls"] == 1  # the compiled graph called the plugin's kernel once, as one node
    assert result["substituted"] == {"aten::native_layer_norm": 2}
    assert result["error"] < 1e-5
