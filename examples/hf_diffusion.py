"""A tiny diffusers DDPM pipeline (UNet2D from a config, random weights) on `neuron`, checked against the CPU."""

from __future__ import annotations

import numpy as np
import torch
from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel


def sample(device: str) -> np.ndarray:
    """Four denoising steps of two 16x16 images; the noise comes from a seeded CPU generator on both devices."""
    torch.manual_seed(0)
    unet = UNet2DModel(
        sample_size=16, block_out_channels=(16, 32), layers_per_block=1, norm_num_groups=8,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
    )
    pipeline = DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=50)).to(device)
    generator = torch.Generator().manual_seed(3)
    return pipeline(batch_size=2, generator=generator, num_inference_steps=4, output_type="np").images


if __name__ == "__main__":
    images = sample("neuron")
    np.testing.assert_allclose(images, sample("cpu"), rtol=1e-4, atol=1e-4)
    print(f"{images.shape[0]} images of {images.shape[1:]} on neuron == CPU")
