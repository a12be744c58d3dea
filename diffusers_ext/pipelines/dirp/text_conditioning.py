"""The text condition of [`DIRPPipeline`]: `prompt` or `prompt_embeds`, checked before any model work."""

import torch
from diffusers import UNet2DConditionModel


def _describe(value) -> str:
    return f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else repr(value)


def check_text_conditioning(pipe, prompt, prompt_embeds, num_images: int) -> None:
    """Raise a one-line `ValueError` if the pipeline cannot condition its `unet` on `prompt` / `prompt_embeds`
    (`(1, L, D)` or `(num_images, L, D)`): embeddings for a model without text, both given, or a text-conditioned
    `unet` without its tokenizer and text encoder."""
    family = pipe.model_family
    text_conditioned = isinstance(pipe.denoiser, UNet2DConditionModel) or family != "unet"
    if prompt_embeds is not None and family != "unet":
        raise ValueError(
            f"`prompt_embeds` are taken for SD 1.x / 2.x UNets; DIRP encodes {family.upper()} prompts (pooled embeddings"
            ", time ids, T5 states) with the model's own encoders: pass `prompt`."
        )
    if prompt_embeds is not None:
        if not text_conditioned:
            raise ValueError("`prompt_embeds` is given, but `unet` is not text-conditioned (UNet2DConditionModel).")
        if prompt not in ("", None):
            raise ValueError("Pass either `prompt` or `prompt_embeds`, not both.")
        if not isinstance(prompt_embeds, torch.Tensor) or prompt_embeds.ndim != 3:
            raise ValueError(f"`prompt_embeds` must be a (B, L, D) tensor, got {_describe(prompt_embeds)}.")
        if prompt_embeds.shape[0] not in (1, num_images):
            raise ValueError(
                f"`prompt_embeds` has {prompt_embeds.shape[0]} rows for {num_images} images; expected 1 or "
                f"{num_images}."
            )
    elif text_conditioned and (pipe.tokenizer is None or pipe.text_encoder is None):
        missing = [n for n in ("tokenizer", "text_encoder") if getattr(pipe, n) is None]
        raise ValueError(
            f"DIRPPipeline's denoiser is text-conditioned ({type(pipe.denoiser).__name__}) but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} None: build the pipeline with `tokenizer` and `text_encoder`, or "
            "pass `prompt_embeds`."
        )
