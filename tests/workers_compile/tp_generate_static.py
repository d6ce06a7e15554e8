"""One rank of `test_compile_tensor_parallel`'s generate check: a tiny Llama from its config, tensor-parallel over
all ranks with DTensor `parallelize_module` (argument "neuron"), greedy `generate` with a static cache, which
transformers compiles itself; or the same model greedy on the CPU in one process (argument "cpu"). Prints the
tokens and how many graphs the neuron backend compiled as one JSON line."""

import datetime
import json
import sys

import torch
import torch.distributed as dist
import transformers
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

device = sys.argv[1]
config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
transformers.set_seed(0)
model = transformers.LlamaForCausalLM(config).eval()
prompt = torch.tensor([[1, 17, 42, 99, 5, 63]])
if device == "cpu":
    tokens = model.generate(prompt, max_new_tokens=8, pad_token_id=0, do_sample=False)
    print(json.dumps({"tokens": tokens.tolist(), "graphs": 0}), flush=True)
    sys.exit()
dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=120))
torch.neuron.set_device(dist.get_rank())
mesh = init_device_mesh("neuron", (dist.get_world_size(),))
model.to("neuron")
plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel()}
for layer in model.model.layers:
    parallelize_module(layer, mesh, plan)
tokens = model.generate(prompt.to("neuron"), max_new_tokens=8, pad_token_id=0, do_sample=False,
                        cache_implementation="static")
print(json.dumps({"tokens": tokens.cpu().tolist(), "graphs": len(torch.neuron.get_dynamo_metrics())}), flush=True)
dist.destroy_process_group()
