r"""
Small Stable-Diffusion-format components built from a handful of sizes: the real diffusers and transformers classes
(`AutoencoderKL`, `CLIPTextModel`, `UNet2DConditionModel`, `DDPMScheduler` / `DDIMScheduler`,
`StableDiffusionPipeline`), freshly initialised, so that a model trained from them loads anywhere a Stable Diffusion
checkpoint does.

`training/train_text_to_image_from_scratch.py` trains the mosaic zoo model from these, and the mosaic benchmark trains its proxy
models from the same builders (one definition of the architecture):

    >>> from diffusers_ext.data.mosaic import mosaic_tokenizer
    >>> tokenizer = mosaic_tokenizer(16)
    >>> vae, text_encoder, unet = build_stable_diffusion_components(tokenizer, resolution=32, max_length=16)
    >>> pipe = assemble_stable_diffusion_pipeline(vae, text_encoder, tokenizer, unet)
"""

from collections.abc import Sequence


# Stable Diffusion's noise schedule (scaled-linear betas from 0.00085 to 0.012 over 1000 steps).
STABLE_DIFFUSION_SCHEDULE = {
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "clip_sample": False,
}


def build_stable_diffusion_components(
    tokenizer,
    resolution: int = 32,
    latent_channels: int = 4,
    vae_channels: Sequence[int] = (16, 32, 32),
    unet_channels: Sequence[int] = (32, 64),
    unet_down_block_types: Sequence[str] | None = None,
    attention_head_dim: int = 8,
    text_hidden_size: int = 64,
    text_layers: int = 2,
    max_length: int = 16,
):
    r"""
    `(vae, text_encoder, unet)`, freshly initialised (seed the global RNG before calling for a reproducible draw).

    Args:
        tokenizer: the text encoder's tokenizer; its vocabulary size and `bos` / `eos` / `pad` ids size the encoder.
        resolution (`int`): image side in pixels; the VAE downsamples by `2 ** (len(vae_channels) - 1)`, so latents
            are `(latent_channels, resolution / 4, resolution / 4)` with the default three levels.
        latent_channels (`int`): channels of the VAE latent.
        vae_channels (`Sequence[int]`): `block_out_channels` of the VAE (one `DownEncoderBlock2D` per entry).
        unet_channels (`Sequence[int]`): `block_out_channels` of the UNet (one block per entry).
        unet_down_block_types (`Sequence[str]`, *optional*): the UNet's `down_block_types`, one
            `"CrossAttnDownBlock2D"` or `"DownBlock2D"` per level; the up path mirrors it. Defaults to cross-attention
            at every level. `("DownBlock2D", "CrossAttnDownBlock2D", ...)` drops attention at the finest level, as
            SDXL does: on CPU that halves a training step at 16x16 latents (the 256-token self-attention dominates).
        attention_head_dim (`int`): the UNet's attention head dimension.
        text_hidden_size (`int`): width of the `CLIPTextModel` (its projection and the UNet's cross-attention width).
        text_layers (`int`): transformer layers of the text encoder.
        max_length (`int`): the text encoder's `max_position_embeddings` (the prompt length it reads).
    """
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    vae_levels = len(vae_channels)
    vae = AutoencoderKL(
        sample_size=resolution,
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * vae_levels,
        up_block_types=("UpDecoderBlock2D",) * vae_levels,
        block_out_channels=tuple(vae_channels),
        layers_per_block=1,
        latent_channels=latent_channels,
        norm_num_groups=8,
        mid_block_add_attention=False,
    )
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=text_hidden_size,
            intermediate_size=2 * text_hidden_size,
            projection_dim=text_hidden_size,
            num_hidden_layers=text_layers,
            num_attention_heads=4,
            max_position_embeddings=max_length,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    unet_levels = len(unet_channels)
    down_block_types = tuple(unet_down_block_types or ("CrossAttnDownBlock2D",) * unet_levels)
    mirrored = {"CrossAttnDownBlock2D": "CrossAttnUpBlock2D", "DownBlock2D": "UpBlock2D"}
    if len(down_block_types) != unet_levels or not set(down_block_types) <= set(mirrored):
        raise ValueError(
            f"`unet_down_block_types` must name one of {sorted(mirrored)} per entry of `unet_channels` "
            f"({unet_levels} levels), got {list(down_block_types)}."
        )
    unet = UNet2DConditionModel(
        sample_size=resolution // 2 ** (vae_levels - 1),
        in_channels=latent_channels,
        out_channels=latent_channels,
        layers_per_block=1,
        block_out_channels=tuple(unet_channels),
        down_block_types=down_block_types,
        up_block_types=tuple(mirrored[block] for block in reversed(down_block_types)),
        cross_attention_dim=text_hidden_size,
        attention_head_dim=attention_head_dim,
        norm_num_groups=8,
    )
    return vae, text_encoder, unet


def _forget_source(model):
    """Drop the `_name_or_path` that diffusers' `from_pretrained` records in a model's config, so that a model
    trained further and saved elsewhere does not carry the folder (a path of one machine) it was loaded from."""
    from diffusers.configuration_utils import FrozenDict

    model._internal_dict = FrozenDict({k: v for k, v in model.config.items() if k != "_name_or_path"})
    return model


def load_stable_diffusion_components(path: str):
    """The `(vae, text_encoder, unet)` of a `StableDiffusionPipeline` folder in float32, to train further (a warm
    start of `training/train_text_to_image_from_scratch.py`; folders stored in float16 are upcast)."""
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel

    vae = AutoencoderKL.from_pretrained(path, subfolder="vae", dtype=torch.float32)
    text_encoder = CLIPTextModel.from_pretrained(path, subfolder="text_encoder", dtype=torch.float32)
    unet = UNet2DConditionModel.from_pretrained(path, subfolder="unet", dtype=torch.float32)
    return _forget_source(vae), text_encoder, _forget_source(unet)


def stable_diffusion_schedulers():
    """The training `DDPMScheduler` and the sampling `DDIMScheduler` on Stable Diffusion's noise schedule."""
    from diffusers import DDIMScheduler, DDPMScheduler

    return (
        DDPMScheduler(**STABLE_DIFFUSION_SCHEDULE),
        DDIMScheduler(**STABLE_DIFFUSION_SCHEDULE, set_alpha_to_one=False, steps_offset=1),
    )


def assemble_stable_diffusion_pipeline(vae, text_encoder, tokenizer, unet):
    """A `StableDiffusionPipeline` of these components with the DDIM sampler (no safety checker, no image encoder)."""
    from diffusers import StableDiffusionPipeline

    return StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=stable_diffusion_schedulers()[1],
        safety_checker=None,
        feature_extractor=None,
        image_encoder=None,
        requires_safety_checker=False,
    )


def build_stable_diffusion_3_components(
    tokenizer,
    latent_channels: int = 4,
    sample_size: int = 16,
    patch_size: int = 2,
    num_layers: int = 4,
    attention_head_dim: int = 32,
    num_attention_heads: int = 4,
    text_hidden_size: int = 64,
    text_layers: int = 2,
    max_length: int = 16,
):
    r"""
    `(text_encoder, text_encoder_2, text_encoder_3, transformer)` of a small `StableDiffusion3Pipeline`, freshly
    initialised (seed the global RNG before calling); the autoencoder comes from elsewhere (a trained `AutoencoderKL`
    whose latents have `latent_channels` channels and side `sample_size`).

    Shaped like SD3: two `CLIPTextModelWithProjection` of width `text_hidden_size` whose token embeddings are
    concatenated (`2 * text_hidden_size`) and zero-padded to the T5 width, and whose pooled projections are
    concatenated to `pooled_projection_dim = 2 * text_hidden_size`; a `T5EncoderModel` of width
    `joint_attention_dim = 2 * text_hidden_size`. All three read the prompt through `tokenizer`.

    Args:
        tokenizer: the text encoders' tokenizer; its vocabulary and special ids size the encoders.
        latent_channels (`int`), sample_size (`int`): the latents the transformer denoises, `(latent_channels,
            sample_size, sample_size)`.
        patch_size (`int`): the transformer's patch side; `(sample_size / patch_size) ** 2` image tokens.
        num_layers (`int`), attention_head_dim (`int`), num_attention_heads (`int`): the `SD3Transformer2DModel`
            (inner width `attention_head_dim * num_attention_heads`).
        text_hidden_size (`int`), text_layers (`int`): each CLIP encoder's width and depth (T5: twice the width).
        max_length (`int`): the CLIP encoders' `max_position_embeddings` (the prompt length they read).
    """
    from diffusers import SD3Transformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    def clip():
        return CLIPTextModelWithProjection(
            CLIPTextConfig(
                vocab_size=len(tokenizer),
                hidden_size=text_hidden_size,
                intermediate_size=2 * text_hidden_size,
                projection_dim=text_hidden_size,
                num_hidden_layers=text_layers,
                num_attention_heads=4,
                max_position_embeddings=max_length,
                bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        )

    width = 2 * text_hidden_size
    text_encoder, text_encoder_2 = clip(), clip()
    text_encoder_3 = T5EncoderModel(
        T5Config(
            vocab_size=len(tokenizer),
            d_model=width,
            d_kv=width // 4,
            d_ff=2 * width,
            num_layers=text_layers,
            num_heads=4,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=2 * max_length,
            feed_forward_proj="gated-gelu",
            dropout_rate=0.0,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.pad_token_id,
        )
    )
    transformer = SD3Transformer2DModel(
        sample_size=sample_size,
        patch_size=patch_size,
        in_channels=latent_channels,
        out_channels=latent_channels,
        num_layers=num_layers,
        attention_head_dim=attention_head_dim,
        num_attention_heads=num_attention_heads,
        joint_attention_dim=width,
        caption_projection_dim=attention_head_dim * num_attention_heads,
        pooled_projection_dim=width,
        pos_embed_max_size=sample_size // patch_size,
    )
    return text_encoder, text_encoder_2, text_encoder_3, transformer


def load_stable_diffusion_3_components(path: str):
    """The `(vae, text_encoder, text_encoder_2, text_encoder_3, transformer)` of a `StableDiffusion3Pipeline` folder
    in float32, to train further (a warm start of `training/train_text_to_image_sd3.py`; folders stored in float16 are
    upcast). The autoencoder keeps its `shift_factor` and `scaling_factor`."""
    import torch
    from diffusers import AutoencoderKL, SD3Transformer2DModel
    from transformers import CLIPTextModelWithProjection, T5EncoderModel

    vae = AutoencoderKL.from_pretrained(path, subfolder="vae", dtype=torch.float32)
    text_encoder = CLIPTextModelWithProjection.from_pretrained(path, subfolder="text_encoder", dtype=torch.float32)
    text_encoder_2 = CLIPTextModelWithProjection.from_pretrained(path, subfolder="text_encoder_2", dtype=torch.float32)
    text_encoder_3 = T5EncoderModel.from_pretrained(path, subfolder="text_encoder_3", dtype=torch.float32)
    transformer = SD3Transformer2DModel.from_pretrained(path, subfolder="transformer", dtype=torch.float32)
    return _forget_source(vae), text_encoder, text_encoder_2, text_encoder_3, _forget_source(transformer)


def assemble_stable_diffusion_3_pipeline(
    vae, text_encoder, text_encoder_2, text_encoder_3, tokenizer, transformer, shift: float = 1.0
):
    """A `StableDiffusion3Pipeline` of these components, the three text encoders reading `tokenizer`, with a
    `FlowMatchEulerDiscreteScheduler` of the given `shift` (1.0: a small image of few tokens needs no shift of the
    schedule towards noise)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    return StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=shift),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer,
        text_encoder_3=text_encoder_3,
        tokenizer_3=tokenizer,
    )
