"""Llama training with 3-D parallelism as a user writes it: a (dp, pp, tp) device mesh, Megatron-style tensor
parallelism (column-sharded q/k/v/gate/up, row-sharded o/down, vocabulary-sharded embedding and head, written
explicitly with hooks around Hugging Face's decoder layers), pipeline stages run by `torch.distributed.pipelining`
(GPipe, 1F1B or interleaved 1F1B), a gradient all-reduce over the data-parallel group, AdamW. As torchtitan
applies them to each decoder layer: tensor (and sequence) parallelism, then activation checkpointing
(`checkpoint_wrapper`), then `torch.compile(backend="neuron")` of the layer (`--compile`).

    neuron-plan --instance trn1.32xlarge --nodes 32 -- python llama_3d.py --model 70b --tp 32 --pp 8 --dp 4 \\
        --seq 8192 --micro-batch 1 --global-batch 1024 --checkpoint --sequence-parallel --compile

Each rank builds only its stages' layers (as torchtitan does): a 70B model never exists whole on one rank.
"""

import argparse
import os

import torch
import torch.distributed as dist
from llama_shapes import LLAMA_3_1, tiny
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

SIZES = {"tiny": tiny(layers=8), **LLAMA_3_1}
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}
parser = argparse.ArgumentParser()
parser.add_argument("--model", default="8b", choices=sorted(SIZES))
parser.add_argument("--dp", type=int, default=1)
parser.add_argument("--pp", type=int, default=1)
parser.add_argument("--tp", type=int, default=1)
parser.add_argument("--schedule", default="1f1b", choices=sorted(SCHEDULES))
parser.add_argument("--stages-per-rank", type=int, default=1, help="virtual stages (interleaved schedule)")
parser.add_argument("--seq", type=int, default=8192)
parser.add_argument("--micro-batch", type=int, default=1)
parser.add_argument("--global-batch", type=int, default=None, help="sequences per step (default: one micro-batch "
                    "per pipeline stage and data-parallel rank)")
parser.add_argument("--checkpoint", action="store_true", help="activation checkpointing of every decoder layer")
parser.add_argument("--sequence-parallel", action="store_true",
                    help="Megatron's sequence parallelism: the norms and residuals hold seq / tp tokens")
parser.add_argument("--compile", action="store_true", help='each decoder layer compiled with backend "neuron"')
parser.add_argument("--steps", type=int, default=1)
args = parser.parse_args()

dist.init_process_group("neuron")
if dist.get_world_size() != args.dp * args.pp * args.tp:
    raise SystemExit(f"world size {dist.get_world_size()} != dp {args.dp} x pp {args.pp} x tp {args.tp}")
device = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
mesh = init_device_mesh("neuron", (args.dp, args.pp, args.tp), mesh_dim_names=("dp", "pp", "tp"))
tp_group, dp_group = mesh["tp"].get_group(), mesh["dp"].get_group()
tp_rank = mesh["tp"].get_local_rank()
full = LlamaConfig(max_position_embeddings=131072, **SIZES[args.model])
head_dim = full.hidden_size // full.num_attention_heads
# This rank's share of every layer: heads and MLP columns divided by TP, KV heads replicated once TP exceeds them.
local = LlamaConfig(**{**full.to_dict(), "num_attention_heads": full.num_attention_heads // args.tp,
                       "num_key_value_heads": max(1, full.num_key_value_heads // args.tp), "head_dim": head_dim,
                       "intermediate_size": full.intermediate_size // args.tp},
                      attn_implementation="sdpa")


class CopyToTensorParallel(torch.autograd.Function):
    """Megatron's f: identity forward, gradient all-reduced over the TP group (the input of column-sharded work)."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=tp_group)
        return grad


class ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's g: forward all-reduced over the TP group (partial sums of row-sharded work), identity backward."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        dist.all_reduce(x, group=tp_group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


def _sequence_major(x):
    return x.transpose(0, 1).contiguous()  # collectives gather and scatter along dim 0


class GatherSequence(torch.autograd.Function):
    """Sequence parallelism's f: the TP group's sequence shards all-gathered; the gradient reduce-scattered."""

    @staticmethod
    def forward(ctx, x):
        local = _sequence_major(x)
        out = local.new_empty((local.shape[0] * args.tp, *local.shape[1:]))
        dist.all_gather_single(out, local, group=tp_group)
        return out.transpose(0, 1)

    @staticmethod
    def backward(ctx, grad):
        return ScatterSequence.forward(ctx, grad)


class ScatterSequence(torch.autograd.Function):
    """Sequence parallelism's g: partial sums reduce-scattered into sequence shards; the gradient all-gathered."""

    @staticmethod
    def forward(ctx, x):
        full = _sequence_major(x)
        out = full.new_empty((full.shape[0] // args.tp, *full.shape[1:]))
        dist.reduce_scatter_single(out, full, group=tp_group)
        return out.transpose(0, 1)

    @staticmethod
    def backward(ctx, grad):
        return GatherSequence.forward(ctx, grad)


Copy = GatherSequence if args.sequence_parallel else CopyToTensorParallel
Reduce = ScatterSequence if args.sequence_parallel else ReduceFromTensorParallel


def copy_input(module, inputs, kwargs):
    if inputs:  # the MLP is called with its input positional, the attention by keyword
        return (Copy.apply(inputs[0]), *inputs[1:]), kwargs
    return inputs, {**kwargs, "hidden_states": Copy.apply(kwargs["hidden_states"])}


def tensor_parallel(layer):
    """Hooks of Megatron's f before the attention and MLP, g after their row-sharded projections."""
    if args.tp == 1:
        return layer
    for block in (layer.self_attn, layer.mlp):
        block.register_forward_pre_hook(copy_input, with_kwargs=True)
    for projection in (layer.self_attn.o_proj, layer.mlp.down_proj):
        projection.register_forward_hook(lambda module, inputs, out: Reduce.apply(out))
    return layer


def decoder_layer(index):
    """One decoder layer as torchtitan builds it: tensor parallelism, activation checkpointing, compile."""
    layer = tensor_parallel(LlamaDecoderLayer(local, index))
    if args.checkpoint:
        layer = checkpoint_wrapper(layer)  # non-reentrant torch.utils.checkpoint
    return torch.compile(layer, backend="neuron", fullgraph=True) if args.compile else layer


class Stage(torch.nn.Module):
    """Layers [first, last) of the model; the embedding on the first stage, norm and head on the last."""

    def __init__(self, first, last):
        super().__init__()
        vocab = full.vocab_size // args.tp
        self.vocab_start = tp_rank * vocab
        self.embed = torch.nn.Embedding(vocab, full.hidden_size) if first == 0 else None
        self.layers = torch.nn.ModuleList(decoder_layer(i) for i in range(first, last))
        self.rotary = LlamaRotaryEmbedding(full)
        is_last = last == full.num_hidden_layers
        self.norm = LlamaRMSNorm(full.hidden_size, eps=full.rms_norm_eps) if is_last else None
        self.head = torch.nn.Linear(full.hidden_size, vocab, bias=False) if is_last else None

    def forward(self, x):
        if self.embed is not None:  # vocabulary-sharded: rows outside this rank's slice are zero, then summed
            mine = (x >= self.vocab_start) & (x < self.vocab_start + self.embed.num_embeddings)
            x = self.embed((x - self.vocab_start).clamp(0, self.embed.num_embeddings - 1)) * mine[..., None]
            x = Reduce.apply(x) if args.tp > 1 else x
        positions = torch.arange(args.seq, device=x.device)[None]
        rotary = self.rotary(x, positions)
        for layer in self.layers:
            x = layer(x, position_embeddings=rotary, position_ids=positions)
        if self.head is None:
            return x
        return self.head(Copy.apply(self.norm(x)) if args.tp > 1 else self.norm(x))


def vocab_parallel_loss(logits, labels):
    """Cross-entropy over vocabulary-sharded logits: max, sum of exponentials and the label's logit all-reduced."""
    logits = logits.float()
    top = logits.max(-1).values.detach()
    if args.tp > 1:
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=tp_group)
    shifted = logits - top[..., None]
    vocab = logits.shape[-1]
    mine = (labels >= tp_rank * vocab) & (labels < (tp_rank + 1) * vocab)
    index = (labels - tp_rank * vocab).clamp(0, vocab - 1)
    picked = shifted.gather(-1, index[..., None])[..., 0] * mine
    total = shifted.exp().sum(-1)
    if args.tp > 1:
        picked, total = ReduceFromTensorParallel.apply(picked), ReduceFromTensorParallel.apply(total)
    return (total.log() - picked).mean()


stages_count = args.pp * args.stages_per_rank
per_stage = full.num_hidden_layers // stages_count
if per_stage * stages_count != full.num_hidden_layers:
    raise SystemExit(f"{full.num_hidden_layers} layers do not split into {stages_count} equal stages")
pp_rank = mesh["pp"].get_local_rank()
# a rank's stages: pp_rank, pp_rank + pp, ... (the interleaved schedule's loop placement)
indices = [pp_rank + k * args.pp for k in range(args.stages_per_rank)]
local_seq = args.seq // args.tp if args.sequence_parallel else args.seq
hidden = torch.empty(args.micro_batch, local_seq, full.hidden_size, dtype=torch.bfloat16, device="meta")
modules, stages = [], []
for index in indices:
    module = Stage(index * per_stage, (index + 1) * per_stage).to(device, torch.bfloat16)
    modules.append(module)
    stages.append(PipelineStage(module, index, stages_count, device, group=mesh["pp"].get_group(),
                                input_args=None if index == 0 else (hidden,)))
global_batch = args.global_batch or args.micro_batch * args.pp * args.dp
micro_batches = global_batch // (args.dp * args.micro_batch)
Schedule = SCHEDULES[args.schedule]
schedule = Schedule(stages if args.stages_per_rank > 1 or args.schedule == "interleaved" else stages[0],
                    n_microbatches=micro_batches, loss_fn=vocab_parallel_loss)
parameters = [p for module in modules for p in module.parameters()]
optimizer = torch.optim.AdamW(parameters, lr=1e-5)
for _ in range(args.steps):
    ids = torch.randint(0, full.vocab_size, (global_batch // args.dp, args.seq), device=device)
    inputs = (ids,) if any(stage.is_first for stage in stages) else ()
    targets = {"target": ids} if any(stage.is_last for stage in stages) else {}
    schedule.step(*inputs, **targets, return_outputs=False)  # the last stage keeps no logits of every micro-batch
    if args.dp > 1:
        for p in parameters:
            dist.all_reduce(p.grad, group=dp_group)
    optimizer.step()
    optimizer.zero_grad()
