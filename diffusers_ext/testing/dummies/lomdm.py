"""Dummy setup of [`LoMDMPipeline`] for tests and the conformance suite (see `diffusers_ext.testing`).

A tiny bidirectional Llama over a four-character vocabulary, LoMDM's forward and reverse schedule networks, and an
`OeMDMScheduler` with the learned order, so every call runs the reverse scheduler; 6 tokens in 6 steps at
temperature 1 after a four-character prompt.
"""

import torch

from ...data.char_tokenizer import build_char_tokenizer
from ...models.bidirectional_llama import build_bidirectional_llama
from ...models.lomdm_schedule_network import LoMDMScheduleNetwork
from ...pipelines.lomdm.pipeline_lomdm import LoMDMPipeline
from ...schedulers.scheduling_oemdm import OeMDMScheduler
from ..registry import BadInput, register_dummy_pipeline


SEQUENCE_LENGTH = 11  # prompt (bos + four characters) and the 6 generated tokens


def get_components(seed: int = 0) -> dict:
    """A seeded tiny denoiser, the two schedule networks, a learned-order `OeMDMScheduler` and the tokenizer."""
    tokenizer = build_char_tokenizer("abcd")
    torch.manual_seed(seed)
    model = build_bidirectional_llama(
        tokenizer, SEQUENCE_LENGTH, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32
    ).eval()
    forward, reverse = (
        LoMDMScheduleNetwork(len(tokenizer), SEQUENCE_LENGTH, hidden_size=8, num_heads=2, c1=0.7, c2=0.65).eval()
        for _ in range(2)
    )
    return {
        "model": model,
        "scheduler": OeMDMScheduler(schedule="learned"),
        "tokenizer": tokenizer,
        "reverse_schedule": reverse,
        "forward_schedule": forward,
    }


def get_inputs(seed: int = 0) -> dict:
    """One four-character prompt, 6 tokens in 6 steps, temperature 1, seeded generator, `"seq"` output."""
    return {
        "prompt": ["abcd"[seed % 4 :] + "abcd"[: seed % 4]],
        "gen_length": 6,
        "block_length": 6,
        "num_inference_steps": 6,
        "temperature": 1.0,
        "eos_early_stop": False,
        "generator": torch.Generator("cpu").manual_seed(seed),
        "output_type": "seq",
    }


BAD_INPUTS = [
    BadInput({"gen_length": 0}, "gen_length"),
    BadInput({"prompt": []}, "prompt"),
    BadInput({"temperature": -1.0}, "temperature"),
    BadInput({"output_type": "np"}, "output_type"),
]

register_dummy_pipeline(
    LoMDMPipeline,
    get_components,
    get_inputs,
    batch_params=("prompt",),
    output_types=("seq", "text"),
    bad_inputs=BAD_INPUTS,
    callback_edit_tensor="sequences",
)
