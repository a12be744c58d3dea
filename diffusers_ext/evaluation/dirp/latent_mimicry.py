r"""
The downstream test of a protection on a latent text-to-image model: a LoRA mimic learns a subject from images.

The mimic fine-tunes a copy of a `StableDiffusionPipeline`'s UNet (every weight, or LoRA adapters on the attention
projections) on a few images of one subject, all captioned with the subject's prompt (DreamBooth's use, the one
anti-mimicry protections attack), with the mosaic world's one fine-tuner
([`~diffusers_ext.evaluation.mosaic_finetune.finetune_unet`]), then samples that prompt. The samples are scored by
their Fréchet distance to held-out renders of the subject, in the feature space of the world's independent feature
network ([`~diffusers_ext.evaluation.mosaic.MosaicFeatureNet`], trained on real renders only: not the UNet, the VAE
or the text encoder that protections and purifiers work through).
"""

import torch

from ...metrics import frechet_distance
from ..mosaic import MosaicFeatureNet
from ..mosaic_finetune import finetune_unet


@torch.no_grad()
def sample_mimic(
    sd_pipe,
    unet,
    caption: str,
    num_samples: int = 32,
    num_inference_steps: int = 15,
    guidance_scale: float = 4.0,
    seed: int = 0,
) -> torch.Tensor:
    """Sample `caption` from `sd_pipe` with `unet` swapped in: `(num_samples, 3, H, W)` in [-1, 1]."""
    mimic = type(sd_pipe)(**{**sd_pipe.components, "unet": unet})
    mimic.set_progress_bar_config(disable=True)
    side = sd_pipe.unet.config.sample_size * 2 ** (len(sd_pipe.vae.config.block_out_channels) - 1)
    out = mimic(
        [caption] * num_samples,
        height=side,
        width=side,
        num_inference_steps=num_inference_steps,
        guidance_scale=guidance_scale,
        generator=torch.Generator().manual_seed(seed),
        output_type="pt",
    )
    return out.images.cpu() * 2 - 1


@torch.no_grad()
def mimic_frechet(
    sd_pipe,
    feature_net: MosaicFeatureNet,
    images: torch.Tensor,
    caption: str,
    reference: torch.Tensor,
    num_steps: int = 150,
    num_samples: int = 32,
    seed: int = 0,
    rank: int | None = None,
    learning_rate: float = 3e-3,
    batch_size: int = 8,
    sample_kwargs: dict | None = None,
) -> tuple[float, torch.Tensor]:
    r"""
    Fine-tune a mimic on `images` `(N, 3, H, W)` in [-1, 1], all captioned `caption` (every UNet weight, or rank-`rank`
    LoRA adapters; no caption dropout, as DreamBooth), sample `num_samples` of `caption` and return the Fréchet
    distance of their features to those of `reference` `(M, 3, H, W)` (held-out renders of the subject), with the
    samples. `sample_kwargs` go to [`sample_mimic`] (`guidance_scale`, `num_inference_steps`).
    """
    with torch.enable_grad():
        unet, _, _ = finetune_unet(
            sd_pipe,
            images,
            [caption] * len(images),
            num_steps=num_steps,
            rank=rank,
            learning_rate=learning_rate,
            seed=seed,
            batch_size=batch_size,
            caption_dropout=0.0,
        )
    samples = sample_mimic(sd_pipe, unet, caption, num_samples=num_samples, seed=seed + 7, **(sample_kwargs or {}))
    distance = frechet_distance(feature_net.features(samples).double(), feature_net.features(reference).double())
    return distance, samples
