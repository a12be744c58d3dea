"""Dummy setup of [`ManifoldFlowPipeline`] for tests and the conformance suite (see `diffusers_ext.testing`).

A tiny random `ManifoldFlowTransformerModel` (a 2-dim subspace of R^6 set to a seeded random orthonormal basis,
a one-layer transformer head of width 8) and 3 Euler steps of `FlowMatchEulerDiscreteScheduler`.
"""

import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from ...models.manifold_flow import ManifoldFlowTransformerModel
from ...pipelines.manifold_flow.pipeline_manifold_flow import ManifoldFlowPipeline
from ..registry import BadInput, register_dummy_pipeline


AMBIENT_DIM, LATENT_DIM = 6, 2


def get_components(seed: int = 0) -> dict:
    """A seeded tiny `ManifoldFlowTransformerModel` with a random subspace, and a `FlowMatchEulerDiscreteScheduler`."""
    torch.manual_seed(seed)
    model = ManifoldFlowTransformerModel(
        ambient_dim=AMBIENT_DIM,
        latent_dim=LATENT_DIM,
        num_tokens=2,
        hidden_size=8,
        num_layers=1,
        num_attention_heads=2,
        time_embedding_dim=8,
    )
    basis, _ = torch.linalg.qr(torch.randn(AMBIENT_DIM, LATENT_DIM, generator=torch.Generator().manual_seed(seed)))
    model.set_subspace(basis)
    return {"model": model.eval(), "scheduler": FlowMatchEulerDiscreteScheduler()}


def get_inputs(seed: int = 0) -> dict:
    """One point, 3 Euler steps, seeded generator, `"np"` output."""
    return {
        "batch_size": 1,
        "num_inference_steps": 3,
        "generator": torch.Generator("cpu").manual_seed(seed),
        "output_type": "np",
    }


BAD_INPUTS = [
    BadInput({"batch_size": 0}, "batch_size"),
    BadInput({"num_inference_steps": 0}, "num_inference_steps"),
    BadInput({"output_type": "pil"}, "output_type"),
    BadInput({"latents": torch.zeros(1, AMBIENT_DIM + 1)}, "latents"),
    BadInput({"latents": torch.zeros(2, AMBIENT_DIM)}, "latents"),
    BadInput({"latents": torch.zeros(1, AMBIENT_DIM, dtype=torch.long)}, "latents"),
    BadInput({"generator": [torch.Generator("cpu"), torch.Generator("cpu")]}, "generator"),
    BadInput({"callback_on_step_end_tensor_inputs": ["model"]}, "callback_on_step_end_tensor_inputs"),
]

register_dummy_pipeline(
    ManifoldFlowPipeline,
    get_components,
    get_inputs,
    output_types=("latent",),
    bad_inputs=BAD_INPUTS,
    callback_edit_tensor="latents",
    batch_size_param="batch_size",
)
