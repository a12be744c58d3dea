"""DIRPPipeline: the conformance suite on tiny SD components, plus DIRP's own behaviour."""

import numpy as np
import pytest

from diffusers_ext import DIRPPipeline
from diffusers_ext.testing import (
    PipelineConformanceTests,
    count_module_forwards,
    get_dummy_components,
    get_dummy_inputs,
)


class TestDIRPPipelineConformance(PipelineConformanceTests):
    pipeline_class = DIRPPipeline
    # Adam divides each pixel's gradient by its own magnitude, so float-rounding differences between a batched and a
    # single backward pass (~1e-7) grow to ~5e-5 in the image after two iterations.
    atol = 1e-4


def test_text_conditioned_unet_without_text_encoder_names_the_missing_components():
    components = get_dummy_components(DIRPPipeline, 0)
    for missing in (("tokenizer",), ("text_encoder",), ("tokenizer", "text_encoder")):
        pipe = DIRPPipeline(**{**components, **dict.fromkeys(missing)})
        with count_module_forwards(pipe) as counts, pytest.raises(ValueError) as error:
            pipe(**get_dummy_inputs(DIRPPipeline, 0))
        message = str(error.value)
        assert "\n" not in message and all(name in message for name in missing), message
        assert "prompt_embeds" in message and not any(counts.values())


def test_text_conditioned_unet_without_text_encoder_runs_on_prompt_embeds():
    components = get_dummy_components(DIRPPipeline, 0)
    full = DIRPPipeline(**components)
    full.set_progress_bar_config(disable=True)
    prompt_embeds, negative = full.encode_prompt("a photo", num_images_per_prompt=1)
    assert negative is None and prompt_embeds.shape[0] == 1
    expected = full(**get_dummy_inputs(DIRPPipeline, 0), prompt="a photo").images
    bare = DIRPPipeline(**{**components, "tokenizer": None, "text_encoder": None})
    bare.set_progress_bar_config(disable=True)
    images = bare(**get_dummy_inputs(DIRPPipeline, 0), prompt=None, prompt_embeds=prompt_embeds).images
    np.testing.assert_allclose(images, expected, atol=1e-5)
