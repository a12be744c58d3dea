"""Dummy setups of [`SurrogatePredictivePipeline`] and [`OfflineOptimizationPipeline`] for tests and the
conformance kit (see `diffusers_ext.testing`).

A tiny random `ScalarDiffusionSurrogate` over 3-dimensional designs (with a non-trivial output layer and a stored
z-scoring) and SPADE's 100-step linear-beta `DDIMScheduler`; 4 Monte-Carlo samples with 2 DDIM steps.
"""

import numpy as np
import torch
from diffusers import DDIMScheduler

from ...models.scalar_diffusion_surrogate import ScalarDiffusionSurrogate
from ...pipelines.spade.pipeline_offline_optimization import OfflineOptimizationPipeline
from ...pipelines.spade.pipeline_surrogate_predictive import SurrogatePredictivePipeline
from ...pipelines.spade.search import EAConfig
from ..registry import BadInput, register_dummy_pipeline


def get_components(seed: int = 0) -> dict:
    """A seeded tiny surrogate (`x_dim=3`, `H=8`) and SPADE's DDIM scheduler."""
    torch.manual_seed(seed)
    model = ScalarDiffusionSurrogate(x_dim=3, hidden_size=8, time_embed_dim=8)
    torch.nn.init.normal_(model.head[-1].weight, std=0.5)
    model.set_normalization(torch.zeros(3), torch.ones(3), 0.5, 2.0)
    scheduler = DDIMScheduler(
        num_train_timesteps=100,
        beta_schedule="linear",
        beta_start=1e-4,
        beta_end=2e-2,
        timestep_spacing="linspace",
        clip_sample=False,
    )
    return {"model": model.eval(), "scheduler": scheduler}


def _designs(seed: int, count: int) -> torch.Tensor:
    return torch.randn(count, 3, generator=torch.Generator().manual_seed(100 + seed))


def get_inputs(seed: int = 0) -> dict:
    """One design (one column of samples), 4 samples, 2 DDIM steps, a seeded generator, `"np"` output."""
    return {
        "x": _designs(seed, 1),
        "num_samples": 4,
        "num_inference_steps": 2,
        "generator": torch.Generator("cpu").manual_seed(seed),
        "output_type": "np",
    }


BAD_INPUTS = [
    BadInput({"x": torch.zeros(1, 5)}, "x"),
    BadInput({"x": "designs"}, "x"),
    BadInput({"num_samples": 0}, "num_samples"),
    BadInput({"num_inference_steps": 0}, "num_inference_steps"),
    BadInput({"output_type": "pil"}, "output_type"),
    BadInput({"latents": torch.zeros(3, 1)}, "latents"),
    BadInput({"x": torch.tensor([[0.0, float("nan"), 0.0]])}, "x"),
    BadInput({"latents": torch.full((4, 1), float("nan"))}, "latents"),
    BadInput({"generator": [torch.Generator("cpu"), torch.Generator("cpu")]}, "generator"),
    BadInput({"callback_on_step_end_tensor_inputs": ["model"]}, "callback_on_step_end_tensor_inputs"),
]

register_dummy_pipeline(
    SurrogatePredictivePipeline,
    get_components,
    get_inputs,
    batch_params=("x",),
    output_types=("np", "pt", "latent"),
    bad_inputs=BAD_INPUTS,
)


def get_search_inputs(seed: int = 0) -> dict:
    """20 offline points, 8 candidates, 2 generations of 2 samples with 2 DDIM steps, a seeded generator."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (20, 3)).astype(np.float32)
    return {
        "x": x,
        "y": -(x**2).sum(1),
        "num_candidates": 8,
        "num_samples": 2,
        "num_inference_steps": 2,
        "ea": EAConfig(population_size=8, elite_size=4, num_generations=2),
        "generator": torch.Generator("cpu").manual_seed(seed),
        "seed": seed,
    }


register_dummy_pipeline(
    OfflineOptimizationPipeline,
    get_components,
    get_search_inputs,
    output_types=("np",),
    bad_inputs=[
        BadInput({"y": np.zeros(3)}, "y"),
        BadInput({"num_candidates": 0}, "num_candidates"),
        BadInput({"acquisition_function": "ucb"}, "acquisition_function"),
        BadInput({"bounds": np.zeros((2, 4))}, "bounds"),
        BadInput({"y": np.full(20, np.nan)}, "y"),
        BadInput({"beta": float("nan")}, "beta"),
        BadInput({"generator": [torch.Generator("cpu")]}, "generator"),
    ],
)
