r"""
How the pack's methods encode prompts for, and call, the denoiser of each text-to-image family (the constrained
unlearning trainer and DIRP share it).

| family | pipeline | denoiser | condition entries |
| --- | --- | --- | --- |
| `pack` | `ClassConditionalDDPMPipeline`, `DDPMPipeline` | `UNet2DModel` | class labels `(n,)` or none |
| `sd1_sd2` | `StableDiffusionPipeline`-like | `UNet2DConditionModel` | `encoder_hidden_states` (a plain tensor) |
| `sdxl` | `StableDiffusionXLPipeline` | `UNet2DConditionModel` (`addition_embed_type="text_time"`) | `encoder_hidden_states`, `text_embeds` (pooled), `time_ids` |
| `sd3` | `StableDiffusion3Pipeline` | `SD3Transformer2DModel` | `encoder_hidden_states`, `pooled_projections` |
| `flux` | `FluxPipeline` | `FluxTransformer2DModel` | `encoder_hidden_states`, `pooled_projections` |

Text conditions travel as [`Conditions`]: a batch of named tensors that indexes, concatenates and moves like one
tensor, so a method's pools, picks and batched forward passes do not depend on the family. Samples are always
`(batch, channels, height, width)` latents; Flux's 2x2 packing happens inside [`FluxFamily.predict`]. Prompts are
encoded with the diffusers pipeline's own `encode_prompt` (both CLIP encoders for SDXL; CLIP and T5 for SD3 / Flux).
"""

from collections.abc import Sequence

import torch


class Conditions:
    r"""
    A batch of conditioning tensors that share their first (batch) dimension, used like one tensor.

    Args:
        tensors (`dict[str, torch.Tensor]`): e.g. `encoder_hidden_states` `(n, seq, dim)` and `text_embeds`
            `(n, dim)`; each is a keyword argument of the denoiser (or of its `added_cond_kwargs`).
    """

    def __init__(self, tensors: dict[str, torch.Tensor]):
        sizes = {name: t.shape[0] for name, t in tensors.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"condition entries must share their batch size, got {sizes}.")
        self.tensors = dict(tensors)

    def __len__(self) -> int:
        return next(iter(self.tensors.values())).shape[0]

    def __getitem__(self, index) -> "Conditions":
        return Conditions({name: t[index] for name, t in self.tensors.items()})

    @property
    def device(self) -> torch.device:
        return next(iter(self.tensors.values())).device

    def to(self, *args, **kwargs) -> "Conditions":
        return Conditions({name: t.to(*args, **kwargs) for name, t in self.tensors.items()})

    @staticmethod
    def cat(parts: Sequence["Conditions"]) -> "Conditions":
        return Conditions({name: torch.cat([p.tensors[name] for p in parts]) for name in parts[0].tensors})


def cat_conditions(conds: list):
    """Concatenate the conditions of several parts: class-label tensors, [`Conditions`], or all None."""
    if conds[0] is None:
        return None
    if isinstance(conds[0], Conditions):
        return Conditions.cat(conds)
    return torch.cat(conds)


def check_known_tokens(prompts: Sequence[str], tokenizer, name: str) -> None:
    """Refuse prompts holding tokens `tokenizer` does not know: the model cannot know that concept."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or name == "reference_prompt":
        return
    for prompt in prompts:  # without padding and special tokens, which may share the unknown token's id
        if unk in tokenizer(prompt, add_special_tokens=False).input_ids:
            raise ValueError(
                f"`{name}` prompt {prompt!r} holds tokens the tokenizer does not know (mapped to "
                f"{tokenizer.unk_token!r}); the model cannot know that concept."
            )


ATTENTION_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
# SD3 / Flux joint attention: the text tokens' own projections carry the prompt into every image query
JOINT_ATTENTION_TARGETS = [*ATTENTION_TARGETS, "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"]


class DenoiserFamily:
    r"""
    Base class: one model family's denoiser, noise process, prompt encoding and call.

    Attributes:
        name (`str`): the family's key (`pack`, `sd1_sd2`, `sdxl`, `sd3`, `flux`).
        component (`str`): the pipeline attribute holding the denoiser (`unet` or `transformer`).
        text (`bool`): whether the denoiser is conditioned on prompts.
        lora_targets (`list[str]`): default LoRA target modules.
        lora_layers_argument (`str`): the keyword of the pipeline's `save_lora_weights` for these LoRA weights.
        flow_matching (`bool`): a rectified-flow model predicting the velocity (SD3, Flux), else epsilon / v
            prediction on a DDPM-family schedule.

    Args:
        pipeline: the diffusers pipeline holding the denoiser, its text encoders, tokenizers and VAE.
        max_sequence_length (`int`, *optional*): T5 tokens per prompt (SD3, Flux); default the pipeline's own.
        guidance_scale (`float`, defaults to 3.5): the guidance input of a guidance-distilled Flux transformer.
    """

    name = ""
    component = "unet"
    text = True
    lora_targets = ATTENTION_TARGETS
    lora_layers_argument = "unet_lora_layers"
    flow_matching = False

    def __init__(self, pipeline, max_sequence_length: int | None = None, guidance_scale: float = 3.5):
        self.pipeline = pipeline
        self.max_sequence_length = max_sequence_length
        self.guidance_scale = guidance_scale
        self.denoiser = getattr(pipeline, self.component)

    @property
    def vae_scale_factor(self) -> int:
        vae = getattr(self.pipeline, "vae", None)
        return 2 ** (len(vae.config.block_out_channels) - 1) if vae is not None else 1

    def default_latent_size(self) -> int:
        size = self.denoiser.config.sample_size
        return size if isinstance(size, int) else size[0]

    def sample_shape(self, resolution: int | None = None) -> tuple[int, int, int]:
        """`(channels, height, width)` of the latents of square images of `resolution` pixels (default the model's
        own size)."""
        if resolution is None:
            side = self.default_latent_size()
        else:
            if resolution % self.size_multiple():
                raise ValueError(
                    f"`resolution` {resolution} is not a multiple of {self.size_multiple()}, which "
                    f"{type(self.denoiser).__name__} with this VAE needs."
                )
            side = resolution // self.vae_scale_factor
        return (self.latent_channels(), side, side)

    def size_multiple(self) -> int:
        return self.vae_scale_factor

    def latent_channels(self) -> int:
        return self.denoiser.config.in_channels

    @torch.no_grad()
    def encode_prompts(
        self, prompts: list[str], name: str, image_size: int | None = None
    ) -> Conditions | torch.Tensor:
        """[`Conditions`] of `prompts` (the argument `name`, for errors) on the CPU in float32, one row per prompt
        (SD 1.x / 2.x: the prompt states `(n, seq, dim)`); `image_size` (pixels, default the model's) sets SDXL's
        time ids. The families with text encoders define it; a family without one (`text = False`) refuses."""
        raise TypeError(
            f"`{name}` holds prompts, but the {self.name!r} family's denoiser takes no text (it is conditioned on "
            "class labels or nothing)."
        )

    def _prompt_device(self):
        return next(self.pipeline.text_encoder.parameters()).device

    def call_kwargs(self, cond: Conditions, dtype: torch.dtype) -> dict:
        return {name: t.to(dtype) for name, t in cond.tensors.items()}

    def predict(self, model, x: torch.Tensor, timestep: torch.Tensor, cond, dtype: torch.dtype) -> torch.Tensor:
        """The prediction `(B, C, H, W)` of `model` (this family's denoiser, trained or frozen) at latents `x` and
        model timesteps `timestep` `(B,)` under `cond`, in the model's output dtype."""
        return model(x.to(dtype), timestep, **self.call_kwargs(cond, dtype)).sample


class ClassUNetFamily(DenoiserFamily):
    """A `UNet2DModel`, class-conditional (labels) or unconditional; LoRA also on its convolutions."""

    name = "pack"
    text = False
    lora_targets = ["conv1", "conv2", "time_emb_proj", *ATTENTION_TARGETS]

    def predict(self, model, x, timestep, cond, dtype):
        if cond is None:
            return model(x.to(dtype), timestep).sample
        return model(x.to(dtype), timestep, class_labels=cond).sample


class SDUNetFamily(DenoiserFamily):
    """An SD 1.x / 2.x-style `UNet2DConditionModel` (prompt states through cross-attention)."""

    name = "sd1_sd2"

    def encode_prompts(self, prompts, name, image_size=None):
        from .pipeline_utils import encode_text

        check_known_tokens(prompts, self.pipeline.tokenizer, name)
        states = encode_text(self.pipeline.tokenizer, self.pipeline.text_encoder, list(prompts), self._prompt_device())
        # one tensor is the whole condition: kept a plain `(n, seq, dim)` tensor, as the trainer has always held it
        return states[0].detach().float().cpu()

    def predict(self, model, x, timestep, cond, dtype):
        return model(x.to(dtype), timestep, encoder_hidden_states=cond.to(dtype)).sample


class SDXLUNetFamily(DenoiserFamily):
    """An SDXL `UNet2DConditionModel` (`addition_embed_type="text_time"`): the pipeline's `encode_prompt` (both CLIP
    encoders) gives the prompt states and the pooled embedding; the time ids are SDXL's `(original size, crop top-left,
    target size)` at the training resolution with no crop."""

    name = "sdxl"

    def encode_prompts(self, prompts, name, image_size=None):
        pipe = self.pipeline
        check_known_tokens(prompts, pipe.tokenizer, name)
        embeds, _, pooled, _ = pipe.encode_prompt(
            list(prompts), device=self._prompt_device(), do_classifier_free_guidance=False
        )
        image_size = image_size or self.default_latent_size() * self.vae_scale_factor
        size = (image_size, image_size) if isinstance(image_size, int) else tuple(int(n) for n in image_size)
        projection_dim = (
            pipe.text_encoder_2.config.projection_dim if pipe.text_encoder_2 is not None else pooled.shape[-1]
        )
        time_ids = pipe._get_add_time_ids(
            size, (0, 0), size, torch.float32, text_encoder_projection_dim=projection_dim
        )
        return Conditions(
            {
                "encoder_hidden_states": embeds.detach().float().cpu(),
                "text_embeds": pooled.detach().float().cpu(),
                "time_ids": time_ids.repeat(len(prompts), 1),
            }
        )

    def call_kwargs(self, cond, dtype):
        kwargs = super().call_kwargs(cond, dtype)
        added = {"text_embeds": kwargs.pop("text_embeds"), "time_ids": kwargs.pop("time_ids")}
        return {**kwargs, "added_cond_kwargs": added}


class SD3Family(DenoiserFamily):
    """An `SD3Transformer2DModel` (rectified flow, velocity prediction): the pipeline's `encode_prompt` (two CLIP
    encoders and T5) gives the joint-attention states and the pooled projections."""

    name = "sd3"
    component = "transformer"
    lora_targets = JOINT_ATTENTION_TARGETS
    lora_layers_argument = "transformer_lora_layers"
    flow_matching = True

    def size_multiple(self) -> int:
        return self.vae_scale_factor * self.denoiser.config.patch_size

    def encode_prompts(self, prompts, name, image_size=None):
        pipe = self.pipeline
        check_known_tokens(prompts, pipe.tokenizer, name)
        kwargs = {} if self.max_sequence_length is None else {"max_sequence_length": self.max_sequence_length}
        embeds, _, pooled, _ = pipe.encode_prompt(
            list(prompts), None, None, device=self._prompt_device(), do_classifier_free_guidance=False, **kwargs
        )
        return Conditions(
            {
                "encoder_hidden_states": embeds.detach().float().cpu(),
                "pooled_projections": pooled.detach().float().cpu(),
            }
        )

    def predict(self, model, x, timestep, cond, dtype):
        return model(hidden_states=x.to(dtype), timestep=timestep, **self.call_kwargs(cond, dtype), return_dict=False)[
            0
        ]


class FluxFamily(DenoiserFamily):
    """A `FluxTransformer2DModel` (rectified flow, velocity prediction, 2x2-packed latents): the pipeline's
    `encode_prompt` (CLIP pooled, T5 states); a guidance-distilled model (Flux.1-dev) gets `guidance_scale`
    as its guidance input at every call."""

    name = "flux"
    component = "transformer"
    lora_targets = JOINT_ATTENTION_TARGETS
    lora_layers_argument = "transformer_lora_layers"
    flow_matching = True

    def default_latent_size(self) -> int:
        return self.pipeline.default_sample_size * self.pipeline.vae_scale_factor // self.vae_scale_factor

    def size_multiple(self) -> int:
        return 2 * self.vae_scale_factor

    def latent_channels(self) -> int:
        return self.denoiser.config.in_channels // 4

    def encode_prompts(self, prompts, name, image_size=None):
        pipe = self.pipeline
        check_known_tokens(prompts, pipe.tokenizer, name)
        kwargs = {} if self.max_sequence_length is None else {"max_sequence_length": self.max_sequence_length}
        embeds, pooled, _ = pipe.encode_prompt(list(prompts), None, device=self._prompt_device(), **kwargs)
        return Conditions(
            {
                "encoder_hidden_states": embeds.detach().float().cpu(),
                "pooled_projections": pooled.detach().float().cpu(),
            }
        )

    def predict(self, model, x, timestep, cond, dtype):
        from diffusers import FluxPipeline

        batch, channels, height, width = x.shape
        kwargs = self.call_kwargs(cond, dtype)
        packed = FluxPipeline._pack_latents(x.to(dtype), batch, channels, height, width)
        image_ids = FluxPipeline._prepare_latent_image_ids(batch, height // 2, width // 2, x.device, dtype)
        text_ids = torch.zeros(kwargs["encoder_hidden_states"].shape[1], 3, device=x.device, dtype=dtype)
        config = self.denoiser.config
        guidance = None
        if config.guidance_embeds:
            guidance = torch.full((batch,), self.guidance_scale, device=x.device, dtype=torch.float32)
        out = model(
            hidden_states=packed,
            timestep=timestep.to(dtype) / 1000,
            guidance=guidance,
            txt_ids=text_ids,
            img_ids=image_ids,
            return_dict=False,
            **kwargs,
        )[0]
        return FluxPipeline._unpack_latents(out, height, width, 1)


FAMILIES = (ClassUNetFamily, SDUNetFamily, SDXLUNetFamily, SD3Family, FluxFamily)


def get_denoiser_family(pipeline, **options) -> DenoiserFamily:
    """The [`DenoiserFamily`] of `pipeline` (built with `options`: `max_sequence_length`, `guidance_scale`), or a
    `TypeError` naming what it holds."""
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        FluxTransformer2DModel,
        SD3Transformer2DModel,
        UNet2DConditionModel,
        UNet2DModel,
    )

    unet, transformer = getattr(pipeline, "unet", None), getattr(pipeline, "transformer", None)
    scheduler = getattr(pipeline, "scheduler", None)
    if isinstance(transformer, (SD3Transformer2DModel, FluxTransformer2DModel)):
        if not isinstance(scheduler, FlowMatchEulerDiscreteScheduler):
            raise TypeError(
                f"`pipeline.transformer` is a {type(transformer).__name__} (rectified flow) but `pipeline.scheduler` "
                f"is a {type(scheduler).__name__}; expected a FlowMatchEulerDiscreteScheduler."
            )
        return (SD3Family if isinstance(transformer, SD3Transformer2DModel) else FluxFamily)(pipeline, **options)
    if isinstance(unet, UNet2DConditionModel):
        addition = unet.config.addition_embed_type
        if addition not in (None, "text_time"):
            raise ValueError(
                f"`pipeline.unet` has `addition_embed_type={addition!r}`; the trainer runs SD 1.x / 2.x UNets and "
                "SDXL's 'text_time'."
            )
        return (SDXLUNetFamily if addition == "text_time" else SDUNetFamily)(pipeline, **options)
    if isinstance(unet, UNet2DModel):
        return ClassUNetFamily(pipeline, **options)
    raise TypeError(
        "`pipeline` must be a diffusers pipeline whose `unet` is a UNet2DModel or UNet2DConditionModel, or whose "
        f"`transformer` is an SD3Transformer2DModel or FluxTransformer2DModel; got {type(pipeline).__name__} with "
        f"unet {type(unet).__name__} and transformer {type(transformer).__name__}."
    )
