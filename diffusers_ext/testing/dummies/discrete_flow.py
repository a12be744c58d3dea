"""Dummy setup of [`DiscreteFlowPipeline`] for tests and the conformance suite (see `diffusers_ext.testing`).

A tiny random transformer over 4 data tokens and 3 mask tokens (Multimask source), sequences of 6, 4 Euler steps.
"""

import torch

from ...models.discrete_flow_transformer import DiscreteFlowTransformerModel
from ...pipelines.discrete_flow.pipeline_discrete_flow import DiscreteFlowPipeline
from ...schedulers.scheduling_discrete_flow_matching import DiscreteFlowMatchingScheduler
from ..registry import BadInput, register_dummy_pipeline


def get_components(seed: int = 0) -> dict:
    """A seeded tiny `DiscreteFlowTransformerModel` and a Multimask `DiscreteFlowMatchingScheduler`."""
    scheduler = DiscreteFlowMatchingScheduler(vocab_size=4, source="multimask", num_mask_tokens=3)
    torch.manual_seed(seed)
    model = DiscreteFlowTransformerModel(
        vocab_size=4,
        num_embeddings=scheduler.num_embeddings,
        sequence_length=6,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
    )
    return {"model": model.eval(), "scheduler": scheduler}


def get_inputs(seed: int = 0) -> dict:
    """One sequence in 4 steps, seeded generator, `"seq"` output."""
    return {
        "batch_size": 1,
        "num_inference_steps": 4,
        "generator": torch.Generator("cpu").manual_seed(seed),
        "output_type": "seq",
    }


BAD_INPUTS = [
    BadInput({"num_inference_steps": 0}, "num_inference_steps"),
    BadInput({"batch_size": 0}, "batch_size"),
    BadInput({"output_type": "pil"}, "output_type"),
    BadInput({"latents": torch.zeros(1, 5, dtype=torch.long)}, "latents"),
    BadInput({"latents": torch.full((1, 6), 7, dtype=torch.long)}, "latents"),
    BadInput({"latents": torch.zeros(1, 6)}, "latents"),
    BadInput({"generator": [torch.Generator("cpu"), torch.Generator("cpu")]}, "generator"),
    BadInput({"callback_on_step_end_tensor_inputs": ["model"]}, "callback_on_step_end_tensor_inputs"),
]

register_dummy_pipeline(
    DiscreteFlowPipeline,
    get_components,
    get_inputs,
    output_types=("seq",),
    bad_inputs=BAD_INPUTS,
    callback_edit_tensor="sequences",
    batch_size_param="batch_size",
)
