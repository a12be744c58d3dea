"""SDXL-style UNets and Flux transformers are refused up front, with the argument named, by the methods that do not
run them (Divide-and-Denoise), instead of failing inside the model."""

import pytest
import torch
from diffusers import UNet2DConditionModel
from test_grpo_flux import tiny_flux

from diffusers_ext import MultiDenoiserModel
from diffusers_ext.testing import get_tiny_sd_components


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
    "model, family", [(sdxl_style_unet, "addition_embed_type='text_time'"), (flux_transformer, "Flux")]
)
def test_divide_and_denoise_refuses_them(model, family):
    denoiser = model()
    with pytest.raises(ValueError, match=rf"`denoisers\[1\]` is .*{family}.*Divide-and-Denoise does not support"):
        MultiDenoiserModel([get_tiny_sd_components(0)["unet"], denoiser])
