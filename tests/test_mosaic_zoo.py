"""The mosaic-t2i zoo entry: a small Stable Diffusion folder that loads in float32 and follows simple prompts."""

import os

import pytest
import torch

from diffusers_ext import zoo
from diffusers_ext.data.mosaic import MosaicConfig, mosaic_records
from diffusers_ext.evaluation.mosaic import MosaicEvaluator, summarize


@pytest.fixture(scope="module")
def pipe():
    pipe = zoo.load("mosaic-t2i", dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_entry_is_small_and_documented():
    folder = zoo.path("mosaic-t2i")
    size = sum(
        os.path.getsize(os.path.join(r, f)) for r, d, fs in os.walk(folder) for f in fs if "checkpoint" not in r
    )
    assert size <= 3 * 2**20
    card = open(os.path.join(folder, "README.md"), encoding="utf-8").read()
    assert "training/train_text_to_image.py" in card and "--output_dir diffusers_ext/zoo/mosaic-t2i" in card


def test_loads_in_float32_and_draws_single_objects(pipe):
    from diffusers import StableDiffusionPipeline

    assert isinstance(pipe, StableDiffusionPipeline) and pipe.unet.dtype == torch.float32
    config = MosaicConfig(tasks=("single",))
    rows = list(mosaic_records(config, 24, seed=123, split="test"))
    images = pipe(
        [r["caption"] for r in rows],
        height=32,
        width=32,
        num_inference_steps=20,
        guidance_scale=4.0,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
    ).images
    assert images.shape == (24, 32, 32, 3)
    summary = summarize(MosaicEvaluator(config).evaluate_batch(list(images), rows))
    # an untrained model scores ~0 on colour binding; the trained one draws most single objects right
    assert summary["colour"] >= 0.5, summary
