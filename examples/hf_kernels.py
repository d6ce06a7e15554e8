"""The kernels hub on `neuron`: `kernelize` swaps a tiny transformers Llama's RMSNorm for the layer of a local kernel
repository (examples/kernels/rmsnorm) whose `torch-neuron` build runs neuron-nki's NKI RMSNorm kernel; the logits
are checked against the CPU and the executed-op log shows the NKI kernel."""

from __future__ import annotations

import os
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from kernels import LocalLayerRepository, Mode, kernelize, replace_kernel_forward_from_hub, use_kernel_mapping
from transformers import AutoConfig, AutoModelForCausalLM, set_seed
from transformers.models.llama.modeling_llama import LlamaRMSNorm

import torch_neuronx

REPO = Path(__file__).resolve().parent / "kernels" / "rmsnorm"
CONFIG = AutoConfig.for_model(
    "llama", vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2,
)


def main() -> None:
    # transformers 5.23.0 marks its layers for the hub only with kernels >= 0.18.2; with 0.17.2 use kernels' own API
    replace_kernel_forward_from_hub(LlamaRMSNorm, "RMSNorm")
    set_seed(0)
    cpu_model = AutoModelForCausalLM.from_config(CONFIG).eval()
    model = AutoModelForCausalLM.from_config(CONFIG).eval()
    model.load_state_dict(cpu_model.state_dict())
    model.to("neuron")
    mapping = {"RMSNorm": {"neuron": LocalLayerRepository(repo_path=REPO, layer_name="LlamaRMSNorm")}}
    with use_kernel_mapping(mapping, inherit_mapping=False):
        kernelize(model, mode=Mode.INFERENCE)  # the device (neuron) is read from the parameters

    ids = torch.randint(3, CONFIG.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    torch_neuronx.clear_op_tracking()
    with torch.no_grad():
        logits = model(input_ids=ids.to("neuron")).logits.cpu()
        expected = cpu_model(input_ids=ids).logits
    nki_ops = [op for op in torch_neuronx.get_executed_ops() if op.startswith("nki::")]
    assert "nki::rmsnorm_fwd" in nki_ops, nki_ops
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-5)
    print(f"NKI kernels executed: {nki_ops}")
    print("kernelized Llama logits on neuron == CPU")


if __name__ == "__main__":
    main()
