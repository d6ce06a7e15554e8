"""Serving at a batch size given on the command line (`neuron-plan --serve`'s `{batch}`): a Llama of two layers
with 32 KV heads of 128 dimensions, bf16, greedy `generate` (eager) into a static cache of 131,072 positions, so
that the cache takes 4 GiB a sequence (2 layers x keys and values x 32 heads x 131,072 x 128 x 2 B): batch 2 fits
one trn1 core's 16 GiB, batch 4 does not."""

import argparse

import torch
import transformers

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, required=True)
args = parser.parse_args()
config = transformers.LlamaConfig(vocab_size=128, hidden_size=4096, intermediate_size=128, num_hidden_layers=2,
                                  num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=131072,
                                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
model = transformers.LlamaForCausalLM(config).eval().to("neuron", torch.bfloat16)
prompt = torch.randint(3, 128, (args.batch, 8), device="neuron")
cache = transformers.StaticCache(config=config, max_cache_len=131072)
model.generate(prompt, max_new_tokens=3, do_sample=False, past_key_values=cache, disable_compile=True)
