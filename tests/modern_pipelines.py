"""Tiny SDXL, SD3 and Flux pipelines (the real diffusers and transformers classes at reduced width) for the tests of
the methods that run on them, with the dtype their users run them in and the support-matrix marks of each case."""

import pytest
import torch
from diffusers import FluxPipeline, StableDiffusion3Pipeline, StableDiffusionXLPipeline

from diffusers_ext.testing import get_tiny_flux_components, get_tiny_sd3_components, get_tiny_sdxl_components


# family -> (pipeline class, component builder, image side in pixels, the dtype its users run)
FAMILIES = {
    "sdxl": (StableDiffusionXLPipeline, get_tiny_sdxl_components, 16, torch.float16),
    "sd3": (StableDiffusion3Pipeline, get_tiny_sd3_components, 16, torch.bfloat16),
    "flux": (FluxPipeline, get_tiny_flux_components, 8, torch.bfloat16),
}
# T5 tokens per prompt (SD3, Flux): short, as the tiny tokenizers' prompts are
MAX_SEQUENCE_LENGTH = 8


def tiny_pipeline(family: str, dtype: torch.dtype = torch.float32, seed: int = 0):
    """The tiny pipeline of `family` (weights seeded by `seed`), every model in `dtype`."""
    pipeline_class, components, _, _ = FAMILIES[family]
    pipe = pipeline_class(**components(seed))
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(dtype)


def resolution(family: str) -> int:
    return FAMILIES[family][2]


def call_kwargs(family: str) -> dict:
    """The pipeline-call options the tiny models need: their image size and, for T5, the sequence length."""
    kwargs = {"height": resolution(family), "width": resolution(family)}
    if family in ("sd3", "flux"):
        kwargs["max_sequence_length"] = MAX_SEQUENCE_LENGTH
    return kwargs


def dtype_cases(method: str, families=tuple(FAMILIES)) -> list:
    """`(family, dtype)` parameters, float32 and the users' dtype of each family, each marked with its support cell."""
    cases = []
    for family in families:
        for dtype in (torch.float32, FAMILIES[family][3]):
            name = str(dtype).removeprefix("torch.")
            mark = pytest.mark.support_cell(method, family, dtype=name)
            cases.append(pytest.param(family, dtype, marks=mark, id=f"{family}-{name}"))
    return cases


def tolerance(dtype: torch.dtype) -> dict:
    """`assert_close` tolerances for results computed two ways in `dtype`."""
    return {"atol": 1e-5, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 3e-2}
