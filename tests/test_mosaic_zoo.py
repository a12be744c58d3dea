"""The mosaic zoo entries (mosaic-t2i at 32x32, mosaic-t2i-64 and its SD3-format twin mosaic-sd3-64 at 64x64): small
Stable Diffusion folders that load in float32 and follow simple prompts."""

import os

import pytest
import torch

from diffusers_ext import zoo
from diffusers_ext.data.mosaic import MosaicConfig, mosaic_records
from diffusers_ext.evaluation.mosaic import MosaicEvaluator, summarize


# name -> (image side, folder size limit in MiB, training script, extra call arguments)
ENTRIES = {
    "mosaic-t2i": (32, 3, "training/train_text_to_image_from_scratch.py", {}),
    "mosaic-t2i-64": (64, 15, "training/train_text_to_image_from_scratch.py", {}),
    "mosaic-sd3-64": (64, 13, "training/train_text_to_image_sd3.py", {"max_sequence_length": 8}),
}


@pytest.fixture(scope="module", params=sorted(ENTRIES))
def entry(request):
    pipe = zoo.load(request.param, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return request.param, pipe


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_entry_is_small_and_documented(name):
    folder = zoo.path(name)
    size = sum(
        os.path.getsize(os.path.join(r, f)) for r, d, fs in os.walk(folder) for f in fs if "checkpoint" not in r
    )
    assert size <= ENTRIES[name][1] * 2**20
    card = open(os.path.join(folder, "README.md"), encoding="utf-8").read()
    assert ENTRIES[name][2] in card and f"--output_dir diffusers_ext/zoo/{name} " in card


def test_loads_in_float32_and_draws_single_objects(entry):
    from diffusers import StableDiffusion3Pipeline, StableDiffusionPipeline

    name, pipe = entry
    side, _, _, kwargs = ENTRIES[name]
    if name == "mosaic-sd3-64":
        assert isinstance(pipe, StableDiffusion3Pipeline) and pipe.transformer.dtype == torch.float32
    else:
        assert isinstance(pipe, StableDiffusionPipeline) and pipe.unet.dtype == torch.float32
    config = MosaicConfig(resolution=side, tasks=("single",))
    rows = list(mosaic_records(config, 24, seed=123, split="test"))
    images = pipe(
        [r["caption"] for r in rows],
        height=side,
        width=side,
        num_inference_steps=20,
        guidance_scale=4.0,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
        **kwargs,
    ).images
    assert images.shape == (24, side, side, 3)
    summary = summarize(MosaicEvaluator(config).evaluate_batch(list(images), rows))
    # an untrained model scores ~0 on colour binding; a trained one draws most single objects right
    assert summary["colour"] >= 0.5, summary
