"""What the GRPO trainers need from a flow-matching text-to-image pipeline, for SD3 and Flux.

An adapter encodes prompts, draws the initial latents, sets the schedule, calls the transformer (with guidance) and
decodes latents to images in [0, 1]. Conditioning travels as a dict of per-image tensors (first dimension = batch)
so that the trainers can index, perturb and store it without knowing the model family.
"""

from abc import ABC, abstractmethod

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from ..pipelines.pipeline_utils import decode_vae_latents


class FlowPipelineAdapter(ABC):
    """Base class; see [`SD3Adapter`] and [`FluxAdapter`]."""

    #: conditioning entries that E2PO may perturb (token sequence first, then pooled vectors)
    perturbable = ("prompt_embeds", "pooled_prompt_embeds")

    def __init__(self, pipeline):
        self.pipeline = pipeline

    def default_size(self) -> tuple[int, int]:
        pipe = self.pipeline
        size = pipe.default_sample_size * pipe.vae_scale_factor
        return size, size

    def uses_cfg(self, guidance_scale: float) -> bool:
        return False

    #: the pipeline's per-text-encoder prompt arguments (`prompt_2`, `prompt_3`) that dataset rows may carry
    encoder_prompt_keys: tuple[str, ...] = ()

    @abstractmethod
    def encode(
        self,
        prompts: list[str],
        negative_prompt: str,
        guidance_scale: float,
        max_sequence_length: int,
        encoder_prompts: dict[str, list[str]] | None = None,
    ):
        """Return `(cond, uncond)`: dicts of tensors with one row per prompt; `uncond` is None without CFG.

        `encoder_prompts` maps some of `encoder_prompt_keys` to one prompt per row for that text encoder, as the
        pipeline's own `prompt_2` / `prompt_3` arguments do; an encoder without one is given `prompts`.
        """

    @abstractmethod
    def prepare_latents(self, batch_size, height, width, generator, device, dtype) -> torch.Tensor:
        """Implemented by each pipeline family."""

    @abstractmethod
    def set_timesteps(self, scheduler, num_inference_steps: int, latents: torch.Tensor, device) -> torch.Tensor:
        """Implemented by each pipeline family."""

    @abstractmethod
    def velocity(self, transformer, latents, t, cond, uncond, guidance_scale: float) -> torch.Tensor:
        """Implemented by each pipeline family."""

    @abstractmethod
    def decode(self, latents: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Implemented by each pipeline family."""


class SD3Adapter(FlowPipelineAdapter):
    """[`StableDiffusion3Pipeline`]: true classifier-free guidance; the unconditional branch is never trained."""

    def uses_cfg(self, guidance_scale: float) -> bool:
        return guidance_scale > 1.0

    encoder_prompt_keys = ("prompt_2", "prompt_3")

    def encode(self, prompts, negative_prompt, guidance_scale, max_sequence_length, encoder_prompts=None):
        cfg = self.uses_cfg(guidance_scale)
        encoder_prompts = encoder_prompts or {}
        pe, ne, pp, npp = self.pipeline.encode_prompt(
            prompts,
            encoder_prompts.get("prompt_2", prompts),
            encoder_prompts.get("prompt_3", prompts),
            device=self.pipeline._execution_device,
            do_classifier_free_guidance=cfg,
            negative_prompt=[negative_prompt] * len(prompts) if cfg else None,
            max_sequence_length=max_sequence_length,
        )
        cond = {"prompt_embeds": pe, "pooled_prompt_embeds": pp}
        return cond, ({"prompt_embeds": ne, "pooled_prompt_embeds": npp} if cfg else None)

    def prepare_latents(self, batch_size, height, width, generator, device, dtype):
        channels = self.pipeline.transformer.config.in_channels
        return self.pipeline.prepare_latents(batch_size, channels, height, width, dtype, device, generator)

    def set_timesteps(self, scheduler, num_inference_steps, latents, device):
        kwargs = {}
        if scheduler.config.get("use_dynamic_shifting", False):
            from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift

            patch = self.pipeline.transformer.config.patch_size
            seq_len = (latents.shape[-2] // patch) * (latents.shape[-1] // patch)
            kwargs["mu"] = calculate_shift(
                seq_len,
                scheduler.config.get("base_image_seq_len", 256),
                scheduler.config.get("max_image_seq_len", 4096),
                scheduler.config.get("base_shift", 0.5),
                scheduler.config.get("max_shift", 1.16),
            )
        scheduler.set_timesteps(num_inference_steps, device=device, **kwargs)
        return scheduler.timesteps

    def velocity(self, transformer, latents, t, cond, uncond, guidance_scale):
        batch = latents.shape[0]
        if uncond is None:
            return transformer(
                hidden_states=latents,
                timestep=t.expand(batch),
                encoder_hidden_states=cond["prompt_embeds"],
                pooled_projections=cond["pooled_prompt_embeds"],
                return_dict=False,
            )[0]
        output = transformer(
            hidden_states=torch.cat([latents, latents]),
            timestep=t.expand(2 * batch),
            encoder_hidden_states=torch.cat([uncond["prompt_embeds"], cond["prompt_embeds"]]),
            pooled_projections=torch.cat([uncond["pooled_prompt_embeds"], cond["pooled_prompt_embeds"]]),
            return_dict=False,
        )[0]
        unconditional, conditional = output.chunk(2)
        # Flow-GRPO: the unconditional branch is not trained (its gradient is cut).
        unconditional = unconditional.detach()
        return unconditional + guidance_scale * (conditional - unconditional)

    def decode(self, latents, height, width):
        image = decode_vae_latents(self.pipeline.vae, latents)
        return (image.float() / 2 + 0.5).clamp(0, 1)


class FluxAdapter(FlowPipelineAdapter):
    """[`FluxPipeline`]: guidance-distilled (the guidance scale is a transformer input), packed latents."""

    encoder_prompt_keys = ("prompt_2",)

    def encode(self, prompts, negative_prompt, guidance_scale, max_sequence_length, encoder_prompts=None):
        pe, pp, text_ids = self.pipeline.encode_prompt(
            prompts,
            (encoder_prompts or {}).get("prompt_2", prompts),
            device=self.pipeline._execution_device,
            max_sequence_length=max_sequence_length,
        )
        self._text_ids = text_ids
        return {"prompt_embeds": pe, "pooled_prompt_embeds": pp}, None

    def prepare_latents(self, batch_size, height, width, generator, device, dtype):
        channels = self.pipeline.transformer.config.in_channels // 4
        latents, image_ids = self.pipeline.prepare_latents(
            batch_size, channels, height, width, dtype, device, generator
        )
        self._image_ids = image_ids
        return latents

    def set_timesteps(self, scheduler, num_inference_steps, latents, device):
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift

        sigmas = np.linspace(1.0, 1 / num_inference_steps, num_inference_steps)
        mu = calculate_shift(
            latents.shape[1],
            scheduler.config.get("base_image_seq_len", 256),
            scheduler.config.get("max_image_seq_len", 4096),
            scheduler.config.get("base_shift", 0.5),
            scheduler.config.get("max_shift", 1.15),
        )
        scheduler.set_timesteps(sigmas=sigmas, mu=mu, device=device)
        return scheduler.timesteps

    def velocity(self, transformer, latents, t, cond, uncond, guidance_scale):
        batch = latents.shape[0]
        config = getattr(transformer, "config", None) or self.pipeline.transformer.config
        guidance = (
            torch.full((batch,), guidance_scale, device=latents.device, dtype=torch.float32)
            if config.guidance_embeds
            else None
        )
        return transformer(
            hidden_states=latents,
            timestep=t.expand(batch).to(latents.dtype) / 1000,
            guidance=guidance,
            pooled_projections=cond["pooled_prompt_embeds"],
            encoder_hidden_states=cond["prompt_embeds"],
            txt_ids=self._text_ids,
            img_ids=self._image_ids,
            return_dict=False,
        )[0]

    def decode(self, latents, height, width):
        pipe = self.pipeline
        latents = pipe._unpack_latents(latents, height, width, pipe.vae_scale_factor)
        image = decode_vae_latents(pipe.vae, latents)
        return (image.float() / 2 + 0.5).clamp(0, 1)


def get_adapter(pipeline) -> FlowPipelineAdapter:
    """The adapter of `pipeline`, or a `ValueError` naming what is wrong with it."""
    from diffusers import FluxPipeline, StableDiffusion3Pipeline

    scheduler = getattr(pipeline, "scheduler", None)
    if not isinstance(scheduler, FlowMatchEulerDiscreteScheduler):
        raise ValueError(
            f"`pipeline` must be a flow-matching pipeline (a FlowMatchEulerDiscreteScheduler-compatible scheduler); "
            f"{type(pipeline).__name__} has a {type(scheduler).__name__}. GRPO here needs the SDE of a rectified flow."
        )
    if isinstance(pipeline, StableDiffusion3Pipeline):
        return SD3Adapter(pipeline)
    if isinstance(pipeline, FluxPipeline):
        return FluxAdapter(pipeline)
    raise ValueError(
        f"`pipeline` must be a StableDiffusion3Pipeline or a FluxPipeline, got {type(pipeline).__name__}."
    )
