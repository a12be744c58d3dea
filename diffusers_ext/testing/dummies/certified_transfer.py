"""Dummy setup of [`SampleThenEvaluatePipeline`] for tests and the conformance kit (see `diffusers_ext.testing`).

A tiny random `ParameterDiffusionModel` over 12-number "adapters" (two 2x3 tensors), a 10-step `DDPMScheduler`,
8 hypotheses in 2 steps, scored by a fixed smooth risk of the vector.
"""

import torch
from diffusers import DDPMScheduler

from ...models.parameter_diffusion import ParameterDiffusionModel
from ...pipelines.certified_transfer.pipeline_sample_then_evaluate import SampleThenEvaluatePipeline
from ..registry import BadInput, register_dummy_pipeline


def get_components(seed: int = 0) -> dict:
    """A seeded tiny `ParameterDiffusionModel` (with a non-trivial output layer) and a `DDPMScheduler`."""
    torch.manual_seed(seed)
    model = ParameterDiffusionModel(
        vector_dim=12,
        hidden_size=16,
        num_layers=1,
        time_embedding_dim=8,
        parameter_names=["a.lora_A.weight", "a.lora_B.weight"],
        parameter_shapes=[[2, 3], [3, 2]],
    )
    torch.nn.init.normal_(model.proj_out.weight, std=0.1)
    return {"model": model.eval(), "scheduler": DDPMScheduler(num_train_timesteps=10)}


def dummy_evaluate_fn(hypotheses: torch.Tensor) -> torch.Tensor:
    """A fixed risk in (0, 1) of each vector: `sigmoid(mean coordinate)`, shape `(num_hypotheses,)`."""
    return torch.sigmoid(hypotheses.float().mean(dim=1))


def get_inputs(seed: int = 0) -> dict:
    """8 hypotheses, 2 steps, 20 support examples, seeded generator, `"np"` output."""
    return {
        "num_hypotheses": 8,
        "evaluate_fn": dummy_evaluate_fn,
        "num_support": 20,
        "num_inference_steps": 2,
        "generator": torch.Generator("cpu").manual_seed(seed),
        "output_type": "np",
    }


BAD_INPUTS = [
    BadInput({"num_hypotheses": 0}, "num_hypotheses"),
    BadInput({"evaluate_fn": "risk"}, "evaluate_fn"),
    BadInput({"num_support": 0}, "num_support"),
    BadInput({"delta": 1.5}, "delta"),
    BadInput({"bound": "pac-bayes"}, "bound"),
    BadInput({"num_inference_steps": 0}, "num_inference_steps"),
    BadInput({"output_type": "pil"}, "output_type"),
    BadInput({"latents": torch.zeros(8, 5)}, "latents"),
    BadInput({"latents": torch.full((8, 12), float("nan"))}, "latents"),
    BadInput({"generator": [torch.Generator("cpu")] * 3}, "generator"),
    BadInput({"callback_on_step_end_tensor_inputs": ["model"]}, "callback_on_step_end_tensor_inputs"),
]

register_dummy_pipeline(
    SampleThenEvaluatePipeline,
    get_components,
    get_inputs,
    output_types=("np", "pt"),
    bad_inputs=BAD_INPUTS,
)
