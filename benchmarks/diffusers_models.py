"""diffusers sweep: every model class diffusers exports, tiny and random, forward + backward on `neuron` vs CPU; and
the pipeline families that run offline from tiny components, a few seeded steps, images vs CPU.

Models: each `ModelMixin` subclass diffusers exports is built from its `__init__` defaults shrunken by name (one
layer, two attention heads, 32 channels per block, a 16 x 16 sample; a dimension that equalled the default inner
width heads x head_dim follows it down), its inputs are generated from its `forward` signature (sample or hidden
states in the layout of its kind, timesteps, text embeddings, pooled projections, position ids), and forward +
backward is compared with the CPU: every output tensor and every parameter gradient. Classes that do not build or
run on the CPU this way are listed as `cpu-fail` and not counted. Pipelines: see `PIPELINES`.

    python benchmarks/diffusers_models.py [--compile] [--only UNet2DModel,...] [--pipelines] [--json FILE
                                          [--skip-done]] [--timeout SECONDS] [--jobs N] [--shuffle SEED]
                                          [--budget SECONDS]
"""

from __future__ import annotations

import argparse
import inspect
import os
import random
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import _sweep
import diffusers
import numpy as np
import torch
from _sweep import Result

BATCH, SIDE, FRAMES, LENGTH, TEXT = 2, 16, 5, 64, 7
# Shrunken values by `__init__` parameter name (set only where the default is larger, and on every element of a
# tuple default).
SMALLER = {
    **dict.fromkeys(("num_layers", "num_single_layers", "num_refiner_layers", "layers_per_block", "num_res_blocks",
                     "transformer_layers_per_block", "num_encoder_layers", "num_decoder_layers", "depth",
                     "num_mid_layers", "num_blocks", "n_layers"), 1),
    "num_attention_heads": 2,
    **dict.fromkeys(("block_out_channels", "decoder_block_out_channels", "encoder_block_out_channels",
                     "conditioning_embedding_out_channels", "base_dim", "decoder_base_dim"), 32),
    **dict.fromkeys(("sample_size", "sample_width", "sample_height"), SIDE),
    **dict.fromkeys(("sample_frames", "num_frames"), FRAMES),
    "max_text_seq_length": TEXT,
}
# Where a model's text embeddings come from, first found wins.
TEXT_DIMS = ("cross_attention_dim", "joint_attention_dim", "text_embed_dim", "caption_channels", "text_dim",
             "encoder_hid_dim", "context_dim", "text_hidden_dim", "caption_dim")
POOLED_DIMS = ("pooled_projection_dim", "pooled_projection_dims", "text_pooled_dim")
FRAMES_BEFORE_CHANNELS = ("CogVideoX", "ConsisID")  # video transformers that take (batch, frames, channels, h, w)
SPATIAL_SCALES = ("scale_factor_spatial", "spatial_compression_ratio")


def model_classes() -> list[str]:
    return sorted(name for name in dir(diffusers) if name != "ModelMixin"
                  and isinstance(getattr(diffusers, name, None), type)
                  and issubclass(getattr(diffusers, name), diffusers.ModelMixin))


def tiny_init(cls: type) -> dict:
    """`__init__` arguments that shrink `cls`'s defaults."""
    defaults = {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
                if p.default is not inspect.Parameter.empty}
    kwargs = {}
    for name, small in SMALLER.items():
        value = defaults.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > small:
            kwargs[name] = small
        elif isinstance(value, (tuple, list)) and value and all(isinstance(v, int) for v in value):
            kwargs[name] = type(value)(min(v, small) for v in value)
    heads, head_dim = defaults.get("num_attention_heads"), defaults.get("attention_head_dim")
    if isinstance(heads, int) and isinstance(head_dim, int) and "num_attention_heads" in kwargs:
        wide, narrow = heads * head_dim, kwargs["num_attention_heads"] * head_dim
        for name, value in defaults.items():  # dimensions that must equal the inner width follow it
            if value == wide and name not in kwargs and isinstance(value, int):
                kwargs[name] = narrow
    return kwargs


def _dims(config: dict, names: tuple[str, ...]) -> int | None:
    value = next((config[n] for n in names if config.get(n) is not None), None)
    return value[0] if isinstance(value, (tuple, list)) else value


def _sample_shape(model: torch.nn.Module, channels: int) -> tuple[int, ...]:
    """The layout of the main input: named by the class (video, audio), else that of its first convolution."""
    name = type(model).__name__
    first_conv = next((type(m) for m in model.modules() if isinstance(m, torch.nn.modules.conv._ConvNd)), None)
    video = ("3D", "Video", "Temporal", "Motion", "Wan")
    if any(word in name for word in video) or first_conv in (torch.nn.Conv3d, torch.nn.ConvTranspose3d):
        if name.startswith(FRAMES_BEFORE_CHANNELS):
            return BATCH, FRAMES, channels, SIDE, SIDE
        return BATCH, channels, FRAMES, SIDE, SIDE
    if any(word in name for word in ("1D", "Audio", "Oobleck")) or first_conv is torch.nn.Conv1d:
        return BATCH, channels, LENGTH
    return BATCH, channels, SIDE, SIDE


def make_inputs(model: torch.nn.Module) -> dict[str, object]:
    """Inputs for `model.forward` from its signature and config."""
    config = dict(model.config)
    params = inspect.signature(model.forward).parameters
    generator = torch.Generator().manual_seed(1)
    channels = config.get("in_channels") or config.get("latent_channels") or 4
    inputs: dict[str, object] = {}
    main = next((p for p in ("sample", "hidden_states", "x") if p in params), None)
    packed = "img_ids" in params
    if main:
        if packed:  # Flux-style: patch tokens already packed, with their (t, h, w) position ids
            shape: tuple[int, ...] = (BATCH, (SIDE // 2) ** 2, channels)
        else:
            shape = _sample_shape(model, channels)
        inputs[main] = torch.randn(shape, generator=generator)
    for timestep in ("timestep", "timesteps", "t"):
        if timestep in params:
            inputs[timestep] = torch.tensor([3, 7])
    text = _dims(config, TEXT_DIMS)
    if "encoder_hidden_states" in params and isinstance(text, int):
        inputs["encoder_hidden_states"] = torch.randn(BATCH, TEXT, text, generator=generator)
    if "encoder_attention_mask" in params and "encoder_hidden_states" in inputs:  # every text token attended
        inputs["encoder_attention_mask"] = torch.ones(BATCH, TEXT)
    pooled = _dims(config, POOLED_DIMS)
    if "pooled_projections" in params and isinstance(pooled, int):
        inputs["pooled_projections"] = torch.randn(BATCH, pooled, generator=generator)
    if packed:
        side = SIDE // 2
        grid = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij"), -1).reshape(-1, 2)
        inputs["img_ids"] = torch.cat([torch.zeros(side * side, 1), grid.float()], 1)
        inputs["txt_ids"] = torch.zeros(TEXT, 3)
    if "class_labels" in params and config.get("num_embeds_ada_norm"):
        inputs["class_labels"] = torch.tensor([1, 2])
    if "controlnet_cond" in params:
        inputs["controlnet_cond"] = torch.randn(BATCH, config.get("conditioning_channels") or 3, SIDE * 8, SIDE * 8,
                                                generator=generator)
    if "guidance" in params and config.get("guidance_embeds"):
        inputs["guidance"] = torch.tensor([3.5, 3.5])
    if "sample_posterior" in params:  # the mean, not a draw: a compiled graph draws other numbers than eager does
        inputs["sample_posterior"] = False
    if "return_dict" in params:
        inputs["return_dict"] = False
    return inputs


def _forward_backward(model: torch.nn.Module, inputs: dict, compiled: bool) -> tuple[object, dict]:
    forward = torch.compile(model, backend="neuron", dynamic=False) if compiled else model
    torch.manual_seed(0)
    out = forward(**inputs)
    _sweep.scalar(out).backward()
    return out, _sweep.gradients(model)


def _on(device: str, inputs: dict) -> dict:
    return {name: value.to(device) if isinstance(value, torch.Tensor) else value for name, value in inputs.items()}


def _seeded(cls: type) -> torch.nn.Module:
    torch.manual_seed(0)
    return cls(**tiny_init(cls)).eval()


def check(class_name: str, compiled: bool = False) -> Result:
    """Forward + backward of one diffusers model class on `neuron` against the CPU."""
    mode = "compile" if compiled else "eager"
    start = time.perf_counter()
    try:
        cls = getattr(diffusers, class_name)
        cpu_model, dev_model = (_seeded(cls) for _ in range(2))  # not deepcopy: weight_norm's weights refuse it
        dev_model.load_state_dict(cpu_model.state_dict())
        inputs = make_inputs(cpu_model)
        cpu_out, cpu_grads = _forward_backward(cpu_model, inputs, compiled=False)
    except Exception as error:
        return Result(class_name, "cpu-fail", _sweep.reason(error), time.perf_counter() - start, "model", mode)
    _sweep.cpu_reference_done()
    try:
        out, grads = _forward_backward(dev_model.to(_sweep.DEVICE), _on(_sweep.DEVICE, inputs), compiled)
        _sweep.compare_outputs(cpu_out, out)
        _sweep.compare_gradients(cpu_grads, grads)
    except Exception as error:
        return Result(class_name, "fail", _sweep.reason(error), time.perf_counter() - start, "model", mode)
    return Result(class_name, "pass", "", time.perf_counter() - start, "model", mode)


# ----------------------------------------------------------------------------------------------------------------
# Pipelines: each family from tiny components (no text encoders: the calls pass prompt embeddings).


def _vae(**extra) -> diffusers.AutoencoderKL:
    return diffusers.AutoencoderKL(block_out_channels=(16,), norm_num_groups=8, latent_channels=4, sample_size=16,
                                   **extra).eval()


def _unet2d() -> diffusers.UNet2DModel:
    return diffusers.UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(16, 32),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8,
    ).eval()


def _unet_condition(**extra) -> diffusers.UNet2DConditionModel:
    return diffusers.UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(16, 32),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32, attention_head_dim=(2, 4), norm_num_groups=8, **extra,
    ).eval()


def _embeds(*shapes: tuple[int, ...]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    return [torch.randn(shape, generator=generator) for shape in shapes]


def _ddpm() -> tuple[object, dict]:
    return diffusers.DDPMPipeline(unet=_unet2d(), scheduler=diffusers.DDPMScheduler(num_train_timesteps=50)), {
        "batch_size": 2}


def _ddim() -> tuple[object, dict]:
    return diffusers.DDIMPipeline(unet=_unet2d(), scheduler=diffusers.DDIMScheduler(num_train_timesteps=50)), {
        "batch_size": 2}


def _dit() -> tuple[object, dict]:
    transformer = diffusers.DiTTransformer2DModel(
        sample_size=8, num_layers=2, patch_size=2, attention_head_dim=8, num_attention_heads=2, in_channels=4,
        out_channels=8, attention_bias=True, activation_fn="gelu-approximate", num_embeds_ada_norm=1000,
        norm_type="ada_norm_zero", norm_elementwise_affine=False,
    ).eval()
    pipeline = diffusers.DiTPipeline(transformer=transformer, vae=_vae(),
                                     scheduler=diffusers.DDIMScheduler(num_train_timesteps=50),
                                     id2label={0: "zero", 1: "one"})
    return pipeline, {"class_labels": [0, 1], "guidance_scale": 2.0}


def _stable_diffusion() -> tuple[object, dict]:
    pipeline = diffusers.StableDiffusionPipeline(
        vae=_vae(), text_encoder=None, tokenizer=None, unet=_unet_condition(),
        scheduler=diffusers.PNDMScheduler(num_train_timesteps=50, skip_prk_steps=True), safety_checker=None,
        feature_extractor=None, requires_safety_checker=False,
    )
    positive, negative = _embeds((1, 7, 32), (1, 7, 32))
    return pipeline, {"prompt_embeds": positive, "negative_prompt_embeds": negative, "height": 16, "width": 16,
                      "guidance_scale": 3.0}


def _sdxl() -> tuple[object, dict]:
    unet = _unet_condition(use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=8,
                           projection_class_embeddings_input_dim=32 + 6 * 8)
    pipeline = diffusers.StableDiffusionXLPipeline(
        vae=_vae(), text_encoder=None, text_encoder_2=None, tokenizer=None, tokenizer_2=None, unet=unet,
        scheduler=diffusers.EulerDiscreteScheduler(num_train_timesteps=50),
    )
    prompt, pooled = _embeds((1, 7, 32), (1, 32))
    return pipeline, {"prompt_embeds": prompt, "pooled_prompt_embeds": pooled, "height": 16, "width": 16,
                      "guidance_scale": 3.0}


def _sd3() -> tuple[object, dict]:
    transformer = diffusers.SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=32, caption_projection_dim=16, pooled_projection_dim=32, out_channels=4,
        pos_embed_max_size=16,
    ).eval()
    pipeline = diffusers.StableDiffusion3Pipeline(
        transformer=transformer, scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=_vae(shift_factor=0.0),
        text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None, text_encoder_3=None,
        tokenizer_3=None,
    )
    prompt, negative, pooled, negative_pooled = _embeds((1, 7, 32), (1, 7, 32), (1, 32), (1, 32))
    return pipeline, {"prompt_embeds": prompt, "negative_prompt_embeds": negative, "pooled_prompt_embeds": pooled,
                      "negative_pooled_prompt_embeds": negative_pooled, "height": 16, "width": 16,
                      "guidance_scale": 3.0}


def _flux() -> tuple[object, dict]:
    transformer = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=8, num_attention_heads=2,
        joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[2, 2, 4],
    ).eval()
    pipeline = diffusers.FluxPipeline(
        scheduler=diffusers.FlowMatchEulerDiscreteScheduler(), vae=_vae(shift_factor=0.0609, scaling_factor=1.5035),
        text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None, transformer=transformer,
    )
    prompt, pooled = _embeds((1, 6, 32), (1, 32))
    return pipeline, {"prompt_embeds": prompt, "pooled_prompt_embeds": pooled, "height": 16, "width": 16}


def _pixart() -> tuple[object, dict]:
    transformer = diffusers.PixArtTransformer2DModel(
        sample_size=8, num_layers=1, patch_size=2, attention_head_dim=8, num_attention_heads=2, in_channels=4,
        out_channels=8, cross_attention_dim=16, caption_channels=32, norm_num_groups=8,
    ).eval()
    pipeline = diffusers.PixArtSigmaPipeline(tokenizer=None, text_encoder=None, vae=_vae(), transformer=transformer,
                                             scheduler=diffusers.DPMSolverMultistepScheduler(num_train_timesteps=50))
    return pipeline, {**_masked_prompts(32), "height": 16, "width": 16, "guidance_scale": 3.0,
                      "use_resolution_binning": False}


def _wan() -> tuple[object, dict]:
    transformer = diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
        text_dim=32, freq_dim=16, ffn_dim=32, num_layers=1, rope_max_seq_len=32,
    ).eval()
    vae = diffusers.AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                     temperal_downsample=[False, True, True], latents_mean=[0.0] * 4,
                                     latents_std=[1.0] * 4).eval()
    pipeline = diffusers.WanPipeline(tokenizer=None, text_encoder=None, transformer=transformer, vae=vae,
                                     scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0))
    prompt, negative = _embeds((1, 7, 32), (1, 7, 32))
    return pipeline, {"prompt_embeds": prompt, "negative_prompt_embeds": negative, "height": 16, "width": 16,
                      "num_frames": 5, "guidance_scale": 3.0}


def _masked_prompts(width: int) -> dict:
    """Prompt and negative-prompt embeddings with their attention masks (T5/Gemma-encoded pipelines)."""
    prompt, negative = _embeds((1, TEXT, width), (1, TEXT, width))
    mask = torch.ones(1, TEXT, dtype=torch.long)
    return {"prompt_embeds": prompt, "prompt_attention_mask": mask, "negative_prompt": None,
            "negative_prompt_embeds": negative, "negative_prompt_attention_mask": mask}


def _auraflow() -> tuple[object, dict]:
    transformer = diffusers.AuraFlowTransformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_mmdit_layers=1, num_single_dit_layers=1,
        attention_head_dim=8, num_attention_heads=2, caption_projection_dim=16, joint_attention_dim=32,
        out_channels=4, pos_embed_max_size=64,
    ).eval()
    pipeline = diffusers.AuraFlowPipeline(tokenizer=None, text_encoder=None, vae=_vae(), transformer=transformer,
                                          scheduler=diffusers.FlowMatchEulerDiscreteScheduler())
    return pipeline, {**_masked_prompts(32), "height": 16, "width": 16, "guidance_scale": 3.0}


def _sana() -> tuple[object, dict]:
    transformer = diffusers.SanaTransformer2DModel(
        patch_size=1, in_channels=4, out_channels=4, num_layers=1, num_attention_heads=2, attention_head_dim=4,
        num_cross_attention_heads=2, cross_attention_head_dim=4, cross_attention_dim=8, caption_channels=8,
        sample_size=16,
    ).eval()
    vae = diffusers.AutoencoderDC(
        in_channels=3, latent_channels=4, attention_head_dim=2, encoder_block_types=("ResBlock", "EfficientViTBlock"),
        decoder_block_types=("ResBlock", "EfficientViTBlock"), encoder_block_out_channels=(8, 8),
        decoder_block_out_channels=(8, 8), encoder_qkv_multiscales=((), (5,)), decoder_qkv_multiscales=((), (5,)),
        encoder_layers_per_block=(1, 1), decoder_layers_per_block=[1, 1], downsample_block_type="conv",
        upsample_block_type="interpolate", decoder_norm_types="rms_norm", decoder_act_fns="silu",
        scaling_factor=0.41407,
    ).eval()
    pipeline = diffusers.SanaPipeline(tokenizer=None, text_encoder=None, vae=vae, transformer=transformer,
                                      scheduler=diffusers.FlowMatchEulerDiscreteScheduler(shift=7.0))
    return pipeline, {**_masked_prompts(8), "height": 32, "width": 32, "guidance_scale": 3.0,
                      "use_resolution_binning": False, "complex_human_instruction": None}


PIPELINES = {"ddpm": _ddpm, "ddim": _ddim, "dit": _dit, "stable-diffusion": _stable_diffusion, "sdxl": _sdxl,
             "sd3": _sd3, "flux": _flux, "pixart-sigma": _pixart, "wan": _wan, "auraflow": _auraflow, "sana": _sana}


def _images(build, device: str) -> np.ndarray:
    torch.manual_seed(0)
    pipeline, call = build()
    pipeline.to(device)
    call = {name: value.to(device) if isinstance(value, torch.Tensor) else value for name, value in call.items()}
    out = pipeline(generator=torch.Generator().manual_seed(3), num_inference_steps=3, output_type="np", **call)
    return np.asarray(out.frames if hasattr(out, "frames") else out.images)


def check_pipeline(family: str) -> Result:
    """A few seeded denoising steps of one pipeline family on `neuron` against the CPU's images."""
    start = time.perf_counter()
    try:
        expected = _images(PIPELINES[family], "cpu")
    except Exception as error:
        return Result(family, "cpu-fail", _sweep.reason(error), time.perf_counter() - start, "pipeline")
    _sweep.cpu_reference_done()
    try:
        _sweep.compare(torch.from_numpy(expected), torch.from_numpy(_images(PIPELINES[family], _sweep.DEVICE)),
                       "images")
    except Exception as error:
        return Result(family, "fail", _sweep.reason(error), time.perf_counter() - start, "pipeline")
    return Result(family, "pass", "", time.perf_counter() - start, "pipeline")


def check_pair(name: str, task: str, compiled: bool) -> Result:
    """A worker's check of one model class (task "model") or pipeline family (task "pipeline", eager only)."""
    return check_pipeline(name) if task == "pipeline" else check(name, compiled=compiled)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _sweep.add_arguments(parser)
    parser.add_argument("--only", default="", help="comma-separated model classes or pipeline families")
    parser.add_argument("--pipelines", action="store_true", help="sweep the pipeline families, not the models")
    args = _sweep.parse_args(parser, argv)
    if args.serve:
        _sweep.serve(check_pair, args.compile, args.memory_gb)
        return 0
    if args.table is not None:
        results = [r for path in args.table for r in _sweep.load(path).values()]
        print("\n\n".join((_sweep.summary(results), _sweep.totals(results), _sweep.failures(results))))
        return 0
    names = list(PIPELINES) if args.pipelines else model_classes()
    if args.only:
        names = [name for name in names if name in args.only.split(",")]
    if args.shuffle is not None:
        random.Random(args.shuffle).shuffle(names)
    task = "pipeline" if args.pipelines else "model"
    results = _sweep.drive(__file__, {name: [task] for name in names}, compiled=args.compile, timeout=args.timeout,
                           json_path=args.json, skip_done=args.skip_done, budget=args.budget, jobs=args.jobs,
                           memory_gb=args.memory_gb)
    print("\n" + "\n\n".join((_sweep.summary(results), _sweep.totals(results), _sweep.failures(results))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
