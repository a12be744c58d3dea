"""Dummy setup of [`DIRPPipeline`] for tests and the conformance suite (see `diffusers_ext.testing`).

The tiny Stable Diffusion components (a VAE, a CLIP text encoder, a text-conditioned UNet), so the latent and
text-conditioned paths run; calls purify one 32x32 RGB image with 2 inversion steps and 2 iterations, starting from
seeded noise (`init_noise_std`) so that the generator matters.
"""

import torch

from ...models.tiny_components import get_tiny_sd_components
from ...pipelines.dirp.pipeline_dirp import DIRPPipeline
from ..registry import BadInput, register_dummy_pipeline


IMAGE_SIZE = 32


def get_components(seed: int = 0) -> dict:
    """`unet`, `scheduler`, `vae`, `text_encoder`, `tokenizer` of [`get_tiny_sd_components`]."""
    sd = get_tiny_sd_components(seed)
    return {k: sd[k] for k in ("unet", "scheduler", "vae", "text_encoder", "tokenizer")}


def get_inputs(seed: int = 0) -> dict:
    """One seeded random 32x32 RGB image in [0, 1], 2 inversion steps, 2 iterations, a loose budget, `output_type="np"`."""
    image = torch.rand(1, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator("cpu").manual_seed(100 + seed))
    return {
        "image": image,
        "num_inversion_steps": 2,
        "num_iterations": 2,
        "learning_rate": 0.05,
        "init_noise_std": 0.05,
        # away from the hinge's kink, where float rounding between batched and single runs can flip the gradient
        "perceptual_budget": 0.5,
        "generator": torch.Generator("cpu").manual_seed(seed),
        "output_type": "np",
    }


BAD_INPUTS = [
    BadInput({"image": torch.full((1, 3, IMAGE_SIZE, IMAGE_SIZE), 255.0)}, "image"),
    BadInput({"image": torch.rand(1, 1, IMAGE_SIZE, IMAGE_SIZE)}, "image"),
    BadInput({"image": torch.rand(1, 3, IMAGE_SIZE - 2, IMAGE_SIZE)}, "image"),
    BadInput({"image": "cat.png"}, "image"),
    BadInput({"image": []}, "image"),
    BadInput({"perceptual_budget": 0.0}, "perceptual_budget"),
    BadInput({"perceptual_budget": -0.1}, "perceptual_budget"),
    BadInput({"perceptual": "dists"}, "perceptual"),
    BadInput({"num_inversion_steps": -1}, "num_inversion_steps"),
    BadInput({"num_inversion_steps": 2.5}, "num_inversion_steps"),
    BadInput({"inversion_strength": 0.0}, "inversion_strength"),
    BadInput({"inversion_strength": 1.5}, "inversion_strength"),
    BadInput({"num_iterations": 0}, "num_iterations"),
    BadInput({"learning_rate": 0.0}, "learning_rate"),
    BadInput({"perceptual_weight": "1"}, "perceptual_weight"),
    BadInput({"init_noise_std": -1.0}, "init_noise_std"),
    BadInput({"prompt": ["a", "b"]}, "prompt"),
    BadInput({"prompt_embeds": torch.zeros(1, 8)}, "prompt_embeds"),
    BadInput({"prompt": "a cat", "prompt_embeds": torch.zeros(1, 77, 32)}, "prompt_embeds"),
    BadInput({"num_images_per_prompt": 0}, "num_images_per_prompt"),
    BadInput({"output_type": "latent"}, "output_type"),
    BadInput({"generator": [torch.Generator("cpu"), torch.Generator("cpu")]}, "generator"),
    BadInput({"callback_on_step_end_tensor_inputs": ["unet"]}, "callback_on_step_end_tensor_inputs"),
]

register_dummy_pipeline(
    DIRPPipeline,
    get_components,
    get_inputs,
    batch_params=("image",),
    output_types=("pil", "np", "pt"),
    bad_inputs=BAD_INPUTS,
    callback_edit_tensor="images",
)
