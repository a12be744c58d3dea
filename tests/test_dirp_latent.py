"""The latent-model DIRP test bed: mosaic subjects, prompt-conditioned protections, inversion amplification and the
DreamBooth-style mimic, on tiny Stable Diffusion components."""

import pytest
import torch
from diffusers import StableDiffusionPipeline

from diffusers_ext import DIRPPipeline
from diffusers_ext.data.mosaic_subjects import SUBJECTS, MosaicSubject, subject_images
from diffusers_ext.evaluation.dirp.latent_mimicry import mimic_frechet
from diffusers_ext.evaluation.dirp.latent_protections import inversion_amplification, protect_for_prompt
from diffusers_ext.evaluation.mosaic import MosaicFeatureNet
from diffusers_ext.evaluation.mosaic_finetune import finetune_unet
from diffusers_ext.models.tiny_components import get_tiny_sd_components


@pytest.fixture(scope="module")
def components():
    return get_tiny_sd_components(0)


@pytest.fixture(scope="module")
def dirp_pipe(components):
    pipe = DIRPPipeline(**{k: components[k] for k in ("unet", "scheduler", "vae", "text_encoder", "tokenizer")})
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def sd_pipe(components):
    pipe = StableDiffusionPipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_subject_images_are_deterministic_in_range_and_vary_between_images():
    a = subject_images("rocket", 3, seed=0)
    assert a.shape == (3, 3, 32, 32) and a.min() >= -1 and a.max() <= 1
    assert torch.equal(a, subject_images("rocket", 3, seed=0))
    assert not torch.equal(a[0], a[1])  # different positions and sizes
    assert not torch.equal(a, subject_images("tower", 3, seed=0))
    # the parts' colours are drawn: some pixels are far from the black background
    assert (a > 0.5).any()


def test_subject_inputs_are_checked():
    with pytest.raises(ValueError, match="subject"):
        subject_images("dragon", 2)
    with pytest.raises(ValueError, match="num_images"):
        subject_images("tower", 0)
    with pytest.raises(ValueError, match="part"):
        MosaicSubject("bad", "a red circle", (("purple", "circle", 0, 0, 0.5),))
    assert all(s.caption.split()[1] in ("cyan", "magenta") for s in SUBJECTS.values())


def test_protect_for_prompt_stays_in_budget_and_uses_the_prompt(dirp_pipe):
    clean = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    kwargs = {"eps": 8 / 255, "num_steps": 2}
    a = protect_for_prompt(dirp_pipe, clean, "advdm", "a photo", generator=torch.Generator().manual_seed(0), **kwargs)
    b = protect_for_prompt(dirp_pipe, clean, "advdm", "a cat", generator=torch.Generator().manual_seed(0), **kwargs)
    assert (a - clean).abs().max() <= 2 * 8 / 255 + 1e-6 and not torch.equal(a, clean)
    assert not torch.equal(a, b)  # the condition reaches the denoiser
    encoder = protect_for_prompt(dirp_pipe, clean, "photoguard", "a cat", **kwargs)
    assert (encoder - clean).abs().max() <= 2 * 8 / 255 + 1e-6
    with pytest.raises(ValueError, match="method"):
        protect_for_prompt(dirp_pipe, clean, "nightshade", "a cat")
    with pytest.raises(TypeError, match="prompt"):
        protect_for_prompt(dirp_pipe, clean, "advdm", None)


def test_inversion_amplification_compares_with_same_norm_noise(dirp_pipe):
    clean = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)) * 1.6 - 0.8
    delta = torch.zeros_like(clean)
    delta[:, :, :8] = 16 / 255  # a structured perturbation: a band
    report = inversion_amplification(dirp_pipe, clean, clean + delta, num_inversion_steps=2)
    assert set(report) == {
        "recon_error_clean",
        "recon_error_protected",
        "recon_error_noise",
        "amplification",
        "latent_amplification",
    }
    assert all(torch.isfinite(torch.tensor(v)) for v in report.values())
    assert report["latent_amplification"] > 0
    with pytest.raises(ValueError, match="shape"):
        inversion_amplification(dirp_pipe, clean, clean[:1])


def test_full_mimic_changes_a_copy_of_every_weight(sd_pipe):
    images = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(2)) * 2 - 1
    before = {k: v.clone() for k, v in sd_pipe.unet.state_dict().items()}
    full, lora_state, losses = finetune_unet(
        sd_pipe,
        images,
        ["a photo"] * 4,
        num_steps=2,
        batch_size=2,
        rank=None,
        learning_rate=1e-2,
        caption_dropout=0.0,
    )
    assert lora_state is None and len(losses) == 2
    assert not any("lora" in k for k in full.state_dict())
    assert any(not torch.equal(v, before[k]) for k, v in full.state_dict().items())
    assert not any(p.requires_grad for p in full.parameters())
    assert all(torch.equal(v, before[k]) for k, v in sd_pipe.unet.state_dict().items())  # the pipeline's own UNet
    with pytest.raises(ValueError, match="rank"):
        finetune_unet(sd_pipe, images, ["a photo"] * 4, num_steps=1, rank=0)


def test_mimic_frechet_scores_samples_in_an_independent_feature_space(sd_pipe):
    net = MosaicFeatureNet(18).eval()
    images = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(3)) * 2 - 1
    distance, samples = mimic_frechet(
        sd_pipe,
        net,
        images,
        "a photo",
        images,
        num_steps=1,
        num_samples=4,
        batch_size=2,
        sample_kwargs={"num_inference_steps": 2},
    )
    assert samples.shape == (4, 3, 32, 32) and distance >= 0
