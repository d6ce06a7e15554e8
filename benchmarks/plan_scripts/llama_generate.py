"""Llama serving as a user writes it: a causal LM from its config (no weights), tensor-parallel over every rank with
DTensor `parallelize_module` (column-sharded q/k/v/gate/up, row-sharded o/down), bf16, and greedy
`model.generate(..., cache_implementation="static")`, whose decode transformers compiles (backend "neuron");
`--eager` generates without compiling. Planned unmodified:

    neuron-plan --instance trn1.32xlarge -- torchrun --nproc-per-node 32 llama_generate.py --model 70b \\
        --batch 1 --input 128 --output 64

The plan reports the time to first token and per output token, the KV cache and whether it fits (docs/planning.md,
"Serving").
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from transformers import LlamaConfig, LlamaForCausalLM

SIZES = {  # Llama-3.1 shapes (config.json of meta-llama/Llama-3.1-{8B,70B}); tiny for a quick look
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
                 num_key_value_heads=4, vocab_size=256),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256),
    "70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8, vocab_size=128256),
}
parser = argparse.ArgumentParser()
parser.add_argument("--model", default="8b", choices=sorted(SIZES))
parser.add_argument("--batch", type=int, default=1)
parser.add_argument("--input", type=int, default=128, help="prompt tokens")
parser.add_argument("--output", type=int, default=64, help="max_new_tokens")
parser.add_argument("--eager", action="store_true", help="generate without compiling the decode")
args = parser.parse_args()

dist.init_process_group("neuron")
torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("neuron", (dist.get_world_size(),))
size = dict(SIZES[args.model])
# More ranks than KV heads (70B's 8 at TP 32): each KV head replicated so that every rank holds one, as Neuron's
# tensor parallelism does for grouped-query attention (the weights of k/v grow by tp / kv heads).
size["num_key_value_heads"] = max(size["num_key_value_heads"], dist.get_world_size())
config = LlamaConfig(**size, max_position_embeddings=131072, rope_theta=500000.0,
                     bos_token_id=128000, eos_token_id=128001, pad_token_id=128001)
model = LlamaForCausalLM(config).eval()  # on the host; each rank moves its shards and the rest to its core
layer_plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
              "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
              "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel()}
for layer in model.model.layers:
    parallelize_module(layer, mesh, layer_plan)
model.to("neuron", torch.bfloat16)
prompt = torch.randint(0, config.vocab_size, (args.batch, args.input), device="neuron")
tokens = model.generate(prompt, max_new_tokens=args.output, do_sample=False, cache_implementation="static",
                        disable_compile=args.eager)
print("generated", tokens.shape)
dist.destroy_process_group()
