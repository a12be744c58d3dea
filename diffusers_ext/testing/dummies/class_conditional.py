"""Dummy setup of [`ClassConditionalDDPMPipeline`] for tests and the conformance suite (see `diffusers_ext.testing`).

A tiny 8x8 one-channel class-conditional UNet with 3 classes plus the null class 3, a DDIM scheduler, and calls of
2 steps with `guidance_scale=3.0`, so that both the conditional and the unconditional branch run.
"""

import torch
from diffusers import DDIMScheduler

from ...models.tiny_components import get_tiny_pixel_unet
from ...pipelines.class_conditional.pipeline_class_conditional_ddpm import ClassConditionalDDPMPipeline
from ...pipelines.doob_guidance.guidance import DoobGuidance
from ..registry import BadInput, register_dummy_pipeline


NUM_CLASSES = 3
NULL_CLASS_LABEL = NUM_CLASSES
SAMPLE_SIZE = 8


def get_components(seed: int = 0) -> dict:
    """`unet` (8x8, 1 channel, `num_class_embeds=4`), a 100-step `DDIMScheduler`, and `null_class_label=3`."""
    unet = get_tiny_pixel_unet(seed=seed, sample_size=SAMPLE_SIZE, in_channels=1, num_class_embeds=NUM_CLASSES + 1)
    return {"unet": unet, "scheduler": DDIMScheduler(num_train_timesteps=100), "null_class_label": NULL_CLASS_LABEL}


def get_inputs(seed: int = 0) -> dict:
    """One image of class `seed % 3`, 2 steps, `guidance_scale=3.0`, seeded CPU generator, `output_type="np"`."""
    return {
        "class_labels": [seed % NUM_CLASSES],
        "num_inference_steps": 2,
        "guidance_scale": 3.0,
        "generator": torch.Generator("cpu").manual_seed(seed),
        "output_type": "np",
    }


BAD_INPUTS = [
    BadInput({"num_inference_steps": 0}, "num_inference_steps"),
    BadInput({"num_inference_steps": 2.5}, "num_inference_steps"),
    BadInput({"guidance_scale": "3"}, "guidance_scale"),
    BadInput({"guidance_scale": float("nan")}, "guidance_scale"),
    BadInput({"output_type": "jpeg"}, "output_type"),
    BadInput({"class_labels": [99]}, "class_labels"),
    BadInput({"class_labels": [-1]}, "class_labels"),
    BadInput({"class_labels": [0.5]}, "class_labels"),
    BadInput({"class_labels": []}, "class_labels"),
    BadInput({"class_labels": [0], "batch_size": 2}, "batch_size"),
    BadInput({"num_images_per_prompt": 0}, "num_images_per_prompt"),
    BadInput({"latents": torch.zeros(1, 1, SAMPLE_SIZE // 2, SAMPLE_SIZE // 2)}, "latents"),
    BadInput({"latents": torch.zeros(2, 1, SAMPLE_SIZE, SAMPLE_SIZE)}, "latents"),
    BadInput({"latents": torch.full((1, 1, SAMPLE_SIZE, SAMPLE_SIZE), float("nan"))}, "latents"),
    BadInput({"generator": [torch.Generator("cpu"), torch.Generator("cpu")]}, "generator"),
    BadInput({"callback_on_step_end_tensor_inputs": ["unet"]}, "callback_on_step_end_tensor_inputs"),
    BadInput({"guidance": "doob"}, "guidance"),
    BadInput(
        {
            "guidance": DoobGuidance(cost=lambda x0: x0.flatten(1).mean(1), estimator="mc"),
            "generator": [torch.Generator("cpu").manual_seed(0), torch.Generator("cpu").manual_seed(1)],
        },
        "generator",
    ),
]

register_dummy_pipeline(
    ClassConditionalDDPMPipeline,
    get_components,
    get_inputs,
    batch_params=("class_labels",),
    output_types=("pil", "np", "pt", "latent"),
    bad_inputs=BAD_INPUTS,
    callback_edit_tensor="latents",
)
