"""Worker for test_diffusers.py: diffusers' tensor-parallel hook (`enable_parallelism` with a
`TensorParallelConfig`) on a tiny Flux transformer over a 2-rank `neuron` mesh, c10d backend `neuron`. Started by
torchrun; each rank writes its output and what it saw to `report-<rank>.json` in the working directory (files, not
stdout: the ranks' output interleaves)."""

import datetime
import json
from pathlib import Path

import torch
from diffusers import FluxTransformer2DModel


def model() -> FluxTransformer2DModel:
    """Same random weights on every rank and in the CPU reference (seeded)."""
    torch.manual_seed(0)
    return FluxTransformer2DModel(
        patch_size=1, in_channels=8, num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=4,
        joint_attention_dim=16, pooled_projection_dim=16, axes_dims_rope=[2, 2, 4],
    ).eval()


def inputs() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return {
        "hidden_states": torch.randn(2, 16, 8, generator=generator),
        "encoder_hidden_states": torch.randn(2, 6, 16, generator=generator),
        "pooled_projections": torch.randn(2, 16, generator=generator),
        "timestep": torch.tensor([0.5, 0.25]),
        "img_ids": torch.randn(16, 3, generator=generator),
        "txt_ids": torch.zeros(6, 3),
    }


def main() -> None:
    from diffusers import TensorParallelConfig
    from torch.distributed.tensor import DTensor

    # a rank whose peer died fails its collectives after this, instead of waiting for the default 10 minutes
    torch.distributed.init_process_group("neuron", timeout=datetime.timedelta(seconds=120))
    rank = torch.distributed.get_rank()
    net = model()
    net.enable_parallelism(config=TensorParallelConfig(tp_degree=torch.distributed.get_world_size()))
    net.to(f"neuron:{rank}")  # the parameters the plan leaves replicated (norms, embeddings)
    to_q = net.transformer_blocks[0].attn.to_q.weight
    with torch.no_grad():
        out = net(**{k: v.to(f"neuron:{rank}") for k, v in inputs().items()}).sample
    report = {
        "rank": rank,
        "backend": torch.distributed.get_backend(),
        "mesh_device": net._parallel_config.tensor_parallel_config._mesh.device_type,
        "to_q": [type(to_q).__name__, str(to_q.placements) if isinstance(to_q, DTensor) else "",
                 list(to_q.to_local().shape) if isinstance(to_q, DTensor) else [], str(to_q.device)],
        "output": out.cpu().tolist(),
    }
    Path(f"report-{rank}.json").write_text(json.dumps(report))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
