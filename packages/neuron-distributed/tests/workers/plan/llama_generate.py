"""Serving as a user writes it: a tiny Llama from its config, tensor-parallel over every rank (DTensor
`parallelize_module`), greedy `generate` with a static cache, whose decode transformers compiles (backend "neuron");
`--compiled-prefill` prefills through the same compiled forward too (`prefill_chunk_size`, the whole prompt one
chunk, with a static cache passed in, which the compiled prefill allocates: benchmarks' llama_generate.py's default),
`--eager` generates without compiling, `--cpu` on the CPU in one process (the reference tokens). Planned, and run
for real. Prints the tokens."""

import os
import sys

import torch
import torch.distributed as dist
import transformers
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
transformers.set_seed(0)
model = transformers.LlamaForCausalLM(config).eval()
prompt = torch.tensor([[1, 17, 42, 99, 5, 63, 7, 11], [1, 23, 8, 64, 90, 3, 31, 77]])
if "--cpu" in sys.argv:
    print("TOKENS", model.generate(prompt, max_new_tokens=8, do_sample=False).tolist(), flush=True)
    sys.exit()
dist.init_process_group("neuron")
torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("neuron", (dist.get_world_size(),))
model.to("neuron")
plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel()}
for layer in model.model.layers:
    parallelize_module(layer, mesh, plan)
# generate's own static cache would have every head on a model sharded by hand: the cache passed in is allocated at
# its first update, with each rank's
cache = {"prefill_chunk_size": 8, "past_key_values": transformers.StaticCache(config=config, max_cache_len=16)} \
    if "--compiled-prefill" in sys.argv else {"cache_implementation": "static"}
tokens = model.generate(prompt.to("neuron"), max_new_tokens=8, do_sample=False, disable_compile="--eager" in sys.argv,
                        **cache)
print("TOKENS", tokens.cpu().tolist(), flush=True)
dist.destroy_process_group()
