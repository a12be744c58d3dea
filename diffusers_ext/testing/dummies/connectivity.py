"""Dummy setup of [`ConnectivityPipeline`] for tests and the conformance suite (see `diffusers_ext.testing`).

A tiny random `ConnectivityFlowModel` (rank 2, hidden 16), 8 neurons per network, 3 Euler steps per flow, 5 steps of
simulated dynamics from 4 initial states.
"""

import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from ...models.connectivity_flow import ConnectivityFlowModel
from ...pipelines.connectivity.pipeline_connectivity import ConnectivityPipeline
from ..registry import BadInput, register_dummy_pipeline


def get_components(seed: int = 0) -> dict:
    """A seeded tiny `ConnectivityFlowModel` and a `FlowMatchEulerDiscreteScheduler`."""
    torch.manual_seed(seed)
    model = ConnectivityFlowModel(rank=2, hidden_size=16, num_layers=2, time_embedding_dim=8, output_scale=2.0)
    return {"model": model.eval(), "scheduler": FlowMatchEulerDiscreteScheduler()}


def get_inputs(seed: int = 0) -> dict:
    """One network of 8 neurons, 3 steps per flow, seeded generator, `"np"` output."""
    return {
        "num_neurons": 8,
        "num_networks": 1,
        "num_inference_steps": 3,
        "initial_states": torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.5], [0.5, -1.0]]),
        "num_dynamics_steps": 5,
        "generator": torch.Generator("cpu").manual_seed(seed),
        "output_type": "np",
    }


BAD_INPUTS = [
    BadInput({"num_neurons": 0}, "num_neurons"),
    BadInput({"num_networks": 0}, "num_networks"),
    BadInput({"num_inference_steps": 0}, "num_inference_steps"),
    BadInput({"num_dynamics_steps": -1}, "num_dynamics_steps"),
    BadInput({"output_type": "pil"}, "output_type"),
    BadInput({"latents": torch.zeros(1, 8, 3)}, "latents"),
    BadInput({"latents": torch.zeros(1, 8, 4, dtype=torch.long)}, "latents"),
    BadInput({"initial_states": torch.zeros(4, 3)}, "initial_states"),
    BadInput({"latents": torch.full((1, 8, 4), float("nan"))}, "latents"),
    BadInput({"initial_states": torch.tensor([[1.0, float("inf")]])}, "initial_states"),
    BadInput({"generator": [torch.Generator("cpu"), torch.Generator("cpu")]}, "generator"),
    BadInput({"callback_on_step_end_tensor_inputs": ["model"]}, "callback_on_step_end_tensor_inputs"),
]

register_dummy_pipeline(
    ConnectivityPipeline,
    get_components,
    get_inputs,
    output_types=("latent",),
    bad_inputs=BAD_INPUTS,
    callback_edit_tensor="latents",
    batch_size_param="num_networks",
)
