"""An MoE layer with expert parallelism, as torchtitan's MoE with EP runs it: a router picks the top-k experts of
each token, tokens are dispatched to the ranks holding their experts by an all-to-all, each rank runs its local
experts (a SwiGLU each, grouped as one batched matmul), and a second all-to-all combines the results. Dispatch has a
fixed capacity per expert (GShard's), so the all-to-all's splits are equal and known without reading values; the
tokens' slots come from the router's choices (data, but not shapes). A dense block before it, AdamW."""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd

parser = argparse.ArgumentParser()
parser.add_argument("--experts", type=int, default=4)
parser.add_argument("--top-k", type=int, default=2)
parser.add_argument("--tokens", type=int, default=256)
parser.add_argument("--dim", type=int, default=128)
parser.add_argument("--hidden", type=int, default=256)
args = parser.parse_args()

dist.init_process_group("neuron")
world, device = dist.get_world_size(), torch.device("neuron", int(os.environ["LOCAL_RANK"]))
local = args.experts // world
capacity = args.tokens * args.top_k // args.experts  # slots per expert on each rank


class MoE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(args.dim, args.experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(local, args.dim, args.hidden) * 0.02)
        self.w3 = nn.Parameter(torch.randn(local, args.dim, args.hidden) * 0.02)
        self.w2 = nn.Parameter(torch.randn(local, args.hidden, args.dim) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores, chosen = self.router(x).softmax(-1).topk(args.top_k, dim=-1)
        # each (token, choice) takes a slot of its expert: the slot is its rank among that expert's choices
        flat = chosen.reshape(-1)
        one_hot = nn.functional.one_hot(flat, args.experts)
        slot = ((one_hot.cumsum(0) - 1) * one_hot).sum(-1).clamp(max=capacity - 1)  # past capacity: the last slot
        index = flat * capacity + slot
        buffer = x.new_zeros(args.experts * capacity, args.dim)
        buffer = buffer.index_add(0, index, x.repeat_interleave(args.top_k, dim=0))
        received = all_to_all_single_autograd(buffer, None, None, dist.group.WORLD)
        tokens = received.view(world, local, capacity, args.dim).transpose(0, 1).reshape(local, -1, args.dim)
        hidden = nn.functional.silu(torch.bmm(tokens, self.w1)) * torch.bmm(tokens, self.w3)
        out = torch.bmm(hidden, self.w2).view(local, world, capacity, args.dim).transpose(0, 1).reshape(-1, args.dim)
        returned = all_to_all_single_autograd(out.contiguous(), None, None, dist.group.WORLD)
        combined = returned[index] * scores.reshape(-1, 1)
        return combined.view(-1, args.top_k, args.dim).sum(1)


model = nn.Sequential(nn.Linear(args.dim, args.dim), nn.GELU(), MoE(), nn.Linear(args.dim, args.dim)).to(device)
dense = [p for name, p in model.named_parameters() if not name.startswith("2.w")]
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(3):
    x = torch.randn(args.tokens, args.dim, device=device)
    model(x).square().mean().backward()
    for p in dense:  # the replicated parameters' gradients averaged; each expert's stay on its rank
        dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
    optimizer.step()
    optimizer.zero_grad()
