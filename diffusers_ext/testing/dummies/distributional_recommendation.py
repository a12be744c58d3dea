"""Dummy setup of [`DistributionalRecommendationPipeline`] for tests and the conformance suite (see
`diffusers_ext.testing`).

A tiny random `UserEmbeddingDenoiser` (embeddings of 4, width 8, one block), an `ItemScoringModel` of 30 items and
a 20-step `DDPMScheduler` sampled in 3 steps; one user with a few interacted items, 3 draws.
"""

import torch
from diffusers import DDPMScheduler

from ...models.item_scoring import ItemScoringModel
from ...models.user_embedding_denoiser import UserEmbeddingDenoiser
from ...pipelines.distributional_recommendation.pipeline_distributional_recommendation import (
    DistributionalRecommendationPipeline,
)
from ..registry import BadInput, register_dummy_pipeline


NUM_ITEMS, DIM, DRAWS = 30, 4, 3


def get_components(seed: int = 0) -> dict:
    """A seeded tiny denoiser and item model, and a `DDPMScheduler` of 20 training steps."""
    torch.manual_seed(seed)
    return {
        "denoiser": UserEmbeddingDenoiser(embedding_dim=DIM, hidden_size=8, num_layers=1).eval(),
        "item_model": ItemScoringModel(NUM_ITEMS, DIM).eval(),
        "scheduler": DDPMScheduler(num_train_timesteps=20),
    }


def get_inputs(seed: int = 0) -> dict:
    """One user (items depend on the seed), 3 draws, top 5, 3 steps, seeded generator, `"np"` output."""
    return {
        "interacted": [[seed % NUM_ITEMS, (seed + 7) % NUM_ITEMS, (seed + 11) % NUM_ITEMS]],
        "num_samples": DRAWS,
        "top_k": 5,
        "num_inference_steps": 3,
        "generator": torch.Generator("cpu").manual_seed(seed),
        "output_type": "np",
    }


BAD_INPUTS = [
    BadInput({"interacted": [[NUM_ITEMS]]}, "interacted"),
    BadInput({"interacted": [[]]}, "interacted"),
    BadInput({"num_samples": 0}, "num_samples"),
    BadInput({"top_k": NUM_ITEMS + 1}, "top_k"),
    BadInput({"num_inference_steps": 0}, "num_inference_steps"),
    BadInput({"output_type": "pil"}, "output_type"),
    BadInput({"latents": torch.zeros(DRAWS + 1, DIM)}, "latents"),
    BadInput({"candidates": torch.tensor([[1, 2], [3, 4]])}, "candidates"),
    BadInput({"generator": [torch.Generator("cpu"), torch.Generator("cpu")]}, "generator"),
    BadInput({"callback_on_step_end_tensor_inputs": ["denoiser"]}, "callback_on_step_end_tensor_inputs"),
]

register_dummy_pipeline(
    DistributionalRecommendationPipeline,
    get_components,
    get_inputs,
    batch_params=("interacted",),
    output_types=("latent",),
    bad_inputs=BAD_INPUTS,
    callback_edit_tensor="latents",
)
