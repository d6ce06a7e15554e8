"""Llama pre-training as torchtitan-style users write it: DTensor tensor parallelism (`parallelize_module`,
column-sharded q/k/v/gate/up, row-sharded o/down) with sequence parallelism on mesh["tp"] (torchtitan's
`parallelize_llama`: the RMSNorms and residual adds on this rank's 1/tp of the tokens, the attention and MLP inputs
all-gathered, their outputs reduce-scattered; NeuronX Distributed's Llama2-7B TP/ZeRO-1 recipe, T2's published run,
enables the same "sequence parallel"), every decoder layer wrapped for activation checkpointing and compiled on its
own (`torch.compile(block, backend="neuron")`), bf16 weights, gradient accumulation over micro-batches, and ZeRO-1
over mesh["dp"] as NeuronX Distributed runs it: each weight's fp32 master shard on its rank, the bf16 gradients
reduce-scattered once a step in buckets of about 130 MB, AdamW on the shards, the updated bf16 weights all-gathered
by the same buckets (never a flat copy of all the weights or gradients).

calibration.md T2 (Llama2-7B, 16 x trn1.32xlarge, TP 8, DP 64, micro-batch 1, global batch 1,024, seq 4096):

    neuron-plan --instance trn1.32xlarge --nodes 16 --steps 2 -- python llama_tp_zero1.py --tp 8 \\
        --global-batch 1024 --seq 4096
"""

import argparse
import os

import torch
import torch.distributed as dist
from llama_shapes import LLAMA_2_7B, tiny
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)
from torch.nn import functional as F
from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

SIZES = {  # config.json of meta-llama/Llama-2-7b-hf; "tiny" for tests
    "llama2-7b": LLAMA_2_7B,
    "tiny": tiny(layers=2, heads=4),
}


def causal_sdpa(module, query, key, value, attention_mask, **kwargs):
    """SDPA with `is_causal=True` and no mask tensor, as torchtitan's attention and NeuronX Distributed's flash
    attention run a causal training step. transformers' own "sdpa" gets there only when it can see the position ids
    are not packed sequences, a read of their values: in plan mode they have none, so it would hand every layer a
    materialised [seq, seq] mask, and attention would be planned over every score, masked ones included."""
    return sdpa_attention_forward(module, query, key, value, None, **kwargs)


AttentionInterface.register("causal_sdpa", causal_sdpa)
parser = argparse.ArgumentParser()
parser.add_argument("--model", default="llama2-7b", choices=sorted(SIZES))
parser.add_argument("--tp", type=int, default=8)
parser.add_argument("--seq", type=int, default=4096)
parser.add_argument("--micro-batch", type=int, default=1)
parser.add_argument("--global-batch", type=int, default=1024)
parser.add_argument("--steps", type=int, default=2)
parser.add_argument("--eager", action="store_true", help="do not compile the decoder layers")
args = parser.parse_args()

dist.init_process_group("neuron")
device = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
torch.neuron.set_device(device)
dp = dist.get_world_size() // args.tp
mesh = init_device_mesh("neuron", (dp, args.tp), mesh_dim_names=("dp", "tp"))
config = LlamaConfig(max_position_embeddings=args.seq, attn_implementation="causal_sdpa", use_cache=False,
                     **SIZES[args.model])
model = LlamaForCausalLM(config).to(device, torch.bfloat16)
# torchtitan's plan outside the layers: vocabulary-sharded embedding (its output sharded by sequence) and head, the
# final norm on the sequence shard, the loss on the sharded logits
parallelize_module(model, mesh["tp"], {
    "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
    "model.norm": SequenceParallel(),
    "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)})
layers = model.model.layers
for i, layer in enumerate(layers):
    parallelize_module(layer, mesh["tp"], {
        "input_layernorm": SequenceParallel(),
        "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                        desired_input_kwarg_layouts={"hidden_states": Replicate()}),
        **{f"self_attn.{p}": ColwiseParallel() for p in ("q_proj", "k_proj", "v_proj")},
        "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
        "post_attention_layernorm": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1))})
    # compiled, then checkpointed: the backward reruns the compiled forward, as NxD's recipe recomputes (torchtitan's
    # order, the checkpointed block compiled, runs too and recomputes inside the compiled backward)
    block = layer if args.eager else torch.compile(layer, backend="neuron", fullgraph=True)
    layers[i] = checkpoint_wrapper(block, preserve_rng_state=False)

# ZeRO-1 as NeuronX Distributed's NeuronZero1Optimizer runs it (torch_xla's ZeroRedundancyOptimizer): every local
# (TP-sharded) weight padded to a multiple of dp and cut in dp shards, this rank's shard kept in fp32 for AdamW; no
# flat copy of all the weights or gradients. The gradients are reduce-scattered in buckets of about 130 MB (NxD's
# ALL_GATHER_REDUCE_SCATTER_BUCKET_CAP_MB, torch_xla's `reduce_scatter_bucketized`: a bucket is filled until the next
# weight would spill it), each bucket one collective over its weights' shards side by side, and the updated bf16
# shards all-gathered by the same buckets (NxD caps the all-gather's input at 130 MB / dp: the same weights).
BUCKET_BYTES = 130 * 2**20
parameters = list(model.parameters())
local = [p.to_local() if isinstance(p, DTensor) else p for p in parameters]
dp_group, dp_rank = mesh["dp"].get_group(), mesh["dp"].get_local_rank()
widths = [-(-t.numel() // dp) for t in local]  # each weight's shard, padded
buckets, filled = [[]], 0
for i, t in enumerate(local):
    if buckets[-1] and filled + t.nbytes > BUCKET_BYTES:
        buckets.append([])
        filled = 0
    buckets[-1].append(i)
    filled += t.nbytes


def by_rank(tensors: list[torch.Tensor], bucket: list[int]) -> torch.Tensor:
    """[dp, shard widths]: the dp shards of each tensor of `bucket` side by side, rank r's in row r (a tensor whose
    size dp does not divide padded with zeros)."""
    flats = [t.reshape(-1) for t in tensors]
    return torch.cat([(f if f.numel() == dp * widths[i] else F.pad(f, (0, dp * widths[i] - f.numel()))).view(dp, -1)
                      for i, f in zip(bucket, flats, strict=True)], dim=1)


with torch.no_grad():
    masters = [by_rank([local[i]], [i])[dp_rank].float().requires_grad_() for i in range(len(local))]
optimizer = torch.optim.AdamW(masters, lr=1e-5)


def zero1_step() -> None:
    """Reduce-scatter the gradients by buckets into the fp32 shards' `.grad`, step AdamW, all-gather the weights."""
    # each gradient on its weight's layout first: DTensor gives the vocabulary-sharded embedding a replicated one
    grads = [p.grad.redistribute(p.device_mesh, p.placements).to_local() if isinstance(p.grad, DTensor) else p.grad
             for p in parameters]
    for bucket in buckets:
        send = by_rank([grads[i] for i in bucket], bucket)
        received = send.new_empty(send.shape[1])
        dist.reduce_scatter_tensor(received, send.view(-1), group=dp_group)
        for i, piece in zip(bucket, received.split([widths[i] for i in bucket]), strict=True):
            masters[i].grad = piece.float()
    del grads
    model.zero_grad()  # the bf16 gradients are dead once scattered (as in NxD's compiled step): freed before AdamW
    optimizer.step()
    optimizer.zero_grad()
    with torch.no_grad():
        for bucket in buckets:
            send = torch.cat([masters[i].detach().to(torch.bfloat16) for i in bucket])
            gathered = send.new_empty(dp * send.numel())
            dist.all_gather_into_tensor(gathered, send, group=dp_group)
            for i, piece in zip(bucket, gathered.view(dp, -1).split([widths[i] for i in bucket], dim=1), strict=True):
                target = local[i].view(-1)
                if target.numel() == piece.numel():
                    target.view(dp, -1).copy_(piece)
                else:  # padded: the weight is the start of its shards
                    target.copy_(piece.reshape(-1)[:target.numel()])


accumulation = args.global_batch // (dp * args.micro_batch)
# the layers see this rank's sequence shard: the whole sequence's positions are given (the rotary tables span them)
positions = torch.arange(args.seq, device=device).unsqueeze(0)
for _ in range(args.steps):
    for _ in range(accumulation):
        ids = torch.randint(0, config.vocab_size, (args.micro_batch, args.seq), device=device)
        logits = model.lm_head(model.model(input_ids=ids, position_ids=positions).last_hidden_state)
        with loss_parallel():  # cross-entropy on the vocabulary shards (labels: the next token)
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten()) / accumulation
            loss.backward()
    del logits, loss
    zero1_step()
dist.destroy_process_group()
