"""Divide-and-Denoise: several pretrained diffusion models share one sample through a per-step fair division."""

import contextlib
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import PIL.Image
import torch
from diffusers import AutoencoderKL, DiffusionPipeline
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.image_processor import VaeImageProcessor
from diffusers.schedulers.scheduling_utils import SchedulerMixin
from diffusers.utils import BaseOutput, logging
from diffusers.utils.torch_utils import randn_tensor
from transformers import CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from ...utils import is_int, public, synchronized_perf_counter
from ..pipeline_utils import (
    check_callback_tensor_inputs,
    check_eta,
    decode_vae_latents,
    prediction_to_x0,
    prepare_extra_step_kwargs,
    prepare_initial_noise,
)
from .agent_predictions import (
    concept_attention_recording,
    family_timestep_options,
    is_flow_matching,
    noise_levels,
    predict_agents,
    prediction_type,
)
from .alignment import alignment_step
from .baseline_allocators import FixedAllocator
from .call_settings import (
    DivideAndDenoiseCallSettings,
    agent_conditions,
    agent_guidance_scales,
    check_attn_res,
    check_scalars,
    check_token_indices,
    needs_unconditional_branch,
    resolve_max_sequence_length,
    resolve_utility,
)
from .denoisers import (
    TEXT_ENCODERS,
    MultiDenoiserModel,
    check_pipelines_share_a_space,
    denoiser_conditioning,
    denoiser_family,
    denoiser_in_channels,
    denoiser_latent_constraint,
    denoiser_num_class_embeds,
    denoiser_sample_size,
    pipeline_denoiser,
    uncompiled,
)
from .fair_division import FairDivisionAllocator
from .region_masks import MaskAllocator
from .text_encoding import (
    FAMILY_NAMES,
    FAMILY_PIPELINES,
    FAMILY_TEXT_COMPONENTS,
    agent_text_condition,
    check_pooled_embeds,
    check_prompt_embeds,
    check_text_components,
    encode_prompt,
    family_num_tokens,
    family_text_pipeline,
)
from .utilities import agent_utility_maps
from .variant_loading import load_variant_components


logger = logging.get_logger(__name__)

TIMING_KEYS = ("model_forwards", "utility", "allocation", "alignment")


@public
@dataclass
class DivideAndDenoisePipelineOutput(BaseOutput):
    r"""
    Output of [`DivideAndDenoisePipeline`].

    Args:
        images (`list[PIL.Image.Image]`, `np.ndarray` or `torch.Tensor`): the generated images (or latents).
        allocations (`torch.Tensor` of shape `(num_steps, batch, num_agents, height, width)`): the allocation used at
            each step, on the CPU: `allocations[i, b, k, y, x]` is model `k`'s share of latent position `(y, x)` of
            image `b` at step `i` (it sums to 1 over `k`). Shows who painted what.
        timings (`dict[str, float]`): seconds this call spent in model forwards (`"model_forwards"`), utility maps
            (`"utility"`), the allocator (`"allocation"`) and the alignment step (`"alignment"`); on an accelerator each
            reading follows a device synchronise, so the seconds are the work's, not its kernel launches'.
    """

    images: list[PIL.Image.Image] | np.ndarray | torch.Tensor
    allocations: torch.Tensor
    timings: dict[str, float]


@public
class DivideAndDenoisePipeline(DiffusionPipeline):
    r"""
    Divide-and-Denoise: several pretrained diffusion models denoise one sample together; at every step a fair-division
    solver decides which model is responsible for which region.

    Each of the `K` *agents* is a denoiser with its own prompt or class (several fine-tuned UNets, or one UNet with
    several prompts or classes). Per step: every agent predicts the noise (with its own classifier-free guidance);
    its utility map says how much it wants each position (cross-attention to its concept tokens, the size of its
    guidance direction, or the saliency of its clean-sample prediction), smoothed over time; a
    [`FairDivisionAllocator`] divides the positions (no model dominates, none is neglected); the allocation-weighted
    predictions make one composite prediction and one scheduler step. For the first steps an alignment term moves the
    sample so that each agent's content concentrates in its own region.

    The same pipeline runs the baselines through the same models, sampler and guidance, for like-with-like
    comparisons: pass `allocator=AverageAllocator()` (composable diffusion: equal weights everywhere) or
    `allocator=RegionAllocator(regions)` (MultiDiffusion: fixed regions).

    This model inherits from [`DiffusionPipeline`]. Check the superclass documentation for the generic methods.

    Parameters:
        denoisers ([`MultiDenoiserModel`]): the models, all of one family and one sample space (channels and size):
            SD 1.x / 2.x or SDXL `UNet2DConditionModel`s, `SD3Transformer2DModel`s, `FluxTransformer2DModel`s, or
            pixel `UNet2DModel`s. With one denoiser every agent uses it; otherwise agent `k` uses `denoisers[k]`.
            `None` (as diffusers allows for any component) builds a pipeline that only encodes prompts
            ([`encode_prompt`]).
        scheduler ([`SchedulerMixin`]): a diffusers scheduler with `alphas_cumprod` (DDPM, DDIM, PNDM, Euler, DPM-Solver,
            ...) or a flow-matching one (`FlowMatchEulerDiscreteScheduler`), shared by all models.
        vae ([`AutoencoderKL`], *optional*): the shared autoencoder of latent models; pixel models have none.
        text_encoder ([`CLIPTextModel`] or [`CLIPTextModelWithProjection`], *optional*): the (first) CLIP text
            encoder of text-conditioned denoisers.
        tokenizer ([`CLIPTokenizer`], *optional*): its tokenizer.
        text_encoder_2 (`CLIPTextModelWithProjection` or `T5EncoderModel`, *optional*): SDXL's and SD3's second CLIP
            encoder, Flux's T5 encoder.
        tokenizer_2 (`CLIPTokenizer` or `T5TokenizerFast`, *optional*): its tokenizer.
        text_encoder_3 (`T5EncoderModel`, *optional*): SD3's T5 encoder.
        tokenizer_3 (`T5TokenizerFast`, *optional*): its tokenizer.
        null_class_label (`int`, *optional*): the null class of class-conditional denoisers, for guidance.
        force_zeros_for_empty_prompt (`bool`, defaults to `True`): SDXL's convention: without a negative prompt, the
            unconditional branch reads zero embeddings (`StableDiffusionXLPipeline`'s config of the same name).

    SDXL, SD3 and Flux prompts are encoded with their own pipeline's `encode_prompt`; without their text encoders
    these compositions take embeddings (`prompt_embeds` and `pooled_prompt_embeds`).
    """

    model_cpu_offload_seq = "text_encoder->text_encoder_2->text_encoder_3->denoisers->vae"
    _optional_components = [
        "vae",
        "text_encoder",
        "tokenizer",
        "text_encoder_2",
        "tokenizer_2",
        "text_encoder_3",
        "tokenizer_3",
    ]
    _callback_tensor_inputs = ["latents", "noise_pred", "allocation"]

    def __init__(
        self,
        denoisers: MultiDenoiserModel | None,
        scheduler: SchedulerMixin,
        vae: AutoencoderKL | None = None,
        text_encoder: CLIPTextModel | CLIPTextModelWithProjection | None = None,
        tokenizer: CLIPTokenizer | None = None,
        text_encoder_2: PreTrainedModel | None = None,
        tokenizer_2: PreTrainedTokenizerBase | None = None,
        text_encoder_3: PreTrainedModel | None = None,
        tokenizer_3: PreTrainedTokenizerBase | None = None,
        null_class_label: int | None = None,
        force_zeros_for_empty_prompt: bool = True,
    ):
        super().__init__()
        text = {
            "text_encoder": text_encoder,
            "tokenizer": tokenizer,
            "text_encoder_2": text_encoder_2,
            "tokenizer_2": tokenizer_2,
            "text_encoder_3": text_encoder_3,
            "tokenizer_3": tokenizer_3,
        }
        if denoisers is not None:
            self._check_components(denoisers, scheduler, vae, text)
        self.register_modules(denoisers=denoisers, scheduler=scheduler, vae=vae, **text)
        self.register_to_config(
            null_class_label=null_class_label, force_zeros_for_empty_prompt=force_zeros_for_empty_prompt
        )
        self.vae_scale_factor = 2 ** (len(vae.config.block_out_channels) - 1) if vae is not None else 1
        self.image_processor = VaeImageProcessor(vae_scale_factor=self.vae_scale_factor)

    @staticmethod
    def _check_components(denoisers, scheduler, vae, text: dict) -> None:
        """Raise unless the components fit together (one conditioning kind and family, one sample space, a usable
        schedule; SD 1.x / 2.x UNets need their text encoder, the other families may take embeddings only)."""
        if not isinstance(denoisers, MultiDenoiserModel):
            raise TypeError(f"`denoisers` must be a MultiDenoiserModel or None, got {type(denoisers).__name__}.")
        kinds = {denoiser_conditioning(m) for m in denoisers}
        if len(kinds) > 1:
            raise ValueError(f"`denoisers` mix conditioning kinds {sorted(kinds)}; use models of one kind.")
        families = {denoiser_family(m) for m in denoisers}
        if len(families) > 1:
            names = sorted(FAMILY_NAMES[f] for f in families)
            raise ValueError(
                f"`denoisers` mix model families {names}; Divide-and-Denoise composes models of one family."
            )
        if families == {"sd"} and (text["text_encoder"] is None or text["tokenizer"] is None):
            raise ValueError("text-conditioned `denoisers` need a `text_encoder` and a `tokenizer`.")
        channels = {denoiser_in_channels(m) for m in denoisers}
        if len(channels) > 1:
            raise ValueError(
                f"`denoisers` have different latent channels {sorted(channels)}; they must share a space."
            )
        sizes = {denoiser_sample_size(m) for m in denoisers}
        if len(sizes) > 1:
            raise ValueError(f"`denoisers` have different sample sizes {sorted(sizes)}; they must share a space.")
        if vae is not None and vae.config.latent_channels not in channels:
            raise ValueError(
                f"the `vae` has {vae.config.latent_channels} latent channels but the denoisers take {channels.pop()}."
            )
        if not hasattr(scheduler, "alphas_cumprod") and not is_flow_matching(scheduler):
            raise ValueError(
                f"`scheduler` {type(scheduler).__name__} has neither `alphas_cumprod` nor flow-matching `sigmas`; "
                "Divide-and-Denoise needs a DDPM-family scheduler (DDPM, DDIM, PNDM, Euler, DPM-Solver, ...) or a "
                "flow-matching one (FlowMatchEulerDiscreteScheduler)."
            )

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs) -> "DivideAndDenoisePipeline":
        """diffusers' `from_pretrained`; with `variant`, the components holding that variant are loaded here first
        (diffusers' variant scan cannot read the nested `denoisers/` folder), and a variant the folder lacks is a
        `ValueError` naming the variants it has. A Hub id is first resolved to its snapshot folder in the cache
        (`cache_dir`, `revision`, `local_files_only`, `token` apply; offline, the cached snapshot is used)."""
        variant, folder = kwargs.get("variant"), pretrained_model_name_or_path
        if variant is not None and not os.path.isdir(folder):
            from huggingface_hub import snapshot_download

            hub_keys = ("cache_dir", "revision", "local_files_only", "token", "proxies", "force_download")
            folder = snapshot_download(str(folder), **{k: kwargs.pop(k) for k in hub_keys if k in kwargs})
        if variant is not None and os.path.isdir(folder):
            load_kwargs = {k: kwargs[k] for k in ("torch_dtype", "dtype") if k in kwargs}
            kwargs.update(load_variant_components(str(folder), variant, set(kwargs), **load_kwargs))
            kwargs.pop("variant")
        return super().from_pretrained(folder, **kwargs)

    @classmethod
    def from_pipelines(
        cls, pipelines: list[DiffusionPipeline], scheduler: SchedulerMixin | None = None
    ) -> "DivideAndDenoisePipeline":
        """Build from loaded pipelines of one family that share a latent space: several `StableDiffusionPipeline`s,
        `StableDiffusionXLPipeline`s, `StableDiffusion3Pipeline`s or `FluxPipeline`s (fine-tunes or LoRA variants of
        one base: their UNets or transformers; the first one's VAE, text encoders and tokenizers), or several
        `ClassConditionalDDPMPipeline`s.

        Raises a `ValueError` when their families, latent shapes, autoencoders or noise schedules differ.

        Args:
            pipelines (`list[DiffusionPipeline]`): pipelines with a `unet` or a `transformer` (and, for latent models,
                a `vae`).
            scheduler (`SchedulerMixin`, *optional*): the sampler; a copy of the first pipeline's by default.
        """
        if not isinstance(pipelines, (list, tuple)) or not pipelines:
            raise ValueError(f"`pipelines` must be a non-empty list of pipelines, got {pipelines!r}.")
        for i, pipe in enumerate(pipelines):
            if pipeline_denoiser(pipe) is None or not hasattr(pipe, "scheduler"):
                raise ValueError(
                    f"`pipelines[{i}]` ({type(pipe).__name__}) has no `unet` or `transformer`, or no `scheduler`."
                )
        check_pipelines_share_a_space(pipelines)
        first = pipelines[0]
        # one denoiser per distinct model (the same model under several pipelines is kept once)
        models = list({id(pipeline_denoiser(p)): pipeline_denoiser(p) for p in pipelines}.values())
        if scheduler is None:
            scheduler = type(first.scheduler).from_config(first.scheduler.config)
        text_names = [
            name for pair in zip(TEXT_ENCODERS, ("tokenizer", "tokenizer_2", "tokenizer_3")) for name in pair
        ]
        return cls(
            denoisers=MultiDenoiserModel(models),
            scheduler=scheduler,
            vae=getattr(first, "vae", None),
            **{name: getattr(first, name, None) for name in text_names},
            null_class_label=getattr(first.config, "null_class_label", None),
            force_zeros_for_empty_prompt=first.config.get("force_zeros_for_empty_prompt", True),
        )

    @staticmethod
    def default_allocator() -> FairDivisionAllocator:
        """Proportional response (Nash welfare), 20 iterations per step (warm-started from the previous step, so the
        dynamics keep converging across steps), stopping early at `tol=1e-4`, spatial smoothing `sigma=1`."""
        return FairDivisionAllocator("proportional_response", num_iterations=20, tol=1e-4, spatial_sigma=1.0)

    # properties -----------------------------------------------------------------------------------------------------

    @property
    def conditioning(self) -> str:
        """How the denoisers are conditioned: `"text"`, `"class"` or `"none"`."""
        return denoiser_conditioning(self.denoisers[0])

    @property
    def family(self) -> str | None:
        """The denoisers' text-to-image family, `"sd"`, `"sdxl"`, `"sd3"` or `"flux"` (`None` for pixel or
        class-conditional models; see [`~pipelines.divide_and_denoise.denoisers.denoiser_family`])."""
        return None if self.denoisers is None else denoiser_family(self.denoisers[0])

    def _text_components(self) -> dict:
        return {name: getattr(self, name, None) for name in FAMILY_TEXT_COMPONENTS["sd3"]}

    def text_pipeline(self) -> DiffusionPipeline:
        """The family's own diffusers pipeline (`StableDiffusionXLPipeline`, `StableDiffusion3Pipeline` or
        `FluxPipeline`) on this pipeline's text encoders only, whose `encode_prompt` encodes SDXL, SD3 and Flux
        prompts (its weights are these modules, not copies)."""
        family = self.family
        if family not in FAMILY_PIPELINES:
            raise ValueError(
                f"only SDXL, SD3 and Flux compositions encode through their family's pipeline, not {family!r}."
            )
        check_text_components(family, self._text_components())
        text_pipeline = family_text_pipeline(
            family, self._text_components(), self.scheduler, self.config.force_zeros_for_empty_prompt
        )
        text_pipeline.set_progress_bar_config(disable=True)
        return text_pipeline

    def encode_prompt(
        self,
        prompt,
        device=None,
        num_images_per_prompt: int = 1,
        do_classifier_free_guidance=True,
        negative_prompt=None,
        prompt_embeds=None,
        negative_prompt_embeds=None,
        **kwargs,
    ):
        """diffusers' `encode_prompt` for the models' prompts. SD 1.x / 2.x: `(prompt_embeds,
        negative_prompt_embeds)` (see `text_encoding.encode_prompt`). SDXL, SD3 and Flux: their own pipeline's
        `encode_prompt` and its return value ([`text_pipeline`]; `kwargs` such as `max_sequence_length` go to it;
        Flux's takes no negative prompt). Pass `num_images_per_prompt=1` to reuse them in `__call__` (one per model)."""
        if self.family in FAMILY_PIPELINES:
            arguments = {"prompt": prompt, "device": device or self._execution_device}
            arguments |= {"num_images_per_prompt": num_images_per_prompt, "prompt_embeds": prompt_embeds}
            if self.family == "sd3":  # its `encode_prompt` requires them (None: the prompt itself)
                arguments |= {"prompt_2": kwargs.pop("prompt_2", None), "prompt_3": kwargs.pop("prompt_3", None)}
            if self.family != "flux":
                arguments |= {
                    "do_classifier_free_guidance": do_classifier_free_guidance,
                    "negative_prompt": negative_prompt,
                    "negative_prompt_embeds": negative_prompt_embeds,
                }
            return self.text_pipeline().encode_prompt(**arguments, **kwargs)
        if kwargs:
            raise TypeError(f"`encode_prompt` of SD 1.x / 2.x compositions takes no {sorted(kwargs)}.")
        return encode_prompt(
            self.tokenizer,
            self.text_encoder,
            prompt,
            device or self._execution_device,
            num_images_per_prompt,
            do_classifier_free_guidance,
            negative_prompt,
            prompt_embeds,
            negative_prompt_embeds,
        )

    @property
    def guidance_scale(self) -> float | list[float]:
        """The guidance scale of the running call (a callback may set `pipe._guidance_scale`; read at every step)."""
        return self._guidance_scale

    @property
    def do_classifier_free_guidance(self) -> bool:
        """Whether a guidance scale > 1 runs an unconditional branch (never for Flux: its scale is a model input)."""
        return self.family != "flux" and any(g > 1 for g in self._agent_guidance_scales())

    def _agent_guidance_scales(self) -> list[float]:
        """The running call's guidance scale, one per agent (read at every step)."""
        return agent_guidance_scales(self._guidance_scale, self._num_agents_running)

    @property
    def num_timesteps(self) -> int:
        return self._num_timesteps

    @property
    def interrupt(self) -> bool:
        return self._interrupt

    @property
    def sample_size(self) -> tuple[int, int]:
        """The denoisers' native latent size `(height, width)`."""
        return denoiser_sample_size(self.denoisers[0])

    # inputs ---------------------------------------------------------------------------------------------------------

    def _latent_size(self, height: int | None, width: int | None) -> tuple[int, int]:
        """The latent `(height, width)` of the requested image size (the denoisers' native size by default)."""
        for name, value in (("height", height), ("width", width)):
            if value is not None and (not is_int(value) or value < 1 or value % self.vae_scale_factor):
                raise ValueError(f"`{name}` must be a positive multiple of {self.vae_scale_factor}, got {value!r}.")
        latent_height, latent_width = self.sample_size
        if height is not None:
            latent_height = height // self.vae_scale_factor
        if width is not None:
            latent_width = width // self.vae_scale_factor
        multiple, fixed = denoiser_latent_constraint(self.denoisers[0])
        if fixed and (latent_height, latent_width) != self.sample_size:
            raise ValueError(
                f"`height`/`width` give latents of {latent_height}x{latent_width}, but {type(self.denoisers[0]).__name__} "
                f"only denoises its own size {self.sample_size[0]}x{self.sample_size[1]}."
            )
        if latent_height % multiple or latent_width % multiple:
            raise ValueError(
                f"`height`/`width` give latents of {latent_height}x{latent_width}; the denoisers need multiples of "
                f"{multiple} (in pixels, multiples of {multiple * self.vae_scale_factor})."
            )
        return latent_height, latent_width

    def check_inputs(
        self,
        prompt,
        class_labels,
        negative_prompt,
        height,
        width,
        num_inference_steps,
        guidance_scale,
        num_images_per_prompt,
        generator,
        latents,
        output_type,
        callback_on_step_end_tensor_inputs,
        allocator=None,
        utility="auto",
        utility_momentum=0.5,
        token_indices=None,
        alignment_scale=0.1,
        max_iter_to_align=10,
        *,
        eta=0.0,
        attn_res=None,
        prompt_embeds=None,
        negative_prompt_embeds=None,
        pooled_prompt_embeds=None,
        negative_pooled_prompt_embeds=None,
        max_sequence_length=None,
        masks=None,
    ) -> DivideAndDenoiseCallSettings:
        """Check the arguments of a call (those of `__call__`) and resolve them, once, into the settings the loop
        reads; raise a `ValueError`/`TypeError` naming the first bad argument, what was given and what was expected,
        before any model work."""
        kind, family = self.conditioning, self.family
        check_pooled_embeds(
            family, prompt_embeds, pooled_prompt_embeds, negative_prompt_embeds, negative_pooled_prompt_embeds
        )
        if prompt_embeds is not None:
            check_prompt_embeds(kind, prompt, prompt_embeds, negative_prompt_embeds)
        elif family in FAMILY_PIPELINES and prompt is not None:
            check_text_components(family, self._text_components())
        if family == "flux" and (negative_prompt is not None or negative_prompt_embeds is not None):
            raise ValueError(
                "Flux denoisers take no negative prompt (their guidance is distilled: `guidance_scale` is a model "
                f"input), got negative_prompt={negative_prompt!r} and negative_prompt_embeds of type "
                f"{type(negative_prompt_embeds).__name__}."
            )
        max_sequence_length = resolve_max_sequence_length(max_sequence_length, family)
        if family == "sdxl":
            self._check_sdxl_time_ids(pooled_prompt_embeds)
        check_callback_tensor_inputs(self, callback_on_step_end_tensor_inputs)
        check_eta(eta)
        latent_size = self._latent_size(height, width)
        check_scalars(
            num_inference_steps,
            output_type,
            num_images_per_prompt,
            allocator,
            utility_momentum,
            alignment_scale,
            max_iter_to_align,
        )
        num_classes = min(denoiser_num_class_embeds(m) for m in self.denoisers) if kind == "class" else None
        num_agents, prompts, labels = agent_conditions(
            kind, len(self.denoisers), num_classes, prompt, class_labels, negative_prompt, prompt_embeds
        )
        guidance_scales = agent_guidance_scales(guidance_scale, num_agents)
        if masks is not None:  # region prompting: the user's masks are the allocation
            if allocator is not None:
                raise ValueError(f"Pass either `masks` or `allocator` ({allocator!r}), not both.")
            allocator = MaskAllocator(masks)
            allocator.check_image_size(*(side * self.vae_scale_factor for side in latent_size))
            if utility != "auto" or token_indices is not None or attn_res is not None:
                raise ValueError(
                    "`masks` fix the allocation, so no utility is computed: `utility`, `token_indices` and `attn_res` "
                    f"do not apply (got utility={utility!r}, token_indices={token_indices!r}, attn_res={attn_res!r})."
                )
        utility = resolve_utility(utility, kind)
        allocator = self.default_allocator() if allocator is None else allocator
        fair = not isinstance(allocator, FixedAllocator)
        null_class_label = self.config.null_class_label
        needs_unconditional = needs_unconditional_branch(
            kind, null_class_label, guidance_scale, guidance_scales, utility, fair, family
        )
        num_tokens = None
        if kind == "text" and prompt_embeds is not None:
            num_tokens = prompt_embeds.shape[1]
        elif family is not None:
            num_tokens = family_num_tokens(family, self._text_components(), max_sequence_length)
        check_token_indices(token_indices, utility, num_agents, prompt_embeds is not None, num_tokens)
        latent_shape = (num_images_per_prompt, denoiser_in_channels(self.denoisers[0]), *latent_size)
        attn_res = check_attn_res(attn_res, utility, fair, latent_shape)
        if isinstance(generator, list) and len(generator) != num_images_per_prompt:
            raise ValueError(
                f"`generator` is a list of {len(generator)} generators, but `num_images_per_prompt` is "
                f"{num_images_per_prompt}."
            )
        if latents is not None and tuple(latents.shape) != latent_shape:
            raise ValueError(f"`latents` has shape {tuple(latents.shape)}; expected {latent_shape}.")
        if output_type != "latent" and kind == "text" and self.vae is None:
            raise ValueError("text-conditioned denoisers need a `vae` to decode; use output_type='latent'.")
        if not fair:
            allocator.check(num_agents, *latent_size)
        return DivideAndDenoiseCallSettings(
            num_agents=num_agents,
            prompts=prompts,
            class_labels=labels,
            guidance_scales=guidance_scales,
            utility=utility,
            needs_unconditional=needs_unconditional,
            latent_shape=latent_shape,
            allocator=allocator,
            utility_momentum=utility_momentum,
            alignment_scale=alignment_scale,
            max_iter_to_align=max_iter_to_align,
            attn_res=attn_res,
            max_sequence_length=max_sequence_length,
        )

    def _check_sdxl_time_ids(self, pooled_prompt_embeds) -> None:
        """Raise unless the SDXL UNets' added embedding takes six time ids and the pooled embeddings (from
        `text_encoder_2`, or `pooled_prompt_embeds`): `addition_time_embed_dim * 6 + pooled width` inputs."""
        pooled_dim = None
        if pooled_prompt_embeds is not None:
            pooled_dim = pooled_prompt_embeds.shape[1]
        elif self.text_encoder_2 is not None:
            pooled_dim = self.text_encoder_2.config.projection_dim
        for i, model in enumerate(map(uncompiled, self.denoisers)):
            expected = model.add_embedding.linear_1.in_features
            given = model.config.addition_time_embed_dim * 6 + (pooled_dim or 0)
            if pooled_dim is not None and given != expected:
                raise ValueError(
                    f"`denoisers[{i}]` takes {expected} added-embedding inputs, but 6 time ids of width "
                    f"{model.config.addition_time_embed_dim} and pooled embeddings of width {pooled_dim} make {given}; "
                    "the text encoders (or `pooled_prompt_embeds`) do not belong to this SDXL UNet."
                )

    def _agent_text_condition(self, settings, negative_prompt, embeddings: dict, token_indices, device, dtype):
        """Every agent's text condition for the loop ([`text_encoding.agent_text_condition`]), plus SDXL's size/crop
        time ids `(1, 6)` (the image size, no crop, as `StableDiffusionXLPipeline` by default) and whether a Flux
        transformer takes its guidance scale as an input."""
        family = self.family
        text_pipeline = None
        if family in FAMILY_PIPELINES and embeddings["prompt_embeds"] is None:
            text_pipeline = self.text_pipeline()
        cond = agent_text_condition(
            family,
            self._text_components(),
            text_pipeline,
            settings.prompts,
            negative_prompt,
            embeddings,
            token_indices,
            family != "flux",
            settings.max_sequence_length,
            device,
            dtype,
        )
        if family == "sdxl":
            height, width = (side * self.vae_scale_factor for side in settings.latent_shape[2:])
            cond["time_ids"] = torch.tensor([[height, width, 0, 0, height, width]], device=device, dtype=dtype)
        if family == "flux":
            cond["guidance_embeds"] = bool(uncompiled(self.denoisers[0]).config.guidance_embeds)
        return cond

    def _predict(self, sample: torch.Tensor, t, settings, cond: dict, guidance_scales: list[float], recording=None):
        """Every agent's guided, conditional and unconditional predictions `(B, K, C, H, W)` and, with the
        cross-attention utility's `recording`, its concept attention maps `(B, K, H, W)` (see `agent_predictions`)."""
        classifier_free = self.family != "flux" and any(g > 1 for g in guidance_scales)
        unconditional = settings.needs_unconditional or classifier_free
        return predict_agents(
            self.denoisers,
            self.conditioning,
            sample,
            t,
            cond,
            guidance_scales,
            branches=2 if unconditional else 1,
            null_class_label=self.config.null_class_label,
            recording=recording,
            attn_res=settings.attn_res,
        )

    # call -----------------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def __call__(
        self,
        prompt: str | list[str] | None = None,
        class_labels: int | list[int] | torch.Tensor | None = None,
        negative_prompt: str | None = None,
        height: int | None = None,
        width: int | None = None,
        num_inference_steps: int = 50,
        guidance_scale: float | list[float] = 1.0,
        num_images_per_prompt: int = 1,
        eta: float = 0.0,
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.Tensor | None = None,
        prompt_embeds: torch.Tensor | None = None,
        negative_prompt_embeds: torch.Tensor | None = None,
        pooled_prompt_embeds: torch.Tensor | None = None,
        negative_pooled_prompt_embeds: torch.Tensor | None = None,
        output_type: str = "pil",
        return_dict: bool = True,
        callback_on_step_end: Callable | PipelineCallback | MultiPipelineCallbacks | None = None,
        callback_on_step_end_tensor_inputs: list[str] = ["latents"],
        allocator: FairDivisionAllocator | FixedAllocator | None = None,
        utility: str = "auto",
        utility_momentum: float = 0.5,
        token_indices: list[list[int]] | None = None,
        alignment_scale: float = 0.1,
        max_iter_to_align: int = 10,
        attn_res: tuple[int, int] | None = None,
        max_sequence_length: int | None = None,
        masks: list | None = None,
    ) -> DivideAndDenoisePipelineOutput | tuple:
        r"""
        Generate images that every model contributes to, through a fair division of the sample at every step.

        Args:
            prompt (`str` or `list[str]`, *optional*): for text-conditioned denoisers, one prompt per model (per agent).
            class_labels (`int` or `list[int]`, *optional*): for class-conditional denoisers, one class per model.
            negative_prompt (`str`, *optional*): the unconditional prompt of classifier-free guidance (default `""`).
            height (`int`, *optional*), width (`int`, *optional*): image size in pixels; defaults to the models'
                native size. A wider canvas than the models were trained on is allowed (convolutional models).
            num_inference_steps (`int`, defaults to 50): denoising steps.
            guidance_scale (`float` or `list[float]`, defaults to 1.0): classifier-free guidance per model (one value
                for all, or one per model); `1.0` disables it. Flux's guidance is distilled: the scale is the
                transformer's guidance input (as `FluxPipeline`'s `guidance_scale`, 3.5 there by default) and no
                unconditional branch runs.
            num_images_per_prompt (`int`, defaults to 1): images to generate, each a composition of all models.
            eta (`float`, defaults to 0.0): the noise weight of [`DDIMScheduler`] (0: deterministic DDIM, 1: DDPM's
                variance); schedulers whose `step` takes no `eta` ignore it.
            generator (`torch.Generator` or `list[torch.Generator]`, *optional*): one generator, or one per image.
            latents (`torch.Tensor` of shape `(num_images_per_prompt, channels, height, width)`, *optional*): the
                starting noise (latent resolution).
            prompt_embeds (`torch.Tensor` of shape `(models, L, D)`, *optional*), negative_prompt_embeds (`(1, L, D)`,
                *optional*): text embeddings instead of `prompt` / `negative_prompt` ([`encode_prompt`]); the
                cross-attention utility then needs `token_indices`.
            pooled_prompt_embeds (`torch.Tensor` of shape `(models, P)`, *optional*), negative_pooled_prompt_embeds
                (`(1, P)`, *optional*): the pooled text embeddings SDXL, SD3 and Flux denoisers need with
                `prompt_embeds` (their pipeline's `encode_prompt`, or [`encode_prompt`] here); the negatives default
                to zeros.
            output_type (`str`, defaults to `"pil"`): `"pil"`, `"np"`, `"pt"` (images in [0, 1]) or `"latent"`.
            return_dict (`bool`, defaults to `True`): return a [`DivideAndDenoisePipelineOutput`], else a tuple
                `(images, allocations, timings)`.
            callback_on_step_end (`Callable`, *optional*): called as `callback_on_step_end(self, i, t, kwargs)` after
                each step with the tensors named in `callback_on_step_end_tensor_inputs`; may return replacements
                for `"latents"`.
            callback_on_step_end_tensor_inputs (`list[str]`, defaults to `["latents"]`): a subset of `"latents"`,
                `"noise_pred"` (the composite prediction) and `"allocation"` (`(batch, K, H, W)`).
            allocator ([`FairDivisionAllocator`], [`AverageAllocator`] or [`RegionAllocator`], *optional*): who is
                responsible for which position. By default the fair division: proportional response (Nash welfare),
                20 warm-started iterations per step, spatial smoothing `sigma=1`
                ([`~DivideAndDenoisePipeline.default_allocator`]). The baselines [`AverageAllocator`] (composable
                diffusion) and [`RegionAllocator`] (MultiDiffusion's fixed regions) compute no utilities and skip
                the alignment step.
            utility (`str`, defaults to `"auto"`): `"cross_attention"` (text models; attention to the concept tokens),
                `"guidance_delta"` (`|eps(c) - eps(null)|`) or `"x0_saliency"` (`|x0 - background|`); `"auto"` picks
                cross-attention for text models and x0 saliency otherwise.
            utility_momentum (`float`, defaults to 0.5): temporal smoothing `U <- m U_prev + (1 - m) U_new`.
            token_indices (`list[list[int]]`, *optional*): per model, the prompt token positions of its concept
                (1 is the first word token); all of its prompt's tokens by default.
            alignment_scale (`float`, defaults to 0.1): strength of the alignment step, relative to the noise level;
                `0` disables it.
            max_iter_to_align (`int`, defaults to 10): alignment runs on the first `max_iter_to_align` steps.
            attn_res (`tuple[int, int]`, *optional*): the cross-attention utility reads only the layers at this
                attention grid, as Attend-and-Excite's `attn_res` (`(16, 16)` for Stable Diffusion's 64x64 latents);
                the other layers keep the fused attention kernel, which makes recording nearly free. By default it
                averages every cross-attention layer, resized to the latent grid.
            max_sequence_length (`int`, *optional*): the T5 sequence length of SD3 and Flux prompts (256 and 512 by
                default, as their pipelines; at most 512).
            masks (`list` of `PIL.Image.Image`, `np.ndarray` or `torch.Tensor`, *optional*): region prompting: one
                mask per prompt, of the image's `(height, width)`, values in [0, 1]; prompt `k` paints where its mask
                is ([`MaskAllocator`]; the masks must each cover something and together cover the image). Replaces
                `allocator`; no utility is computed and no alignment step runs.

        Examples:

        ```py
        >>> from diffusers_ext import DivideAndDenoisePipeline, MultiDenoiserModel, WindowedDenoiser, zoo

        >>> ddpm = zoo.load("digits-ddpm")
        >>> # two experts, each painting its digit in its own 8x8 slot of a 8x24 canvas (right and left)
        >>> experts = [
        ...     WindowedDenoiser.from_unet(ddpm.unet, (8, 24), (0, left), scheduler=ddpm.scheduler) for left in (16, 0)
        ... ]
        >>> pipe = DivideAndDenoisePipeline(MultiDenoiserModel(experts), ddpm.scheduler, null_class_label=10)
        >>> out = pipe(class_labels=[3, 7], width=24, num_inference_steps=25)
        >>> out.images[0], out.allocations.shape  # (steps, 1, 2, 8, 24): who painted what
        ```

        Returns:
            [`DivideAndDenoisePipelineOutput`] or `tuple`: images, the per-step allocations and the timings.
        """
        if self.denoisers is None:
            raise ValueError(
                "this pipeline has no `denoisers` (it was built with `denoisers=None`, e.g. to run only "
                "`encode_prompt`); set them to generate."
            )
        if isinstance(callback_on_step_end, (PipelineCallback, MultiPipelineCallbacks)):
            callback_on_step_end_tensor_inputs = callback_on_step_end.tensor_inputs

        # 1. Check inputs and resolve them, once, into the call's settings. Raise error if not correct
        settings = self.check_inputs(
            prompt=prompt,
            class_labels=class_labels,
            negative_prompt=negative_prompt,
            height=height,
            width=width,
            num_inference_steps=num_inference_steps,
            guidance_scale=guidance_scale,
            num_images_per_prompt=num_images_per_prompt,
            generator=generator,
            latents=latents,
            output_type=output_type,
            callback_on_step_end_tensor_inputs=callback_on_step_end_tensor_inputs,
            allocator=allocator,
            utility=utility,
            utility_momentum=utility_momentum,
            token_indices=token_indices,
            alignment_scale=alignment_scale,
            max_iter_to_align=max_iter_to_align,
            eta=eta,
            attn_res=attn_res,
            prompt_embeds=prompt_embeds,
            negative_prompt_embeds=negative_prompt_embeds,
            pooled_prompt_embeds=pooled_prompt_embeds,
            negative_pooled_prompt_embeds=negative_pooled_prompt_embeds,
            max_sequence_length=max_sequence_length,
            masks=masks,
        )
        self._guidance_scale, self._num_agents_running = guidance_scale, settings.num_agents
        guidance = settings.guidance_scales  # resolved once; again only after a callback, which may change it
        self._interrupt = False
        timings = dict.fromkeys(TIMING_KEYS, 0.0)
        num_agents, allocator = settings.num_agents, settings.allocator

        # 2. Define call parameters
        device = self._execution_device
        dtype = self.denoisers.dtype

        # 3. Encode the agents' conditions
        cond = {}
        if self.conditioning == "text":
            embeddings = {
                "prompt_embeds": prompt_embeds,
                "negative_prompt_embeds": negative_prompt_embeds,
                "pooled_prompt_embeds": pooled_prompt_embeds,
                "negative_pooled_prompt_embeds": negative_pooled_prompt_embeds,
            }
            cond = self._agent_text_condition(settings, negative_prompt, embeddings, token_indices, device, dtype)
        elif self.conditioning == "class":
            cond["labels"] = settings.class_labels.to(device)

        # 4. Prepare latent variables
        shape = settings.latent_shape
        if latents is None:
            latents = randn_tensor(shape, generator=generator, device=device, dtype=dtype)
        else:
            latents = latents.to(device=device, dtype=dtype)

        # 5. Prepare timesteps, then scale the noise (`init_noise_sigma` of Euler, Heun, ... depends on them)
        denoiser = uncompiled(self.denoisers[0])
        patch_size = getattr(denoiser.config, "patch_size", 1) if self.family == "sd3" else 2
        timestep_options = family_timestep_options(
            self.family, self.scheduler, num_inference_steps, shape[2:], patch_size
        )
        latents, timesteps = prepare_initial_noise(
            self.scheduler, num_inference_steps, latents, device, **timestep_options
        )
        self._num_timesteps = len(timesteps)

        # 6. Prepare extra step kwargs: `generator` and `eta` only for the schedulers whose `step` takes them
        step_kwargs = prepare_extra_step_kwargs(self.scheduler, generator, eta)
        batch, height_l, width_l = shape[0], shape[2], shape[3]
        if not settings.fair:
            fixed = allocator.allocation(batch, num_agents, height_l, width_l, device)
        # on an accelerator a reading waits for the queued kernels, so each timing counts the work launched in it
        clock = functools.partial(synchronized_perf_counter, device)
        pred_type = prediction_type(self.scheduler)
        scale_input = getattr(self.scheduler, "scale_model_input", lambda sample, t: sample)  # flow matching: none
        momentum = settings.utility_momentum

        # 7. Denoising loop: predict, divide, align, compose, step. The cross-attention utility's recording
        # processors are installed once for the loop (not swapped in and out at every model call).
        records_attention = settings.fair and settings.utility == "cross_attention"
        recording = concept_attention_recording(self.denoisers) if records_attention else None
        allocations, utility_maps, allocation = [], None, None
        with recording if recording is not None else contextlib.nullcontext():
            for i, t in enumerate(self.progress_bar(timesteps)):
                if self.interrupt:
                    continue
                scaled = scale_input(latents, t)
                start = clock()
                guided, cond_out, uncond_out, attention = self._predict(scaled, t, settings, cond, guidance, recording)
                timings["model_forwards"] += clock() - start

                if settings.fair:
                    start = clock()
                    # x0 (B, K, C, H, W) in float32 whatever the models' dtype: at high noise it is several times x_t,
                    # and in float16 its saliency and the alignment's sums over an SD-sized canvas overflow
                    guided32 = guided.float()
                    signal, noise = noise_levels(self.scheduler, t, i, guided32)
                    x0 = prediction_to_x0(guided32, scaled.unsqueeze(1).float(), signal, noise, pred_type)
                    new = agent_utility_maps(settings.utility, x0, cond_out, uncond_out, attention)
                    utility_maps = new if utility_maps is None else momentum * utility_maps + (1 - momentum) * new
                    timings["utility"] += clock() - start
                    start = clock()
                    progress = i / max(1, len(timesteps) - 1)
                    allocation = allocator(utility_maps, warm_start=allocation, progress=progress)
                    timings["allocation"] += clock() - start
                    if i < settings.max_iter_to_align and settings.aligns:
                        start = clock()
                        latents = alignment_step(
                            latents, scaled, x0, allocation.to(x0.dtype), noise, settings.alignment_scale
                        )
                        timings["alignment"] += clock() - start
                else:
                    allocation = fixed
                weights = allocation.to(guided.dtype).unsqueeze(2)
                noise_pred = (weights * guided).sum(dim=1)
                allocations.append(allocation.detach().float().cpu())

                latents = self.scheduler.step(noise_pred, t, latents, **step_kwargs).prev_sample

                if callback_on_step_end is not None:
                    step_tensors = {"latents": latents, "noise_pred": noise_pred, "allocation": allocation}
                    callback_kwargs = {k: step_tensors[k] for k in callback_on_step_end_tensor_inputs}
                    callback_outputs = callback_on_step_end(self, i, t, callback_kwargs) or {}
                    latents = callback_outputs.pop("latents", latents)
                    # diffusers' convention: a callback may set `pipe._guidance_scale` for the remaining steps
                    guidance = agent_guidance_scales(self._guidance_scale, num_agents)

        # 8. Decode and post-process
        if output_type == "latent":
            images = latents
        elif self.vae is not None:
            decoded = decode_vae_latents(self.vae, latents)
            images = self.image_processor.postprocess(decoded, output_type=output_type)
        else:  # pixel-space models: samples in [-1, 1]
            images = self.image_processor.postprocess(latents, output_type=output_type)

        # 9. Offload all models
        self.maybe_free_model_hooks()
        stacked = torch.stack(allocations) if allocations else torch.zeros(0, batch, num_agents, height_l, width_l)
        if not return_dict:
            return (images, stacked, timings)
        return DivideAndDenoisePipelineOutput(images=images, allocations=stacked, timings=timings)
