"""Region-based MultiDiffusion (the composition benchmarks' oracle-layout baseline): the canvas partition, and the
sampler against the plain pipeline where the two must agree."""

import numpy as np
import pytest
import torch
from diffusers import StableDiffusionPipeline

from diffusers_ext.evaluation.divide_and_denoise.region_multidiffusion import RegionMultiDiffusion, partition_masks
from diffusers_ext.testing import get_tiny_sd_components


def test_partition_shares_overlaps_and_gives_uncovered_positions_to_the_nearest_box():
    boxes = torch.zeros(2, 4, 6)
    boxes[0, :, 0:2] = 1.0
    boxes[1, :, 1:3] = 1.0  # column 1 is in both boxes
    weights = partition_masks(boxes)
    torch.testing.assert_close(weights.sum(dim=0), torch.ones(4, 6))
    assert weights[0, 0, 0] == 1.0 and weights[0, 0, 1] == 0.5 and weights[1, 0, 1] == 0.5
    assert weights[1, 0, 5] == 1.0 and weights[0, 0, 5] == 0.0  # columns 3-5 are nearest box 1


def test_partition_refuses_an_empty_box():
    boxes = torch.zeros(2, 4, 4)
    boxes[0, 0, 0] = 1.0
    with pytest.raises(ValueError, match="empty box"):
        partition_masks(boxes)


@pytest.fixture(scope="module")
def pipe():
    pipe = StableDiffusionPipeline(**get_tiny_sd_components(seed=0))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _latents(pipe, size):
    shape = (1, pipe.unet.config.in_channels, size, size)
    return torch.randn(shape, generator=torch.Generator().manual_seed(3))


def _plain_pipeline(pipe, latents, guidance_scale):
    """The pipeline's own image of "a red circle" from `latents`, 3 steps, as `np` `(1, H, W, 3)`."""
    resolution = latents.shape[-1] * pipe.vae_scale_factor
    return pipe(
        "a red circle",
        height=resolution,
        width=resolution,
        num_inference_steps=3,
        guidance_scale=guidance_scale,
        latents=latents,
        output_type="np",
    ).images


@pytest.mark.parametrize("guidance_scale", [1.0, 4.0])
def test_one_region_over_the_whole_canvas_is_the_plain_pipeline(pipe, guidance_scale):
    resolution = pipe.unet.config.sample_size * pipe.vae_scale_factor
    size = pipe.unet.config.sample_size
    latents = _latents(pipe, size)
    expected = _plain_pipeline(pipe, latents, guidance_scale)
    sampler = RegionMultiDiffusion(pipe, torch.zeros(3, resolution, resolution), bootstrap_fraction=1.0)
    got = sampler(["a red circle"], torch.ones(1, size, size), latents, 3, guidance_scale)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_bootstrapping_changes_the_outcome_outside_a_small_box(pipe):
    resolution = pipe.unet.config.sample_size * pipe.vae_scale_factor
    size = pipe.unet.config.sample_size
    boxes = torch.zeros(1, size, size)
    boxes[0, : size // 2, : size // 2] = 1.0
    latents = _latents(pipe, size)
    background = torch.zeros(3, resolution, resolution)
    plain = RegionMultiDiffusion(pipe, background, bootstrap_fraction=0.0)(["a red circle"], boxes, latents, 3)
    pinned = RegionMultiDiffusion(pipe, background, bootstrap_fraction=1.0)(
        ["a red circle"], boxes, latents, 3, generator=torch.Generator().manual_seed(0)
    )
    assert np.abs(plain - pinned).max() > 1e-3


def test_bad_shapes_are_refused(pipe):
    size = pipe.unet.config.sample_size
    sampler = RegionMultiDiffusion(pipe, torch.zeros(3, size * pipe.vae_scale_factor, size * pipe.vae_scale_factor))
    with pytest.raises(ValueError, match="`boxes` must be"):
        sampler(["a", "b"], torch.ones(1, size, size), _latents(pipe, size))
    with pytest.raises(ValueError, match="bootstrap_fraction"):
        RegionMultiDiffusion(pipe, torch.zeros(3, 8, 8), bootstrap_fraction=1.5)


def test_windows_are_centred_on_their_boxes_and_kept_in_the_canvas():
    from diffusers_ext.evaluation.divide_and_denoise.region_multidiffusion import window_corners

    boxes = torch.zeros(2, 8, 8)
    boxes[0, 3:5, 3:5] = 1.0  # centre (4, 4): a 4-window starts at (2, 2)
    boxes[1, 0:2, 6:8] = 1.0  # top-right corner: clipped to (0, 4)
    assert window_corners(boxes, 4).tolist() == [[2, 2], [0, 4]]
    with pytest.raises(ValueError, match="window_size"):
        window_corners(boxes, 9)


@pytest.mark.parametrize("guidance_scale", [1.0, 4.0])
def test_one_full_canvas_window_over_the_whole_box_is_the_plain_pipeline(pipe, guidance_scale):
    from diffusers_ext.evaluation.divide_and_denoise.region_multidiffusion import WindowMultiDiffusion

    resolution = pipe.unet.config.sample_size * pipe.vae_scale_factor
    size = pipe.unet.config.sample_size
    latents = _latents(pipe, size)
    expected = _plain_pipeline(pipe, latents, guidance_scale)
    sampler = WindowMultiDiffusion(pipe, torch.zeros(3, resolution, resolution), window_size=size)
    got = sampler([["a red circle"]], torch.ones(1, 1, size, size), latents, 3, guidance_scale)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_cropped_windows_in_a_batch_match_each_image_alone(pipe):
    from diffusers_ext.evaluation.divide_and_denoise.region_multidiffusion import WindowMultiDiffusion

    resolution = pipe.unet.config.sample_size * pipe.vae_scale_factor
    size = pipe.unet.config.sample_size
    sampler = WindowMultiDiffusion(pipe, torch.zeros(3, resolution, resolution), size // 2, margin=1)
    boxes = torch.zeros(2, 2, size, size)
    boxes[:, 0, :2, :2] = 1.0
    boxes[0, 1, -2:, -2:] = 1.0
    boxes[1, 1, :2, -2:] = 1.0
    latents = torch.randn((2, pipe.unet.config.in_channels, size, size), generator=torch.Generator().manual_seed(1))
    prompts = [["a red circle", "a blue square"], ["a green square", "a red circle"]]
    both = sampler(prompts, boxes, latents, 2, 3.0)
    for i in range(2):
        alone = sampler(prompts[i : i + 1], boxes[i : i + 1], latents[i : i + 1], 2, 3.0)
        np.testing.assert_allclose(both[i : i + 1], alone, atol=1e-5)
    assert both.shape == (2, resolution, resolution, 3)


def test_window_sampler_refuses_bad_arguments(pipe):
    from diffusers_ext.evaluation.divide_and_denoise.region_multidiffusion import WindowMultiDiffusion

    size = pipe.unet.config.sample_size
    background = torch.zeros(3, size * pipe.vae_scale_factor, size * pipe.vae_scale_factor)
    with pytest.raises(ValueError, match="window_size"):
        WindowMultiDiffusion(pipe, background, window_size=size + 1)
    with pytest.raises(ValueError, match="margin"):
        WindowMultiDiffusion(pipe, background, window_size=2, margin=-1)
    sampler = WindowMultiDiffusion(pipe, background, window_size=2)
    with pytest.raises(ValueError, match="`boxes` must be"):
        sampler([["a", "b"]], torch.ones(1, 1, size, size), _latents(pipe, size))


def test_renoising_takes_the_next_level_back_to_the_current_one(pipe):
    """`x_s = sqrt(a_s) x0 + sqrt(1 - a_s) eps` goes to a latent with mean `sqrt(a_t) x0` and variance `1 - a_t`."""
    resolution = pipe.unet.config.sample_size * pipe.vae_scale_factor
    sampler = RegionMultiDiffusion(pipe, torch.zeros(3, resolution, resolution), resampling=2)
    sampler.scheduler.set_timesteps(10)
    index = 3
    alphas = sampler.scheduler.alphas_cumprod
    a_t, a_s = alphas[sampler.scheduler.timesteps[index]], alphas[sampler.scheduler.timesteps[index + 1]]
    x0, eps = 0.7, torch.randn(200_000, generator=torch.Generator().manual_seed(0))
    renoised = sampler._renoise(a_s.sqrt() * x0 + (1 - a_s).sqrt() * eps, index, torch.Generator().manual_seed(1))
    assert abs(renoised.mean().item() - a_t.sqrt().item() * x0) < 0.01
    assert abs(renoised.std().item() - (1 - a_t).sqrt().item()) < 0.01


def test_resampling_takes_every_step_but_the_last_that_many_times(pipe):
    from diffusers_ext.evaluation.divide_and_denoise.region_multidiffusion import WindowMultiDiffusion

    resolution = pipe.unet.config.sample_size * pipe.vae_scale_factor
    size = pipe.unet.config.sample_size
    boxes = torch.zeros(1, 1, size, size)
    boxes[0, 0, : size // 2, : size // 2] = 1.0
    latents = _latents(pipe, size)
    calls = []
    hook = pipe.unet.register_forward_hook(lambda *_: calls.append(1))
    try:
        images = {}
        for resampling in (1, 3):
            calls.clear()
            sampler = WindowMultiDiffusion(pipe, torch.zeros(3, resolution, resolution), size, 0, 1.0, resampling)
            images[resampling] = sampler(
                [["a red circle"]], boxes, latents, 4, 3.0, generator=torch.Generator().manual_seed(0)
            )
            assert len(calls) == 3 * resampling + 1  # 4 steps: the last one is taken once
    finally:
        hook.remove()
    assert np.abs(images[1] - images[3]).max() > 1e-3


def test_resampling_needs_a_positive_int_and_a_scheduler_with_alphas(pipe):
    from diffusers import FlowMatchEulerDiscreteScheduler

    background = torch.zeros(3, 8, 8)
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="`resampling` must be a positive int"):
            RegionMultiDiffusion(pipe, background, resampling=bad)
    flow = StableDiffusionPipeline(
        **{**get_tiny_sd_components(seed=0), "scheduler": FlowMatchEulerDiscreteScheduler()}
    )
    with pytest.raises(ValueError, match="alphas_cumprod"):
        RegionMultiDiffusion(flow, background, resampling=2)
    RegionMultiDiffusion(flow, background, resampling=1)  # no re-noising: any scheduler
