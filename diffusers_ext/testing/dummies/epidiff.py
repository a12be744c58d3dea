"""Dummy setup of [`EpiDiffForecastPipeline`] for tests and the conformance suite (see `diffusers_ext.testing`).

A tiny random `SpatioTemporalDenoiser` (window 8, hidden 8, one block), a 20-step `DDIMScheduler`, one window of
4 nodes on a line graph with 5 steps of history and a constant mechanistic forecast (unsteered unless the test sets
`guidance_scale`), 2 samples, 3 DDIM steps.
"""

import torch

from ...models.spatiotemporal_denoiser import SpatioTemporalDenoiser
from ...pipelines.epidiff.pipeline_epidiff import EpiDiffForecastPipeline
from ...trainers.epidiff_trainer import build_epidiff_schedulers
from ..registry import BadInput, register_dummy_pipeline


LINE = torch.tensor([[0.0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1], [0, 0, 1, 0]])


def get_components(seed: int = 0) -> dict:
    """A seeded tiny `SpatioTemporalDenoiser` and a `DDIMScheduler`."""
    torch.manual_seed(seed)
    model = SpatioTemporalDenoiser(window_length=8, hidden_size=8, num_heads=2, num_layers=1, dropout=0.0)
    _, ddim = build_epidiff_schedulers(num_train_timesteps=20)
    return {"denoiser": model.eval(), "scheduler": ddim}


def get_inputs(seed: int = 0) -> dict:
    """One window (4 nodes, 5 history steps), 2 samples, 2 steps, seeded generator, `"np"` output."""
    history = torch.rand(1, 4, 5, generator=torch.Generator().manual_seed(seed + 100)) * 10
    return {
        "history": history,
        "adjacency": LINE,
        "mechanistic_mean": torch.full((1, 4, 3), 4.0),
        "constant_sigma": 3.0,  # a pull that does not reach the forecast, so guidance changes move the output
        "num_samples": 2,
        "num_inference_steps": 3,
        "generator": torch.Generator("cpu").manual_seed(seed),
        "output_type": "np",
    }


BAD_INPUTS = [
    BadInput({"history": torch.zeros(1, 4, 8)}, "history"),
    BadInput({"adjacency": torch.zeros(3, 3)}, "adjacency"),
    BadInput({"num_samples": 0}, "num_samples"),
    BadInput({"num_inference_steps": 0}, "num_inference_steps"),
    BadInput({"guidance_scale": -1.0}, "guidance_scale"),
    BadInput({"output_type": "pil"}, "output_type"),
    BadInput({"latents": torch.zeros(1, 3, 4, 8)}, "latents"),
    BadInput({"generator": [torch.Generator("cpu"), torch.Generator("cpu")]}, "generator"),
    BadInput({"callback_on_step_end_tensor_inputs": ["denoiser"]}, "callback_on_step_end_tensor_inputs"),
]

register_dummy_pipeline(
    EpiDiffForecastPipeline,
    get_components,
    get_inputs,
    batch_params=("history", "mechanistic_mean"),
    output_types=("latent",),
    bad_inputs=BAD_INPUTS,
    callback_edit_tensor="latents",
)
