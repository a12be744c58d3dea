"""Dummy setup of [`SemanticNVSPipeline`] for tests and the conformance suite (see `diffusers_ext.testing`).

A 16x16 three-view procedural scene (one input view, two targets), a tiny multi-view UNet and a tiny DINOv2
semantic encoder (patch 4), DDIM with 2 steps and guidance 2.0 in `"warped+iterative"` mode.
"""

import torch
from diffusers import DDIMScheduler
from transformers import Dinov2Config, Dinov2Model

from ...data.procedural_scenes import random_scene, render_orbit
from ...models.semantic_multiview_unet import SemanticMultiViewUNetModel
from ...pipelines.semantic_nvs.pipeline_semantic_nvs import SemanticNVSPipeline
from ..registry import BadInput, register_dummy_pipeline


SIZE = 16
SEMANTIC_CHANNELS = 8


def get_components(seed: int = 0) -> dict:
    """`unet` (16x16 multi-view UNet, 8 semantic channels), `scheduler` (DDIM, 100 steps), `semantic_encoder`."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    unet = SemanticMultiViewUNetModel(
        sample_size=SIZE,
        semantic_channels=SEMANTIC_CHANNELS,
        block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=4,
        attention_head_dim=4,
    ).eval()
    encoder = Dinov2Model(
        Dinov2Config(
            hidden_size=SEMANTIC_CHANNELS,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=16,
            patch_size=4,
            image_size=SIZE,
        )
    ).eval()
    torch.random.set_rng_state(generator_state)
    return {"unet": unet, "scheduler": DDIMScheduler(num_train_timesteps=100), "semantic_encoder": encoder}


def _scene(seed: int) -> dict:
    return render_orbit(random_scene(torch.Generator().manual_seed(seed), num_objects=2), 3, SIZE, sweep_deg=40)


def get_inputs(seed: int = 0) -> dict:
    """One scene (batch 1): view 0 as input with its depth, views 1-2 as targets."""
    scene = _scene(seed)
    return {
        "images": scene["images"][None, :1],
        "input_intrinsics": scene["intrinsics"][None, :1],
        "input_c2w": scene["c2w"][None, :1],
        "target_intrinsics": scene["intrinsics"][None, 1:],
        "target_c2w": scene["c2w"][None, 1:],
        "depths": scene["depths"][None, :1],
        "semantic_mode": "warped+iterative",
        "num_inference_steps": 2,
        "guidance_scale": 2.0,
        "generator": torch.Generator("cpu").manual_seed(seed),
        "output_type": "np",
    }


def get_ragged_inputs(seed: int = 0) -> dict:
    """As `get_inputs` with one-scene lists; scene `seed` has `1 + seed % 2` input views and two targets, so scenes of
    seeds 0 and 1 differ in their number of input views."""
    num_inputs = 1 + seed % 2
    scene = render_orbit(
        random_scene(torch.Generator().manual_seed(seed), num_objects=2), num_inputs + 2, SIZE, sweep_deg=40
    )
    inputs, targets = slice(0, num_inputs), slice(num_inputs, None)
    return {
        **get_inputs(seed),
        "images": [scene["images"][inputs]],
        "input_intrinsics": [scene["intrinsics"][inputs]],
        "input_c2w": [scene["c2w"][inputs]],
        "target_intrinsics": [scene["intrinsics"][targets]],
        "target_c2w": [scene["c2w"][targets]],
        "depths": [scene["depths"][inputs]],
    }


BAD_INPUTS = [
    BadInput({"semantic_mode": "dino"}, "semantic_mode"),
    BadInput({"iterative_start": 1.5}, "iterative_start"),
    BadInput({"num_inference_steps": 0}, "num_inference_steps"),
    BadInput({"output_type": "jpeg"}, "output_type"),
    BadInput({"images": torch.rand(1, 1, 3, 8, 8)}, "images"),
    BadInput({"images": torch.rand(1, 1, 3, SIZE, SIZE) * 2 - 1}, "images"),
    BadInput({"input_c2w": 2 * torch.eye(4).expand(1, 1, 4, 4)}, "input_c2w"),
    BadInput({"target_c2w": torch.eye(4).expand(1, 3, 4, 4)}, "target_c2w"),
    BadInput({"depths": None}, "depths"),
    BadInput({"depths": torch.zeros(1, 1, 1, SIZE, SIZE)}, "depths"),
    BadInput({"latents": torch.zeros(1, 2, 3, 8, 8)}, "latents"),
    BadInput({"num_images_per_prompt": 0}, "num_images_per_prompt"),
    BadInput({"callback_on_step_end_tensor_inputs": ["unet"]}, "callback_on_step_end_tensor_inputs"),
]

register_dummy_pipeline(
    SemanticNVSPipeline,
    get_components,
    get_inputs,
    batch_params=("images", "input_intrinsics", "input_c2w", "target_intrinsics", "target_c2w", "depths"),
    output_types=("pil", "np", "pt", "latent"),
    bad_inputs=BAD_INPUTS,
    callback_edit_tensor="latents",
    ragged_inputs_fn=get_ragged_inputs,
)
