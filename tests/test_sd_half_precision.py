"""DIRP and constrained unlearning on Stable Diffusion 1.x / 2.x-style components in float32 and in float16, the
dtype SD users run (the tiny components of the test kit; float16 convolutions and attention run on this CPU)."""

import pytest
import torch
from diffusers import StableDiffusionPipeline
from test_unlearning_trainer import TINY, _lora, _sd_scheduler

from diffusers_ext import ConstrainedUnlearningConfig, ConstrainedUnlearningTrainer, DIRPPipeline
from diffusers_ext.testing import get_dummy_components, get_tiny_sd_components


def dtype_params(method: str):
    return [
        pytest.param(torch.float32, marks=pytest.mark.support_cell(method, "sd1_sd2"), id="fp32"),
        pytest.param(torch.float16, marks=pytest.mark.support_cell(method, "sd1_sd2", dtype="float16"), id="fp16"),
    ]


@pytest.mark.parametrize("dtype", dtype_params("dirp"))
def test_dirp_purifies_through_a_stable_diffusion_vae_and_unet(dtype):
    """One purification iteration: the image changes within the perceptual budget and everything stays finite."""
    pipe = DIRPPipeline(**get_dummy_components(DIRPPipeline, 0)).to(dtype)
    pipe.set_progress_bar_config(disable=True)
    image = torch.rand((1, 3, 32, 32), generator=torch.Generator().manual_seed(0))
    out = pipe(
        image,
        num_inversion_steps=2,
        inversion_strength=0.5,
        num_iterations=2,
        perceptual="l2",
        perceptual_budget=0.05,
        output_type="pt",
    )
    assert pipe.unet.dtype == dtype and out.images.shape == (1, 3, 32, 32)
    assert torch.isfinite(out.images).all() and torch.isfinite(out.loss_history).all()
    assert (out.perceptual_distance <= 0.05 + 1e-4).all()
    assert not torch.equal(out.images, image)


@pytest.mark.parametrize(
    "dtype",
    [
        pytest.param(torch.float32, marks=pytest.mark.support_cell("unlearning", "sd1_sd2"), id="fp32"),
        # float16 gave NaN from the second step until the LoRA weights of a half-precision model were kept in
        # float32 (the unlearning trainer does so now)
        pytest.param(
            torch.float16, marks=pytest.mark.support_cell("unlearning", "sd1_sd2", dtype="float16"), id="fp16"
        ),
    ],
)
def test_prompt_unlearning_with_lora_on_stable_diffusion(dtype):
    components = get_tiny_sd_components(seed=0)
    for name in ("unet", "vae", "text_encoder"):
        components[name] = components[name].to(dtype)
    config = ConstrainedUnlearningConfig(
        **{**TINY, "forget_prompts": ["a photo of a cat"], "retain_prompts": ["a photo of a dog"]},
        constraint="reverse_kl",
        lambda_init=0.5,
        learning_rate=1e-2,
    )
    pipe = StableDiffusionPipeline(**{**components, "scheduler": _sd_scheduler()})
    trainer = ConstrainedUnlearningTrainer(pipe, config, peft_config=_lora(2))
    before = {
        k: v.clone() for k, v in trainer.accelerator.unwrap_model(trainer.unet).state_dict().items() if "lora" in k
    }
    history = trainer.train(max_steps=2)
    assert all(torch.isfinite(torch.tensor([h["loss"], h["lambda"]])).all() for h in history)
    after = trainer.accelerator.unwrap_model(trainer.unet).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the adapters trained
    assert all(v.dtype == dtype for k, v in after.items() if "lora" not in k)
