"""Region prompting for users: `pipe(prompt=[...], masks=[...])` (a `MaskAllocator`), and the oracle layout
(`RegionAllocator`), on SD 1.x, SDXL, SD3 and Flux at reduced width, in float32 and in the dtype each family's users
run (float16 for SD 1.x / SDXL, bfloat16 for SD3 / Flux); bad masks are refused before any model work."""

import numpy as np
import PIL.Image
import pytest
import torch
from diffusers import StableDiffusionPipeline
from test_divide_and_denoise_families import (
    CALL,
    LATENTS,
    USER_DTYPE,
    blob_latents,
    family_pipeline,
    make_exact_denoiser,
)

from diffusers_ext import DivideAndDenoisePipeline, MaskAllocator, RegionAllocator
from diffusers_ext.testing import count_module_forwards, get_tiny_sd_components


FAMILIES = ("sd", "sdxl", "sd3", "flux")
# the support matrix's column of each family
COLUMN = {"sd": "sd1_sd2", "sdxl": "sdxl", "sd3": "sd3", "flux": "flux"}
SIZES = {**{family: (call["height"], call["width"]) for family, call in CALL.items()}, "sd": (32, 32)}
CALLS = {**CALL, "sd": {"height": 32, "width": 32, "guidance_scale": 3.0}}
LATENT_SHAPES = {**LATENTS, "sd": (4, 16, 16)}
DTYPES = {**USER_DTYPE, "sd": torch.float16}


def region_pipeline(family: str, dtype=torch.float32) -> DivideAndDenoisePipeline:
    """One model of the family (seed 0) for every prompt: the region-prompting setup users run."""
    if family == "sd":
        source = StableDiffusionPipeline(**get_tiny_sd_components(0))
    else:
        source = family_pipeline(family)
    pipe = DivideAndDenoisePipeline.from_pipelines([source])
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(dtype=dtype)


def left_right_masks(height: int, width: int) -> list[np.ndarray]:
    """A left mask over the left 5/8 of the image and a right one over the right 5/8 (they overlap in the middle)."""
    left = np.zeros((height, width), dtype=bool)
    left[:, : 5 * width // 8] = True
    return [left, left[:, ::-1].copy()]


def params():
    out = []
    for family in FAMILIES:
        for dtype in (torch.float32, DTYPES[family]):
            name = "fp32" if dtype == torch.float32 else str(dtype).removeprefix("torch.")
            cell = pytest.mark.support_cell(
                "region_prompting", COLUMN[family], dtype=None if dtype == torch.float32 else name
            )
            out.append(pytest.param(family, dtype, marks=cell, id=f"{family}-{name}"))
    return out


@pytest.mark.parametrize("family, dtype", params())
def test_masks_prompt_each_region(family, dtype):
    """Each prompt's share of a latent position is its mask's share of that position's pixels, at every step."""
    pipe = region_pipeline(family, dtype)
    height, width = SIZES[family]
    masks = left_right_masks(height, width)
    out = pipe(
        prompt=["a red circle", "a blue square"],
        masks=masks,
        num_inference_steps=2,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
        **CALLS[family],
    )
    assert np.isfinite(out.images).all() and out.images.shape == (1, height, width, 3)
    latent_height, latent_width = LATENT_SHAPES[family][1:]
    factor = height // latent_height
    pooled = torch.nn.functional.avg_pool2d(torch.tensor(np.stack(masks), dtype=torch.float32)[None], factor)[0]
    expected = pooled / pooled.sum(dim=0)
    assert out.allocations.shape == (2, 1, 2, latent_height, latent_width)
    for step in out.allocations:
        torch.testing.assert_close(step[0], expected)
    assert out.timings["utility"] == 0 and out.timings["alignment"] == 0  # fixed regions: nothing computed


@pytest.mark.parametrize("family", FAMILIES)
def test_each_region_is_painted_by_its_own_prompt(family):
    """Two analytic experts (each the exact denoiser of a blob, one per half): with masks on their halves, each half of
    the sample is its own expert's blob, whatever the other expert wants there."""
    if family == "sd":
        sources = [StableDiffusionPipeline(**get_tiny_sd_components(seed)) for seed in (0, 1)]
    else:
        sources = [family_pipeline(family, seed) for seed in (0, 1)]
    pipe = DivideAndDenoisePipeline.from_pipelines(sources)
    pipe.set_progress_bar_config(disable=True)
    blob_family = "sdxl" if family == "sd" else family  # SD 1.x latents are shaped as SDXL's
    blobs = [blob_latents(blob_family, side) for side in ("left", "right")]
    for model, clean in zip(pipe.denoisers, blobs):
        make_exact_denoiser(model, blob_family, clean, pipe.scheduler)
    height, width = SIZES[family]
    halves = np.zeros((2, height, width), dtype=bool)
    halves[0, :, : width // 2], halves[1, :, width // 2 :] = True, True
    out = pipe(
        prompt=["left", "right"],
        masks=list(halves),
        num_inference_steps=6,
        output_type="latent",
        generator=torch.Generator().manual_seed(0),
        **{**CALLS[family], "guidance_scale": 1.0},
    )
    # exact (the experts are exact, their regions fixed), but for SD 1.x's DDIM, which ends at alphas_cumprod[0] < 1,
    # a little noise short of the clean sample
    torch.testing.assert_close(out.images, blobs[0] + blobs[1], atol=0.2 if family == "sd" else 1e-4, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_oracle_layout_runs_on_every_family(family):
    """`RegionAllocator` (the benchmarks' oracle layout, at the latent grid) divides as its regions say."""
    pipe = region_pipeline(family)
    regions = torch.zeros(2, *LATENT_SHAPES[family][1:])
    regions[0, :, :6], regions[1, :, 6:] = 1.0, 1.0
    out = pipe(
        prompt=["a", "b"],
        allocator=RegionAllocator(regions),
        num_inference_steps=2,
        output_type="latent",
        **CALLS[family],
    )
    assert torch.isfinite(out.images).all()
    torch.testing.assert_close(out.allocations[-1, 0], regions)


def test_masks_may_be_pil_images_uint8_arrays_or_tensors():
    height, width = 32, 32
    left = np.zeros((height, width), dtype=np.uint8)
    left[:, :16] = 255
    forms = [
        [PIL.Image.fromarray(left), PIL.Image.fromarray(255 - left)],
        [left, 255 - left],
        torch.tensor(np.stack([left, 255 - left]) / 255.0),
    ]
    weights = [MaskAllocator(masks).weights(2, 16, 16) for masks in forms]
    for w in weights[1:]:
        torch.testing.assert_close(w, weights[0])
    assert weights[0][0, :, :8].eq(1).all() and weights[0][1, :, 8:].eq(1).all()


def _bad_mask_cases(height, width):
    left, right = left_right_masks(height, width)
    small = [m[: height // 2, : width // 2] for m in (left, right)]
    empty = np.zeros_like(left)
    gap = left.copy()
    gap[:, :] = False
    gap[:, :4] = True  # together with `right`, leaves the middle uncovered
    return [
        ({"masks": small}, r"`masks` are 16x16 \(height x width\), but the image is 32x32"),
        ({"masks": [left, empty]}, r"`masks\[1\]` is empty"),
        ({"masks": [gap, right]}, r"`masks` leave \d+ of 1024 pixels uncovered"),
        ({"masks": [left, right, left]}, r"`masks` has 3 masks for 2 prompts"),
        ({"masks": [np.ones_like(left)]}, r"`masks` has 1 masks for 2 prompts"),
        ({"masks": [left, right[:, :-1]]}, r"`masks\[1\]` is \(32, 31\) but `masks\[0\]` is \(32, 32\)"),
        ({"masks": [left * 2.0, right]}, r"`masks\[0\]` must hold values in \[0, 1\]"),
        ({"masks": [left, right], "allocator": RegionAllocator()}, "either `masks` or `allocator`"),
        ({"masks": [left, right], "utility": "x0_saliency"}, "`masks` fix the allocation"),
        ({"masks": "left half"}, "`masks` must be a non-empty list"),
    ]


@pytest.mark.parametrize("case", range(10))
def test_bad_masks_are_refused_before_any_model_work(case):
    pipe = region_pipeline("sd")
    arguments, message = _bad_mask_cases(32, 32)[case]
    with count_module_forwards(pipe) as calls, pytest.raises(ValueError, match=message):
        pipe(prompt=["a red circle", "a blue square"], num_inference_steps=2, **arguments)
    assert calls["text_encoder"] == calls["denoisers"] == 0, calls


@pytest.mark.support_cell("region_prompting", "pack")
def test_masks_place_each_class_of_a_class_conditional_pixel_model():
    """The pack's own class-conditional pixel UNet (the dummy setup: classes 0 and 1 on an 8x12 canvas) takes masks
    the same way, one per class label."""
    from diffusers_ext.testing import get_dummy_components, get_dummy_inputs

    pipe = DivideAndDenoisePipeline(**get_dummy_components(DivideAndDenoisePipeline, 0))
    pipe.set_progress_bar_config(disable=True)
    masks = torch.zeros(2, 8, 12)
    masks[0, :, :7], masks[1, :, 5:] = 1.0, 1.0
    out = pipe(**{**get_dummy_inputs(DivideAndDenoisePipeline, 0), "masks": masks, "output_type": "pt"})
    assert torch.isfinite(out.images).all()
    torch.testing.assert_close(out.allocations[-1, 0], masks / masks.sum(dim=0))
