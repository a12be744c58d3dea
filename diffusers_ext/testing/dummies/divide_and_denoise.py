"""Dummy setup of [`DivideAndDenoisePipeline`] for tests and the conformance suite (see `diffusers_ext.testing`).

One tiny 8x8 one-channel class-conditional UNet (3 classes plus the null class 3) shared by two agents (classes 0
and 1), a DDIM scheduler, and calls of 2 steps with `guidance_scale=2.0` on a 8x12 canvas (wider than the model's
native 8x8), so that guidance, the fair division and the alignment step all run.
"""

import torch
from diffusers import DDIMScheduler

from ...models.tiny_components import get_tiny_pixel_unet
from ...pipelines.divide_and_denoise.baseline_allocators import RegionAllocator
from ...pipelines.divide_and_denoise.denoisers import MultiDenoiserModel
from ...pipelines.divide_and_denoise.pipeline_divide_and_denoise import DivideAndDenoisePipeline
from ..registry import BadInput, register_dummy_pipeline


NUM_CLASSES = 3
NULL_CLASS_LABEL = NUM_CLASSES
SAMPLE_SIZE = 8
CANVAS_WIDTH = 12


def get_components(seed: int = 0) -> dict:
    """`denoisers` (one tiny class-conditional UNet), a 100-step `DDIMScheduler`, and `null_class_label=3`."""
    unet = get_tiny_pixel_unet(seed=seed, sample_size=SAMPLE_SIZE, in_channels=1, num_class_embeds=NUM_CLASSES + 1)
    return {
        "denoisers": MultiDenoiserModel([unet]),
        "scheduler": DDIMScheduler(num_train_timesteps=100),
        "null_class_label": NULL_CLASS_LABEL,
    }


def get_inputs(seed: int = 0) -> dict:
    """Classes 0 and 1 on a 8x12 canvas, 2 steps, `guidance_scale=2.0`, seeded CPU generator, `output_type="np"`."""
    return {
        "class_labels": [0, 1],
        "width": CANVAS_WIDTH,
        "num_inference_steps": 2,
        "guidance_scale": 2.0,
        "num_images_per_prompt": 1,
        "generator": torch.Generator("cpu").manual_seed(seed),
        "output_type": "np",
    }


BAD_INPUTS = [
    BadInput({"num_inference_steps": 0}, "num_inference_steps"),
    BadInput({"num_inference_steps": 2.5}, "num_inference_steps"),
    BadInput({"guidance_scale": "2"}, "guidance_scale"),
    BadInput({"guidance_scale": [2.0, 2.0, 2.0]}, "guidance_scale"),
    BadInput({"output_type": "jpeg"}, "output_type"),
    BadInput({"class_labels": [0, 99]}, "class_labels"),
    BadInput({"class_labels": [0.5, 1.0]}, "class_labels"),
    BadInput({"class_labels": None}, "class_labels"),
    BadInput({"prompt": ["a cat", "a dog"]}, "prompt"),
    BadInput({"width": 7}, "width"),
    BadInput({"num_images_per_prompt": 0}, "num_images_per_prompt"),
    BadInput({"latents": torch.zeros(1, 1, SAMPLE_SIZE, SAMPLE_SIZE)}, "latents"),
    BadInput({"generator": [torch.Generator("cpu"), torch.Generator("cpu")]}, "generator"),
    BadInput({"callback_on_step_end_tensor_inputs": ["unet"]}, "callback_on_step_end_tensor_inputs"),
    BadInput({"allocator": RegionAllocator(torch.ones(3, SAMPLE_SIZE, CANVAS_WIDTH))}, "regions"),
    BadInput({"allocator": RegionAllocator(torch.ones(2, SAMPLE_SIZE, SAMPLE_SIZE))}, "regions"),
    BadInput({"allocator": "sinkhorn"}, "allocator"),
    BadInput({"utility": "cross_attention"}, "utility"),
    BadInput({"utility": "clip"}, "utility"),
    BadInput({"utility_momentum": 1.0}, "utility_momentum"),
    BadInput({"alignment_scale": -1.0}, "alignment_scale"),
    BadInput({"max_iter_to_align": -1}, "max_iter_to_align"),
    BadInput({"token_indices": [[1], [2]]}, "token_indices"),
]

register_dummy_pipeline(
    DivideAndDenoisePipeline,
    get_components,
    get_inputs,
    batch_size_param="num_images_per_prompt",
    output_types=("pil", "np", "pt", "latent"),
    bad_inputs=BAD_INPUTS,
    callback_edit_tensor="latents",
)
