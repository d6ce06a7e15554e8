"""diffusers on `neuron`: a tiny UNet2D DDPM pipeline built from configs gives the CPU's images."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.optional
diffusers = pytest.importorskip("diffusers")


def _images(device: str) -> np.ndarray:
    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(16, 32),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8,
    )
    pipeline = diffusers.DDPMPipeline(unet=unet, scheduler=diffusers.DDPMScheduler(num_train_timesteps=50))
    pipeline.to(device)
    assert pipeline.device.type == device
    generator = torch.Generator().manual_seed(3)  # diffusers draws on the CPU, then moves to the device
    return pipeline(batch_size=2, generator=generator, num_inference_steps=4, output_type="np").images


def test_unet2d_pipeline_matches_cpu():
    expected = _images("cpu")
    images = _images("neuron")
    assert images.shape == (2, 16, 16, 3)
    np.testing.assert_allclose(images, expected, rtol=1e-4, atol=1e-4)
