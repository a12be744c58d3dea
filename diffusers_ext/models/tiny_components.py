"""Tiny components built from configs: the real diffusers and transformers classes at toy sizes, seeded.

The zoo's small models and the training scripts that rebuild them start from these architectures (e.g.
``training/train_sd3_digits.py`` trains [`get_tiny_sd3_components`]), and the test kit re-exports every builder as
``diffusers_ext.testing.get_tiny_*``. Nothing here downloads anything: tokenizers are built in code
([`~diffusers_ext.models.tiny_tokenizers`]).
"""

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from diffusers import (
    AutoencoderKL,
    DDIMScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    FluxTransformer2DModel,
    SD3Transformer2DModel,
    UNet2DConditionModel,
    UNet2DModel,
)
from transformers import (
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    CLIPTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    T5Config,
    T5EncoderModel,
)

from .tiny_tokenizers import get_tiny_clip_tokenizer, get_tiny_lm_tokenizer, get_tiny_t5_tokenizer


__all__ = [
    "get_tiny_dream_like_lm",
    "get_tiny_flux_components",
    "get_tiny_llada_like_lm",
    "get_reduced_width_components",
    "get_tiny_pixel_unet",
    "get_tiny_sd3_components",
    "get_tiny_sd_components",
    "get_tiny_sdxl_components",
]


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Seed torch's CPU generator for the block and restore the caller's generator state afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _tiny_clip_text_config(tokenizer: CLIPTokenizer, hidden_size: int, projection_dim: int) -> CLIPTextConfig:
    return CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        projection_dim=projection_dim,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=tokenizer.model_max_length,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _tiny_vae(**overrides) -> AutoencoderKL:
    """An RGB `AutoencoderKL` with 4 latent channels and one downsampling (32x32 images, 16x16 latents)."""
    return AutoencoderKL(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(4, 8),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=2,
        **overrides,
    )


def _tiny_cross_attention_unet(**added) -> UNet2DConditionModel:
    """The tiny SD-style [`UNet2DConditionModel`] of [`get_tiny_sd_components`] (4 latent channels, blocks of 8 and 16
    channels, cross-attention dim 32), with `added` config (SDXL's added conditioning)."""
    return UNet2DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(8, 16),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=2,
        norm_num_groups=4,
        **added,
    )


def get_tiny_sd_components(seed: int = 0) -> dict[str, Any]:
    """Tiny Stable Diffusion 1.x-style components, usable as `StableDiffusionPipeline(**components)`.

    A [`UNet2DConditionModel`] (4 latent channels, blocks of 8 and 16 channels, cross-attention dim 32), an
    [`AutoencoderKL`] with one downsampling (`vae_scale_factor` 2), a 2-layer `CLIPTextModel` (hidden size 32) with
    [`get_tiny_clip_tokenizer`], the SD `DDIMScheduler` config, and no safety checker. The default image is 32x32
    (latents `(batch, 4, 16, 16)`); prompt embeddings are `(batch, 77, 32)`. Models are in eval mode.

    Args:
        seed (`int`, defaults to 0): seeds the weights; the global torch RNG state is left as it was.
    """
    with _seeded(seed):
        unet = _tiny_cross_attention_unet()
        vae = _tiny_vae()
        tokenizer = get_tiny_clip_tokenizer()
        text_encoder = CLIPTextModel(_tiny_clip_text_config(tokenizer, hidden_size=32, projection_dim=32))
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    return {
        "vae": vae.eval(),
        "text_encoder": text_encoder.eval(),
        "tokenizer": tokenizer,
        "unet": unet.eval(),
        "scheduler": scheduler,
        "safety_checker": None,
        "feature_extractor": None,
        "image_encoder": None,
        "requires_safety_checker": False,
    }


def get_tiny_sd3_components(seed: int = 0) -> dict[str, Any]:
    """Tiny Stable Diffusion 3-style components, usable as `StableDiffusion3Pipeline(**components)`.

    Shaped like SD3 in miniature: an [`SD3Transformer2DModel`] (patch size 2, one joint block, inner dim 32), an
    [`AutoencoderKL`] with 4 latent channels and one downsampling (`vae_scale_factor` 2, SD3's shift and scaling
    factors), two `CLIPTextModelWithProjection` of different widths (16 and 24, pooled projections concatenated to
    40 = `pooled_projection_dim`), a `T5EncoderModel` of width 48 (= `joint_attention_dim`; the CLIP embeddings,
    40 wide, are zero-padded to it as in SD3), the locally built CLIP and T5 tokenizers, and a
    `FlowMatchEulerDiscreteScheduler` with `shift=3.0`. The default image is 32x32 (latents `(batch, 4, 16, 16)`,
    64 image tokens). Models are in eval mode.

    Args:
        seed (`int`, defaults to 0): seeds the weights; the global torch RNG state is left as it was.
    """
    with _seeded(seed):
        transformer = SD3Transformer2DModel(
            sample_size=16,
            patch_size=2,
            in_channels=4,
            out_channels=4,
            num_layers=1,
            attention_head_dim=8,
            num_attention_heads=4,
            joint_attention_dim=48,
            caption_projection_dim=32,
            pooled_projection_dim=40,
            pos_embed_max_size=32,
        )
        vae = _tiny_vae(use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5305)
        tokenizer = get_tiny_clip_tokenizer()
        tokenizer_2 = get_tiny_clip_tokenizer()
        text_encoder = CLIPTextModelWithProjection(
            _tiny_clip_text_config(tokenizer, hidden_size=16, projection_dim=16)
        )
        text_encoder_2 = CLIPTextModelWithProjection(
            _tiny_clip_text_config(tokenizer_2, hidden_size=24, projection_dim=24)
        )
        tokenizer_3 = get_tiny_t5_tokenizer()
        text_encoder_3 = T5EncoderModel(
            T5Config(
                vocab_size=len(tokenizer_3),
                d_model=48,
                d_kv=12,
                d_ff=96,
                num_layers=2,
                num_heads=4,
                relative_attention_num_buckets=8,
                relative_attention_max_distance=32,
                feed_forward_proj="gated-gelu",
                dropout_rate=0.0,
                pad_token_id=tokenizer_3.pad_token_id,
                eos_token_id=tokenizer_3.eos_token_id,
                decoder_start_token_id=tokenizer_3.pad_token_id,
            )
        )
    return {
        "transformer": transformer.eval(),
        "scheduler": FlowMatchEulerDiscreteScheduler(shift=3.0),
        "vae": vae.eval(),
        "text_encoder": text_encoder.eval(),
        "tokenizer": tokenizer,
        "text_encoder_2": text_encoder_2.eval(),
        "tokenizer_2": tokenizer_2,
        "text_encoder_3": text_encoder_3.eval(),
        "tokenizer_3": tokenizer_3,
        "image_encoder": None,
        "feature_extractor": None,
    }


def get_tiny_sdxl_components(seed: int = 0) -> dict[str, Any]:
    """Tiny SDXL-style components, usable as `StableDiffusionXLPipeline(**components)`.

    A [`UNet2DConditionModel`] with SDXL's added conditioning (`addition_embed_type="text_time"`: pooled text
    embeddings and six size/crop time ids, `addition_time_embed_dim` 8; blocks of 8 and 16 channels, cross-attention
    dim 32), the RGB [`AutoencoderKL`] of [`get_tiny_sd_components`] (`vae_scale_factor` 2), a `CLIPTextModel` and a
    `CLIPTextModelWithProjection` of width 16 (their penultimate hidden states concatenated: prompt embeddings
    `(batch, 77, 32)`; pooled embeddings `(batch, 16)` from the second), the locally built CLIP tokenizers, and
    SDXL's `EulerDiscreteScheduler` config. The default image is 32x32 (latents `(batch, 4, 16, 16)`). Models are in
    eval mode.

    Args:
        seed (`int`, defaults to 0): seeds the weights; the global torch RNG state is left as it was.
    """
    with _seeded(seed):
        unet = _tiny_cross_attention_unet(
            use_linear_projection=True,
            addition_embed_type="text_time",  # the pooled embedding and six size/crop time ids
            addition_time_embed_dim=8,
            projection_class_embeddings_input_dim=6 * 8 + 16,
        )
        vae = _tiny_vae()
        tokenizer, tokenizer_2 = get_tiny_clip_tokenizer(), get_tiny_clip_tokenizer()
        text_encoder = CLIPTextModel(_tiny_clip_text_config(tokenizer, hidden_size=16, projection_dim=16))
        text_encoder_2 = CLIPTextModelWithProjection(
            _tiny_clip_text_config(tokenizer_2, hidden_size=16, projection_dim=16)
        )
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        timestep_spacing="leading",
        steps_offset=1,
    )
    return {
        "vae": vae.eval(),
        "text_encoder": text_encoder.eval(),
        "text_encoder_2": text_encoder_2.eval(),
        "tokenizer": tokenizer,
        "tokenizer_2": tokenizer_2,
        "unet": unet.eval(),
        "scheduler": scheduler,
        "image_encoder": None,
        "feature_extractor": None,
    }


def get_tiny_flux_components(seed: int = 0, guidance_embeds: bool = False) -> dict[str, Any]:
    """Tiny Flux-style components, usable as `FluxPipeline(**components)`.

    A [`FluxTransformer2DModel`] (one double-stream and one single-stream block, 2 heads of 16, packed input of 4
    channels: 2x2 patches of 1-channel latents; `guidance_embeds` as Flux.1-dev's distilled guidance input), a
    `CLIPTextModel` of width 32 (pooled embeddings `(batch, 32)`) and a `T5EncoderModel` of width 32 (prompt
    embeddings `(batch, max_sequence_length, 32)`) with the locally built tokenizers, a one-level [`AutoencoderKL`]
    with one latent channel (`vae_scale_factor` 1, Flux's shift and scaling factors) and a
    `FlowMatchEulerDiscreteScheduler`. Models are in eval mode.

    Args:
        seed (`int`, defaults to 0): seeds the weights; the global torch RNG state is left as it was.
        guidance_embeds (`bool`, defaults to `False`): whether the transformer takes a guidance scale (Flux.1-dev) or
            not (Flux.1-schnell).
    """
    tokenizer, tokenizer_2 = get_tiny_clip_tokenizer(), get_tiny_t5_tokenizer()
    with _seeded(seed):
        transformer = FluxTransformer2DModel(
            patch_size=1,
            in_channels=4,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            pooled_projection_dim=32,
            axes_dims_rope=[4, 4, 8],
            guidance_embeds=guidance_embeds,
        )
        text_encoder = CLIPTextModel(
            CLIPTextConfig(
                vocab_size=len(tokenizer),
                hidden_size=32,
                intermediate_size=37,
                num_hidden_layers=2,
                num_attention_heads=4,
                max_position_embeddings=77,
                bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        )
        text_encoder_2 = T5EncoderModel(
            T5Config(
                vocab_size=len(tokenizer_2),
                d_model=32,
                d_kv=8,
                d_ff=37,
                num_layers=2,
                num_heads=4,
                relative_attention_num_buckets=8,
                pad_token_id=0,
                eos_token_id=1,
                decoder_start_token_id=0,
            )
        )
        vae = AutoencoderKL(
            sample_size=32,
            in_channels=3,
            out_channels=3,
            block_out_channels=(4,),
            layers_per_block=1,
            latent_channels=1,
            norm_num_groups=1,
            use_quant_conv=False,
            use_post_quant_conv=False,
            shift_factor=0.0609,
            scaling_factor=1.5035,
        )
    return {
        "transformer": transformer.eval(),
        "text_encoder": text_encoder.eval(),
        "tokenizer": tokenizer,
        "text_encoder_2": text_encoder_2.eval(),
        "tokenizer_2": tokenizer_2,
        "vae": vae.eval(),
        "scheduler": FlowMatchEulerDiscreteScheduler(),
    }


REDUCED_WIDTH_FAMILIES = ("sdxl", "sd3", "flux")


def _reduced_width_vae(latent_channels: int, **overrides) -> AutoencoderKL:
    """An RGB `AutoencoderKL` with SD's four levels (`vae_scale_factor` 8) at an eighth of SD's widths."""
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(16, 32, 64, 64),
        layers_per_block=2,
        latent_channels=latent_channels,
        norm_num_groups=8,
        **overrides,
    )


def get_reduced_width_components(family: str, seed: int = 0) -> dict[str, Any]:
    r"""
    SDXL-, SD3- or Flux-shaped components at reduced width for measurements (benchmarks), with the real models'
    depth structure and an 8x VAE: 64x64 latents are 512x512 images.

    - `"sdxl"`: a `UNet2DConditionModel` with SDXL's three levels, two residual blocks per level, transformer depths
      (0, 2, 2), linear projections and `addition_embed_type="text_time"`, at channels (32, 64, 128) (SDXL: 320,
      640, 1280); two CLIP encoders of width 32; a 4-channel VAE; SDXL's Euler scheduler.
    - `"sd3"`: an `SD3Transformer2DModel` of 4 joint blocks, inner dim 64, patch 2, 16 latent channels; SD3's two
      CLIP encoders (widths 32) and a T5 of width 64; a 16-channel VAE; the flow-matching scheduler with shift 3.
    - `"flux"`: a `FluxTransformer2DModel` of 2 double- and 4 single-stream blocks, inner dim 64, distilled guidance
      input, 2x2-packed 16-channel latents; CLIP (width 32) and T5 (width 64); a 16-channel VAE; Flux's dynamically
      shifted flow-matching scheduler.

    Usable as `StableDiffusionXLPipeline(**components)`, `StableDiffusion3Pipeline(...)` or `FluxPipeline(...)`.

    Args:
        family (`str`): one of `"sdxl"`, `"sd3"`, `"flux"`.
        seed (`int`, defaults to 0): seeds the weights; the global torch RNG state is left as it was.
    """
    if family not in REDUCED_WIDTH_FAMILIES:
        raise ValueError(f"`family` must be one of {REDUCED_WIDTH_FAMILIES}, got {family!r}.")
    with _seeded(seed):
        tokenizer = get_tiny_clip_tokenizer()
        clip = CLIPTextModelWithProjection(_tiny_clip_text_config(tokenizer, hidden_size=32, projection_dim=32))
        if family == "sdxl":
            unet = UNet2DConditionModel(
                sample_size=64,
                in_channels=4,
                out_channels=4,
                layers_per_block=2,
                block_out_channels=(32, 64, 128),
                down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
                up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
                transformer_layers_per_block=(1, 2, 2),
                attention_head_dim=(2, 4, 8),
                use_linear_projection=True,
                cross_attention_dim=64,
                addition_embed_type="text_time",
                addition_time_embed_dim=16,
                projection_class_embeddings_input_dim=6 * 16 + 32,
                norm_num_groups=16,
            )
            return {
                "unet": unet.eval(),
                "vae": _reduced_width_vae(4).eval(),
                "text_encoder": CLIPTextModel(_tiny_clip_text_config(tokenizer, 32, 32)).eval(),
                "text_encoder_2": clip.eval(),
                "tokenizer": tokenizer,
                "tokenizer_2": get_tiny_clip_tokenizer(),
                "scheduler": EulerDiscreteScheduler(
                    beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", timestep_spacing="leading"
                ),
                "image_encoder": None,
                "feature_extractor": None,
            }
        tokenizer_t5 = get_tiny_t5_tokenizer()
        t5 = T5EncoderModel(
            T5Config(
                vocab_size=len(tokenizer_t5),
                d_model=64,
                d_kv=16,
                d_ff=128,
                num_layers=2,
                num_heads=4,
                relative_attention_num_buckets=8,
                feed_forward_proj="gated-gelu",
                pad_token_id=tokenizer_t5.pad_token_id,
                eos_token_id=tokenizer_t5.eos_token_id,
                decoder_start_token_id=tokenizer_t5.pad_token_id,
            )
        )
        vae = _reduced_width_vae(16, use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0609)
        if family == "sd3":
            transformer = SD3Transformer2DModel(
                sample_size=64,
                patch_size=2,
                in_channels=16,
                out_channels=16,
                num_layers=4,
                attention_head_dim=16,
                num_attention_heads=4,
                joint_attention_dim=64,
                caption_projection_dim=64,
                pooled_projection_dim=64,
                pos_embed_max_size=64,
            )
            clip_2 = CLIPTextModelWithProjection(_tiny_clip_text_config(tokenizer, hidden_size=32, projection_dim=32))
            return {
                "transformer": transformer.eval(),
                "scheduler": FlowMatchEulerDiscreteScheduler(shift=3.0),
                "vae": vae.eval(),
                "text_encoder": clip.eval(),
                "tokenizer": tokenizer,
                "text_encoder_2": clip_2.eval(),
                "tokenizer_2": get_tiny_clip_tokenizer(),
                "text_encoder_3": t5.eval(),
                "tokenizer_3": tokenizer_t5,
                "image_encoder": None,
                "feature_extractor": None,
            }
        transformer = FluxTransformer2DModel(
            patch_size=1,
            in_channels=64,
            num_layers=2,
            num_single_layers=4,
            attention_head_dim=16,
            num_attention_heads=4,
            joint_attention_dim=64,
            pooled_projection_dim=32,
            guidance_embeds=True,
            axes_dims_rope=(4, 6, 6),
        )
        return {
            "transformer": transformer.eval(),
            "scheduler": FlowMatchEulerDiscreteScheduler(
                shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15
            ),
            "vae": vae.eval(),
            "text_encoder": CLIPTextModel(_tiny_clip_text_config(tokenizer, 32, 32)).eval(),
            "tokenizer": tokenizer,
            "text_encoder_2": t5.eval(),
            "tokenizer_2": tokenizer_t5,
        }


def get_tiny_pixel_unet(
    seed: int = 0, sample_size: int = 8, in_channels: int = 1, num_class_embeds: int | None = None
) -> UNet2DModel:
    """A tiny pixel-space [`UNet2DModel`]: two levels (8 and 16 channels, attention at the lower one).

    It maps `(batch, in_channels, sample_size, sample_size)` to the same shape; with `num_class_embeds` it takes
    `class_labels` of shape `(batch,)` with values in `[0, num_class_embeds)`. The model is in eval mode.

    Args:
        seed (`int`, defaults to 0): seeds the weights; the global torch RNG state is left as it was.
        sample_size (`int`, defaults to 8): image side; must be even (one downsampling).
        in_channels (`int`, defaults to 1): image channels (also the output channels).
        num_class_embeds (`int`, *optional*): size of the class embedding table (include the null class).
    """
    if sample_size < 2 or sample_size % 2:
        raise ValueError(f"`sample_size` must be an even int >= 2, got {sample_size!r}.")
    with _seeded(seed):
        unet = UNet2DModel(
            sample_size=sample_size,
            in_channels=in_channels,
            out_channels=in_channels,
            layers_per_block=1,
            block_out_channels=(8, 16),
            down_block_types=("DownBlock2D", "AttnDownBlock2D"),
            up_block_types=("AttnUpBlock2D", "UpBlock2D"),
            attention_head_dim=8,
            norm_num_groups=4,
            num_class_embeds=num_class_embeds,
        )
    return unet.eval()


def _tiny_bidirectional_lm(config_class, model_class, seed: int, shift_logits: bool, num_key_value_heads: int):
    tokenizer = get_tiny_lm_tokenizer()
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=tokenizer.model_max_length,
        tie_word_embeddings=False,
        use_cache=False,
        is_causal=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        mask_token_id=tokenizer.mask_token_id,
        shift_logits=shift_logits,
    )
    with _seeded(seed):
        model = model_class(config)
    return model.eval(), tokenizer


def get_tiny_llada_like_lm(seed: int = 0) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """A tiny masked-diffusion LM stand-in in the LLaDA convention: a Llama decoder with causal masking disabled.

    Convention (recorded in `model.config`): `is_causal=False` (every position attends to every other, padding
    excepted), `shift_logits=False` (the logits at position `i` predict token `i`: a masked position is read out
    where it stands), and `mask_token_id` is the tokenizer's `<|mask|>`. `use_cache=False`.

    `model(input_ids, attention_mask=None).logits` maps `input_ids` of shape `(batch, seq)` to logits of shape
    `(batch, seq, vocab_size)`, `vocab_size == len(tokenizer)` (262). 2 layers, hidden size 32, 4 heads.

    Args:
        seed (`int`, defaults to 0): seeds the weights; the global torch RNG state is left as it was.

    Returns:
        `tuple`: `(model, tokenizer)`, the model in eval mode and [`get_tiny_lm_tokenizer`]'s tokenizer.
    """
    return _tiny_bidirectional_lm(LlamaConfig, LlamaForCausalLM, seed, shift_logits=False, num_key_value_heads=4)


def get_tiny_dream_like_lm(seed: int = 0) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """A tiny masked-diffusion LM stand-in in the Dream convention: a Qwen2 decoder with causal masking disabled.

    Convention (recorded in `model.config`): `is_causal=False` (full bidirectional attention, padding excepted),
    `shift_logits=True` (the logits at position `i` predict token `i + 1`, as in Dream, which keeps the
    autoregressive head it was initialised from: read the prediction for position `j` at `j - 1`), and
    `mask_token_id` is the tokenizer's `<|mask|>`. `use_cache=False`.

    `model(input_ids, attention_mask=None).logits` maps `input_ids` of shape `(batch, seq)` to logits of shape
    `(batch, seq, vocab_size)`, `vocab_size == len(tokenizer)` (262). 2 layers, hidden size 32, 4 query and 2
    key/value heads.

    Args:
        seed (`int`, defaults to 0): seeds the weights; the global torch RNG state is left as it was.

    Returns:
        `tuple`: `(model, tokenizer)`, the model in eval mode and [`get_tiny_lm_tokenizer`]'s tokenizer.
    """
    return _tiny_bidirectional_lm(Qwen2Config, Qwen2ForCausalLM, seed, shift_logits=True, num_key_value_heads=2)
