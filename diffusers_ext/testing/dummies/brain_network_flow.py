"""Dummy setup of [`BrainNetworkFlowPipeline`] for tests and the conformance suite (see `diffusers_ext.testing`).

A `CorrelationMatrixCodec` of 5 regions fitted on 8 seeded sample correlation matrices, a tiny random
`BrainNetworkFlowModel` (width 16, 2 blocks, two covariates) and 3 Euler steps of `FlowMatchEulerDiscreteScheduler`.
"""

import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from ...models.brain_network_flow import BrainNetworkFlowModel
from ...models.matrix_codecs import CorrelationMatrixCodec
from ...pipelines.brain_network_flow.pipeline_brain_network_flow import BrainNetworkFlowPipeline
from ..registry import BadInput, register_dummy_pipeline


NUM_REGIONS = 5
NUM_FEATURES = NUM_REGIONS * (NUM_REGIONS - 1) // 2


def get_components(seed: int = 0) -> dict:
    """A fitted 5-region correlation codec, a seeded tiny conditional model (weights drawn so that the velocity is
    not zero at initialisation) and a `FlowMatchEulerDiscreteScheduler`."""
    generator = torch.Generator().manual_seed(seed)
    series = torch.randn(8, 20, NUM_REGIONS, generator=generator, dtype=torch.float64)
    covariance = series.transpose(1, 2) @ series
    scale = torch.diagonal(covariance, dim1=1, dim2=2).rsqrt()
    codec = CorrelationMatrixCodec(NUM_REGIONS).fit(covariance * scale[:, :, None] * scale[:, None, :])
    torch.manual_seed(seed)
    model = BrainNetworkFlowModel(NUM_FEATURES, 2, hidden_size=16, num_layers=2)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.2, generator=generator)
    return {"model": model.eval(), "codec": codec, "scheduler": FlowMatchEulerDiscreteScheduler()}


def get_inputs(seed: int = 0) -> dict:
    """One subject's covariates (age, sex), 3 Euler steps, seeded generator, `"np"` output."""
    return {
        "covariates": torch.tensor([[0.25 + 0.5 * (seed % 2), float(seed % 2)]]),
        "num_inference_steps": 3,
        "generator": torch.Generator("cpu").manual_seed(seed),
        "output_type": "np",
    }


BAD_INPUTS = [
    BadInput({"covariates": None}, "covariates"),
    BadInput({"covariates": torch.zeros(1, 3)}, "covariates"),
    BadInput({"covariates": torch.tensor([[float("nan"), 0.0]])}, "covariates"),
    BadInput({"batch_size": 2}, "batch_size"),
    BadInput({"num_inference_steps": 0}, "num_inference_steps"),
    BadInput({"output_type": "pil"}, "output_type"),
    BadInput({"latents": torch.zeros(1, NUM_FEATURES + 1)}, "latents"),
    BadInput({"generator": [torch.Generator("cpu"), torch.Generator("cpu")]}, "generator"),
    BadInput({"callback_on_step_end_tensor_inputs": ["model"]}, "callback_on_step_end_tensor_inputs"),
]

register_dummy_pipeline(
    BrainNetworkFlowPipeline,
    get_components,
    get_inputs,
    batch_params=("covariates",),
    output_types=("latent",),
    bad_inputs=BAD_INPUTS,
    callback_edit_tensor="latents",
)
