"""A small fine-tune of a text-to-image UNet on (image, caption) pairs, for benchmarks on the mosaic world.

[`finetune_unet`] trains `peft` LoRA adapters on the attention projections (`to_q`, `to_k`, `to_v`, `to_out.0`) of a
copy of a `StableDiffusionPipeline`'s `UNet2DConditionModel` (or, with `rank=None`, every weight of the copy,
DreamBooth-style) with the usual noise-prediction loss, the VAE and text encoder frozen, and returns the fine-tuned
copy (adapters fused into the weights, so the result is a plain `UNet2DConditionModel`) together with the adapters'
own weights. Benchmarks use it to make experts (models that saw only part of a world) and mimics (a model that learns
one subject from a few images, the use anti-mimicry protections attack); it is an evaluation tool, not a training
script (see `training/train_text_to_image_from_scratch.py` for the full `accelerate` script).
"""

import copy

import torch
import torch.nn.functional as F

from ..data.mosaic import images_to_tensor
from ..pipelines.pipeline_utils import (
    encode_text,
    encode_vae_latents,
    epsilon_and_x0_to_prediction,
    vp_coefficients,
)
from ..utils import check_positive_int


LORA_TARGET_MODULES = ("to_q", "to_k", "to_v", "to_out.0")


def _images_to_tensor(images) -> torch.Tensor:
    """PIL images, `(H, W, 3)` uint8 arrays or an `(N, 3, H, W)` tensor in [-1, 1] -> float `(N, 3, H, W)`."""
    if isinstance(images, torch.Tensor):
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"`images` must be a (N, 3, H, W) tensor in [-1, 1], got shape {tuple(images.shape)}.")
        return images.float()
    if len(images) == 0:
        raise ValueError("`images` must be a non-empty list of RGB images (PIL or (H, W, 3) arrays).")
    tensor = images_to_tensor(images)
    if tensor.shape[1] != 3:
        raise ValueError(f"`images` must be RGB images (PIL or (H, W, 3) arrays), got {tensor.shape[1]} channels.")
    return tensor


@torch.no_grad()
def _encode_latents(vae, images: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    """Scaled latents `(N, C, h, w)` of images `(N, 3, H, W)` in [-1, 1], `batch_size` at a time on the VAE's device."""
    device = next(vae.parameters()).device
    return torch.cat(
        [encode_vae_latents(vae, images[i : i + batch_size].to(device)) for i in range(0, len(images), batch_size)]
    )


def finetune_unet(
    pipeline,
    images,
    captions: list[str],
    num_steps: int = 300,
    rank: int | None = 4,
    learning_rate: float = 1e-3,
    seed: int = 0,
    batch_size: int = 32,
    caption_dropout: float = 0.1,
    lora_alpha: float | None = None,
    target_modules: tuple[str, ...] = LORA_TARGET_MODULES,
):
    r"""
    Fine-tune LoRA adapters (or, with `rank=None`, every weight) of a copy of `pipeline.unet`; the pipeline itself is
    left untouched.

    Each step draws `batch_size` pairs (with replacement), noises their latents at uniform random timesteps of
    `pipeline.scheduler`'s training schedule and regresses the scheduler's prediction target (`epsilon` or
    `v_prediction`); a `caption_dropout` share of the captions is replaced by the empty prompt, so that
    classifier-free guidance keeps working (with `caption_dropout=0` no draw is made for it). Latents and caption
    embeddings are computed once.

    Args:
        pipeline: a `StableDiffusionPipeline`-like object with `unet`, `vae`, `text_encoder`, `tokenizer` and a
            DDPM-family `scheduler`.
        images: `N` training images (PIL images, `(H, W, 3)` arrays, or a `(N, 3, H, W)` tensor in [-1, 1]).
        captions (`list[str]`): their `N` captions.
        num_steps (`int`, defaults to 300): optimisation steps.
        rank (`int` or `None`, defaults to 4): LoRA rank; `None` fine-tunes every UNet weight instead (no adapters).
        learning_rate (`float`, defaults to 1e-3): AdamW learning rate (constant).
        seed (`int`, defaults to 0): seeds the adapter initialisation, batches, noise and timesteps.
        batch_size (`int`, defaults to 32): pairs per step.
        caption_dropout (`float`, defaults to 0.1): share of empty captions.
        lora_alpha (`float`, *optional*): LoRA scaling numerator (`lora_alpha / rank` multiplies the update);
            defaults to `rank`.
        target_modules (`tuple[str]`): the attention projections that get adapters.

    Returns:
        `(unet, lora_state_dict, losses)`: the fine-tuned `UNet2DConditionModel` (a copy, adapters fused, eval
        mode, no gradients), the adapters' weights (`peft` names, on the CPU; `None` when `rank=None`) and the
        per-step losses.
    """
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    captions = list(captions)
    images = _images_to_tensor(images)
    if len(images) != len(captions) or not captions:
        raise ValueError(f"`images` ({len(images)}) and `captions` ({len(captions)}) must be equally long, not empty.")
    check_positive_int("num_steps", num_steps)
    check_positive_int("batch_size", batch_size)
    check_positive_int("rank", rank, optional=True)
    if not learning_rate > 0:
        raise ValueError(f"`learning_rate` must be > 0, got {learning_rate!r}.")
    if not 0 <= caption_dropout < 1:
        raise ValueError(f"`caption_dropout` must lie in [0, 1), got {caption_dropout!r}.")
    scheduler = pipeline.scheduler
    if not hasattr(scheduler, "alphas_cumprod"):
        raise ValueError(f"`pipeline.scheduler` ({type(scheduler).__name__}) must be a DDPM-family scheduler.")
    prediction_type = scheduler.config.get("prediction_type", "epsilon")
    if prediction_type not in ("epsilon", "v_prediction"):
        raise ValueError(f"the scheduler's `prediction_type` {prediction_type!r} is not supported.")

    latents = _encode_latents(pipeline.vae, images)
    device, dtype = latents.device, latents.dtype
    with torch.no_grad():
        embeds, _ = encode_text(
            pipeline.tokenizer, pipeline.text_encoder, captions + [""], pipeline.text_encoder.device
        )
    caption_embeds, empty_embed = embeds[:-1], embeds[-1:]
    alphas_cumprod = scheduler.alphas_cumprod.to(device=device, dtype=dtype)
    num_train_timesteps = len(alphas_cumprod)

    generator = torch.Generator().manual_seed(seed)
    unet = copy.deepcopy(pipeline.unet).to(device)
    unet.requires_grad_(rank is None)
    if rank is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            unet.add_adapter(
                LoraConfig(
                    r=rank,
                    lora_alpha=rank if lora_alpha is None else lora_alpha,
                    init_lora_weights="gaussian",
                    target_modules=list(target_modules),
                )
            )
    parameters = [p for p in unet.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=learning_rate, weight_decay=0.0)
    unet.train()
    losses = []
    for _ in range(num_steps):
        index = torch.randint(len(latents), (batch_size,), generator=generator)
        clean = latents[index]
        noise = torch.randn(clean.shape, generator=generator).to(device=device, dtype=dtype)
        timesteps = torch.randint(num_train_timesteps, (batch_size,), generator=generator).to(device)
        signal, sigma = vp_coefficients(alphas_cumprod[timesteps].view(-1, 1, 1, 1))
        noisy = signal * clean + sigma * noise
        target = epsilon_and_x0_to_prediction(noise, clean, signal, sigma, prediction_type)
        condition = caption_embeds[index]
        if caption_dropout > 0:
            drop = (torch.rand(batch_size, generator=generator) < caption_dropout).to(device).view(-1, 1, 1)
            condition = torch.where(drop, empty_embed.expand(batch_size, -1, -1), condition)
        prediction = unet(noisy, timesteps, encoder_hidden_states=condition).sample
        loss = F.mse_loss(prediction.float(), target.float())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    unet.eval()
    lora_state = None
    if rank is not None:
        lora_state = {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(unet).items()}
        unet.fuse_lora()
        unet.unload_lora()
    unet.requires_grad_(False)
    return unet, lora_state, losses


def unet_with_lora(
    pipeline,
    lora_state: dict,
    rank: int,
    lora_alpha: float | None = None,
    target_modules: tuple[str, ...] = LORA_TARGET_MODULES,
):
    """A copy of `pipeline.unet` with saved adapter weights (from [`finetune_unet`]) fused in, in eval mode."""
    from peft import LoraConfig
    from peft.utils import set_peft_model_state_dict

    unet = copy.deepcopy(pipeline.unet)
    unet.add_adapter(
        LoraConfig(r=rank, lora_alpha=rank if lora_alpha is None else lora_alpha, target_modules=list(target_modules))
    )
    result = set_peft_model_state_dict(unet, lora_state)
    if getattr(result, "unexpected_keys", None):
        raise ValueError(f"`lora_state` has keys the adapters do not: {result.unexpected_keys[:5]}.")
    unet.fuse_lora()
    unet.unload_lora()
    return unet.eval().requires_grad_(False)
