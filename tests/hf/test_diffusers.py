"""diffusers on `neuron`: tiny UNet2D (DDPM), DiT, Stable Diffusion XL and Flux pipelines built from configs give the
CPU's images, and diffusers' tensor-parallel hook shards a tiny Flux transformer over a 2-rank `neuron` mesh with the
CPU's output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.optional
diffusers = pytest.importorskip("diffusers")

TP_SCRIPT = Path(__file__).with_name("diffusers_tp.py")


def _run(pipeline, device: str, **call) -> np.ndarray:
    """Images of `pipeline` on `device`; the noise comes from a seeded CPU generator (diffusers draws on the CPU, then
    moves to the device), so both devices start from the same latents."""
    pipeline.to(device)
    assert pipeline.device.type == device
    return pipeline(generator=torch.Generator().manual_seed(3), num_inference_steps=4, output_type="np", **call).images


def _ddpm() -> diffusers.DDPMPipeline:
    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(16, 32),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8,
    )
    return diffusers.DDPMPipeline(unet=unet, scheduler=diffusers.DDPMScheduler(num_train_timesteps=50))


def _dit() -> diffusers.DiTPipeline:
    """Class-conditional DiT (adaLN-zero blocks, 1000 classes + the null class guidance uses) and a one-level VAE."""
    torch.manual_seed(0)
    transformer = diffusers.DiTTransformer2DModel(
        sample_size=8, num_layers=2, patch_size=2, attention_head_dim=8, num_attention_heads=2, in_channels=4,
        out_channels=8, attention_bias=True, activation_fn="gelu-approximate", num_embeds_ada_norm=1000,
        norm_type="ada_norm_zero", norm_elementwise_affine=False,
    )
    vae = diffusers.AutoencoderKL(block_out_channels=(16,), norm_num_groups=8, latent_channels=4, sample_size=16)
    # eval(), as from_pretrained leaves them: in training mode DiT drops class labels at random (label dropout)
    return diffusers.DiTPipeline(
        transformer=transformer.eval(), vae=vae.eval(), scheduler=diffusers.DDIMScheduler(num_train_timesteps=50),
        id2label={0: "zero", 1: "one"},
    )


def _sdxl() -> diffusers.StableDiffusionXLPipeline:
    """SDXL's conditional UNet (cross-attention, "text_time" added conditions) and a one-level VAE; no text encoders
    or tokenizers (they would need downloaded vocabularies): the call passes prompt embeddings."""
    torch.manual_seed(0)
    unet = diffusers.UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(16, 32),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32, attention_head_dim=(2, 4), norm_num_groups=8, use_linear_projection=True,
        addition_embed_type="text_time", addition_time_embed_dim=8, projection_class_embeddings_input_dim=32 + 6 * 8,
    )
    vae = diffusers.AutoencoderKL(block_out_channels=(16,), norm_num_groups=8, latent_channels=4, sample_size=16)
    return diffusers.StableDiffusionXLPipeline(
        vae=vae.eval(), text_encoder=None, text_encoder_2=None, tokenizer=None, tokenizer_2=None, unet=unet.eval(),
        scheduler=diffusers.EulerDiscreteScheduler(num_train_timesteps=50),
    )


def _flux() -> diffusers.FluxPipeline:
    """Flux's MMDiT (joint and single-stream blocks, 3-axis RoPE), a one-level VAE with Flux's latent shift and the
    flow-matching scheduler; no text encoders (the call passes T5 and CLIP embeddings)."""
    torch.manual_seed(0)
    transformer = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[2, 2, 4],
    )
    vae = diffusers.AutoencoderKL(block_out_channels=(16,), norm_num_groups=8, latent_channels=4, sample_size=16,
                                  shift_factor=0.0609, scaling_factor=1.5035)
    return diffusers.FluxPipeline(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=vae.eval(), text_encoder=None, tokenizer=None,
        text_encoder_2=None, tokenizer_2=None, transformer=transformer.eval(),
    )


def test_unet2d_pipeline_matches_cpu():
    expected = _run(_ddpm(), "cpu", batch_size=2)
    images = _run(_ddpm(), "neuron", batch_size=2)
    assert images.shape == (2, 16, 16, 3)
    np.testing.assert_allclose(images, expected, rtol=1e-4, atol=1e-4)


def test_dit_pipeline_matches_cpu():
    call = {"class_labels": [0, 1], "guidance_scale": 2.0}
    expected = _run(_dit(), "cpu", **call)
    images = _run(_dit(), "neuron", **call)
    assert images.shape == (2, 8, 8, 3) and images.std() > 0.01  # not a saturated (all-0/all-1) image
    np.testing.assert_allclose(images, expected, rtol=1e-4, atol=1e-4)


def test_sdxl_pipeline_takes_its_neuron_path_and_matches_cpu():
    """SDXL's pipeline has a `neuron` branch of its own (timesteps kept on the CPU, cast to float32 on the device
    for the UNet); with classifier-free guidance on prompt embeddings it gives the CPU's images."""
    generator = torch.Generator().manual_seed(1)
    call = {"prompt_embeds": torch.randn(1, 7, 32, generator=generator),
            "pooled_prompt_embeds": torch.randn(1, 32, generator=generator),
            "height": 16, "width": 16, "guidance_scale": 3.0}
    expected = _run(_sdxl(), "cpu", **call)
    images = _run(_sdxl(), "neuron", **call)
    assert images.shape == (1, 16, 16, 3) and images.std() > 0.01
    np.testing.assert_allclose(images, expected, rtol=1e-4, atol=1e-4)


def test_flux_pipeline_matches_cpu():
    """The embeddings go in on the pipeline's device: Flux's pipeline does not move given embeddings itself."""
    generator = torch.Generator().manual_seed(2)
    embeddings = {"prompt_embeds": torch.randn(1, 6, 32, generator=generator),
                  "pooled_prompt_embeds": torch.randn(1, 32, generator=generator)}
    expected = _run(_flux(), "cpu", height=16, width=16, **embeddings)
    images = _run(_flux(), "neuron", height=16, width=16, **{k: v.to("neuron") for k, v in embeddings.items()})
    assert images.shape == (1, 16, 16, 3) and images.std() > 0.01
    np.testing.assert_allclose(images, expected, rtol=1e-4, atol=1e-4)


def _tp_reference() -> torch.Tensor:
    sys.path.insert(0, str(TP_SCRIPT.parent))
    try:
        import diffusers_tp as script
    finally:
        sys.path.pop(0)
    with torch.no_grad():
        return script.model()(**script.inputs()).sample


@pytest.mark.multiprocess
def test_tensor_parallel_flux_on_two_neuron_ranks_matches_cpu(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(TP_SCRIPT)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    reports = [json.loads((tmp_path / f"report-{rank}.json").read_text()) for rank in (0, 1)]
    expected = _tp_reference()
    for rank, report in enumerate(reports):
        assert (report["rank"], report["backend"], report["mesh_device"]) == (rank, "neuron", "neuron")
        # diffusers' neuron path: each rank holds its half of the column-sharded projection on its own core
        assert report["to_q"] == ["DTensor", "(Shard(dim=0),)", [16, 32], f"neuron:{rank}"]
        torch.testing.assert_close(torch.tensor(report["output"]), expected, rtol=1e-4, atol=1e-5)
