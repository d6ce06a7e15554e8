"""Llama serving as a user writes it: a causal LM from its config (no weights), tensor-parallel over every rank with
DTensor `parallelize_module` and transformers' own plan for Llama (its `base_model_tp_plan` and `_tp_plan`, what
`tp_plan="auto"` applies to a checkpoint: column-sharded q/k/v/gate/up, row-sharded o/down, and `lm_head` column-sharded
with its logits gathered, "colwise_gather_output"), bf16, and greedy `model.generate(..., cache_implementation="static")`.
transformers compiles the static-cache decode (backend "neuron"); the prompt runs through the same compiled forward
when `generate` prefills in chunks (`prefill_chunk_size`), which is how AWS's TorchNeuron tutorial for `generate`
serves (static cache + `CompileConfig` + chunked prefill, "Run a Hugging Face model for inference with
torch.compile"): by default the whole prompt is one chunk, so the prefill is one compiled graph as on the chip's
other stacks (transformers-neuronx and NxD Inference compile a context-encoding graph). `--prefill-chunk 0` prefills
eagerly (transformers' default without chunking: every op its own launch); `--eager` compiles nothing. Planned
unmodified:

    neuron-plan --instance trn1.32xlarge -- torchrun --nproc-per-node 32 llama_generate.py --model 70b \\
        --batch 1 --input 128 --output 64

The plan reports the time to first token and per output token, the KV cache and whether it fits (docs/planning.md,
"Serving").
"""

import argparse
import os

import torch
import torch.distributed as dist
from llama_shapes import LLAMA_2_7B, LLAMA_3_1, tiny
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

SIZES = {"tiny": tiny(layers=2), **LLAMA_3_1, "llama2-7b": LLAMA_2_7B}
parser = argparse.ArgumentParser()
parser.add_argument("--model", default="8b", choices=sorted(SIZES))
parser.add_argument("--batch", type=int, default=1)
parser.add_argument("--input", type=int, default=128, help="prompt tokens")
parser.add_argument("--output", type=int, default=64, help="max_new_tokens")
parser.add_argument("--eager", action="store_true", help="generate without compiling the prefill or the decode")
parser.add_argument("--prefill-chunk", type=int, help="generate's prefill_chunk_size: the prompt runs through the "
                    "compiled forward in chunks of this many tokens (default: the whole prompt, one chunk; 0: an eager "
                    "prefill)")
parser.add_argument("--cache-length", type=int, help="the static KV cache's length (default: input + output, what "
                    "generate allocates): each decode step attends the whole static cache, so a plan of a few tokens "
                    "with the cache of a long generation prices that generation's every token")
parser.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"), help="transformers' attention implementation "
                    "(sdpa, its default: one fused attention op; eager: matmul, mask, fp32 softmax and matmul as separate "
                    "ops, the chain transformers-neuronx's decode runs)")
args = parser.parse_args()

dist.init_process_group("neuron")
torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("neuron", (dist.get_world_size(),))
size = dict(SIZES[args.model])
# More ranks than KV heads (70B's 8 at TP 32): each KV head replicated so that every rank holds one, as Neuron's
# tensor parallelism does for grouped-query attention (the weights of k/v grow by tp / kv heads).
size["num_key_value_heads"] = max(size["num_key_value_heads"], dist.get_world_size())
config = LlamaConfig(**{"rope_theta": 500000.0, **size}, max_position_embeddings=131072,
                     pad_token_id=size["eos_token_id"], attn_implementation=args.attn)
model = LlamaForCausalLM(config).eval()  # on the host; each rank moves its shards and the rest to its core
layer_plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
              "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
              "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel()}
for layer in model.model.layers:
    parallelize_module(layer, mesh, layer_plan)
parallelize_module(model, mesh, {"lm_head": ColwiseParallel(output_layouts=Replicate())})  # colwise_gather_output
model.to("neuron", torch.bfloat16)
prompt = torch.randint(0, config.vocab_size, (args.batch, args.input), device="neuron")
chunk = 0 if args.eager else args.input if args.prefill_chunk is None else args.prefill_chunk
# generate's own static cache (`cache_implementation="static"`) is allocated before a chunked prefill with the heads of
# a model that `from_pretrained(tp_plan=...)` sharded (its `_tp_size`): a model sharded by hand, as here, would get
# every head and fail at its first update. A StaticCache passed in is allocated at its first update, with each rank's
# heads; sized as generate sizes its own (prompt + new tokens) unless --cache-length says otherwise.
cache = (StaticCache(config=config, max_cache_len=args.cache_length) if args.cache_length
         else StaticCache(config=config, max_cache_len=args.input + args.output) if chunk else None)
tokens = model.generate(prompt, max_new_tokens=args.output, do_sample=False, disable_compile=args.eager,
                        prefill_chunk_size=chunk or None,
                        **({"past_key_values": cache} if cache is not None else {"cache_implementation": "static"}))
print("generated", tokens.shape)
dist.destroy_process_group()
