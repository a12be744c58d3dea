"""SDXL-style UNets and Flux transformers are refused up front, with the argument named, by the methods that do not
run them (DIRP, constrained unlearning), instead of failing inside the model. (Divide-and-Denoise runs them:
tests/test_divide_and_denoise_families.py.)"""

import pytest
import torch
from diffusers import DDPMScheduler, FluxPipeline, StableDiffusion3Pipeline, UNet2DConditionModel
from test_grpo_flux import tiny_flux

from diffusers_ext import ConstrainedUnlearningConfig, ConstrainedUnlearningTrainer, DIRPPipeline
from diffusers_ext.testing import get_tiny_flux_components, get_tiny_sd3_components, get_tiny_sd_components


def sdxl_style_unet():
    torch.manual_seed(0)
    return UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=(2, 4),
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=80,
        norm_num_groups=32,
    )


def flux_transformer():
    return tiny_flux().transformer


@pytest.mark.parametrize(
    "model, family",
    [
        pytest.param(
            sdxl_style_unet,
            "addition_embed_type='text_time'",
            marks=pytest.mark.support_cell("dirp", "sdxl", status="refused"),
        ),
        pytest.param(flux_transformer, "Flux", marks=pytest.mark.support_cell("dirp", "flux", status="refused")),
    ],
)
def test_dirp_refuses_them(model, family):
    denoiser = model()
    with pytest.raises(ValueError, match=rf"`unet` is .*{family}.*DIRPPipeline does not support"):
        DIRPPipeline(unet=denoiser, scheduler=DDPMScheduler())


@pytest.mark.support_cell("unlearning", "sdxl", status="refused")
def test_constrained_unlearning_refuses_an_sdxl_style_unet():
    from diffusers import StableDiffusionPipeline

    components = get_tiny_sd_components(0)
    pipe = StableDiffusionPipeline(**{**components, "unet": sdxl_style_unet()})
    config = ConstrainedUnlearningConfig(output_dir="unused", forget_prompts=["a cat"], retain_prompts=["a dog"])
    with pytest.raises(ValueError, match="`pipeline.unet` is a UNet with `addition_embed_type='text_time'`"):
        ConstrainedUnlearningTrainer(pipe, config)


@pytest.mark.support_cell("dirp", "sd3", status="refused")
def test_dirp_refuses_an_sd3_transformer_with_its_flow_matching_scheduler():
    components = get_tiny_sd3_components(0)
    pipe = DIRPPipeline(unet=components["transformer"], scheduler=components["scheduler"], vae=components["vae"])
    with pytest.raises(TypeError, match="DDIM inversion reads the noise schedule `alphas_cumprod`.*flow matching"):
        pipe(torch.rand(1, 3, 32, 32), num_inversion_steps=2, num_iterations=1)


@pytest.mark.parametrize(
    "pipeline",
    [
        pytest.param(
            lambda: StableDiffusion3Pipeline(**get_tiny_sd3_components(0)),
            marks=pytest.mark.support_cell("unlearning", "sd3", status="refused"),
            id="sd3",
        ),
        pytest.param(
            lambda: FluxPipeline(**get_tiny_flux_components(0)),
            marks=pytest.mark.support_cell("unlearning", "flux", status="refused"),
            id="flux",
        ),
    ],
)
def test_constrained_unlearning_refuses_flow_matching_transformer_pipelines(pipeline):
    pipe = pipeline()
    config = ConstrainedUnlearningConfig(output_dir="unused", forget_prompts=["a cat"], retain_prompts=["a dog"])
    with pytest.raises(
        TypeError, match=rf"`pipeline` must be .*UNet2DModel or UNet2DConditionModel, got {type(pipe).__name__}"
    ):
        ConstrainedUnlearningTrainer(pipe, config)
