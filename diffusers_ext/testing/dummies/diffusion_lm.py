"""Dummy setup of [`DiffusionLMPipeline`] for tests and the conformance suite (see `diffusers_ext.testing`).

The tiny LLaDA-like bidirectional Llama with its byte-level tokenizer, a SOAR scheduler (beam 2, a threshold low
enough for a random model to cross sometimes, so both branches run), and calls generating 8 tokens in two blocks of
4 at temperature 1 from a two-byte prompt (all dummy prompts have the same length, so a batch needs no padding).
"""

import torch

from ...models.tiny_components import get_tiny_llada_like_lm
from ...pipelines.diffusion_lm.pipeline_diffusion_lm import DiffusionLMPipeline
from ...schedulers.scheduling_soar import SOARScheduler
from ..registry import BadInput, register_dummy_pipeline


def get_components(seed: int = 0) -> dict:
    """`model` and `tokenizer` from `get_tiny_llada_like_lm(seed)`, and a SOAR `scheduler` (block length 4)."""
    model, tokenizer = get_tiny_llada_like_lm(seed=seed)
    scheduler = SOARScheduler(block_length=4, confidence_threshold=0.01, max_beam_size=2, max_parallel_tokens=2)
    return {"model": model, "scheduler": scheduler, "tokenizer": tokenizer}


def get_inputs(seed: int = 0) -> dict:
    """One two-byte prompt, 8 tokens in blocks of 4 within 8 steps, temperature 1, seeded generator, `"seq"`."""
    return {
        "prompt": [f"q{seed % 10}"],
        "gen_length": 8,
        "block_length": 4,
        "num_inference_steps": 8,
        "temperature": 1.0,
        "eos_early_stop": False,
        "generator": torch.Generator("cpu").manual_seed(seed),
        "output_type": "seq",
    }


def get_ragged_inputs(seed: int = 0) -> dict:
    """As `get_inputs`, with a prompt of 1 + 2 * (seed % 3) bytes: a batch of seeds 0 and 1 needs left padding."""
    return {**get_inputs(seed), "prompt": ["xyzab"[: 1 + 2 * (seed % 3)]]}


BAD_INPUTS = [
    BadInput({"mask_token_id": 10_000}, "mask_token_id"),
    BadInput({"gen_length": 6}, "block_length"),
    BadInput({"gen_length": 0}, "gen_length"),
    BadInput({"num_inference_steps": 3}, "num_inference_steps"),
    BadInput({"num_inference_steps": 1}, "num_inference_steps"),
    BadInput({"prompt": [""]}, "prompt"),
    BadInput({"prompt": []}, "prompt"),
    BadInput({"prompt": None, "input_ids": torch.zeros(1, 0, dtype=torch.long)}, "empty prompt"),
    BadInput({"generator": [torch.Generator("cpu"), torch.Generator("cpu")]}, "generator"),
    BadInput(
        {"prompt": None, "input_ids": torch.ones(1, 3, dtype=torch.long), "attention_mask": torch.ones(1, 4)},
        "attention_mask",
    ),
    BadInput(
        {"prompt": None, "input_ids": torch.ones(1, 3, dtype=torch.long), "attention_mask": torch.tensor([[1, 0, 1]])},
        "attention_mask",
    ),
    BadInput({"prompt": None}, "prompt"),
    BadInput({"input_ids": torch.ones(1, 3, dtype=torch.long)}, "input_ids"),
    BadInput({"temperature": -1.0}, "temperature"),
    BadInput({"guidance_scale": 0.5}, "guidance_scale"),
    BadInput({"num_images_per_prompt": 0}, "num_images_per_prompt"),
    BadInput({"latents": torch.zeros(1, 4, dtype=torch.long)}, "latents"),
    BadInput({"latents": torch.zeros(1, 8)}, "latents"),
    BadInput({"output_type": "np"}, "output_type"),
    BadInput({"callback_on_step_end_tensor_inputs": ["model"]}, "callback_on_step_end_tensor_inputs"),
    BadInput({"cache": "full"}, "cache"),
    BadInput({"cache": "prefix", "guidance_scale": 2.0}, "cache"),
    BadInput({"gen_length": 600, "block_length": 4, "num_inference_steps": 600}, "gen_length"),
]

register_dummy_pipeline(
    DiffusionLMPipeline,
    get_components,
    get_inputs,
    batch_params=("prompt",),
    output_types=("seq", "text"),
    bad_inputs=BAD_INPUTS,
    callback_edit_tensor="sequences",
    ragged_inputs_fn=get_ragged_inputs,
)
