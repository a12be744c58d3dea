"""Divide-and-Denoise: several pretrained diffusion models share one sample through a per-step fair division."""

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import PIL.Image
import torch
from diffusers import AutoencoderKL, DiffusionPipeline, UNet2DConditionModel
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.image_processor import VaeImageProcessor
from diffusers.schedulers.scheduling_utils import SchedulerMixin
from diffusers.utils import BaseOutput, logging
from diffusers.utils.torch_utils import randn_tensor
from transformers import CLIPTextModel, CLIPTokenizer

from ...utils import public
from ..pipeline_utils import check_callback_tensor_inputs
from .denoisers import MultiDenoiserModel, WindowedDenoiser
from .fair_division import FairDivisionAllocator
from .utilities import UTILITIES, ConceptAttentionStore, guidance_delta, record_cross_attention, x0_saliency


logger = logging.get_logger(__name__)

OUTPUT_TYPES = ("pil", "np", "pt", "latent")
COMPOSITIONS = ("divide_and_denoise", "average", "multidiffusion")
# Noise-schedule entries that must agree for models to share one sampler.
_SCHEDULE_KEYS = ("num_train_timesteps", "beta_start", "beta_end", "beta_schedule", "trained_betas", "prediction_type")


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
    """

    images: list[PIL.Image.Image] | np.ndarray | torch.Tensor
    allocations: torch.Tensor


def _conditioning(model: torch.nn.Module) -> str:
    """`"text"` (cross-attention), `"class"` (class embedding) or `"none"`."""
    if isinstance(model, UNet2DConditionModel):
        return "text"
    if isinstance(model, WindowedDenoiser):
        return "class" if model.num_class_embeds is not None else "none"
    return "class" if getattr(getattr(model, "config", None), "num_class_embeds", None) is not None else "none"


def _native_size(model: torch.nn.Module) -> tuple[int, int] | None:
    config = getattr(model, "config", None)
    size = getattr(config, "canvas_size", None) or getattr(config, "sample_size", None)
    if size is None:
        return None
    return (size, size) if isinstance(size, int) else tuple(size)


def _in_channels(model: torch.nn.Module) -> int:
    return (model.denoiser if isinstance(model, WindowedDenoiser) else model).config.in_channels


def _latent_constraint(model: torch.nn.Module) -> tuple[int, bool]:
    """`(multiple, fixed)`: latent sides must be multiples of `multiple`; `fixed` models only take their own size."""
    if isinstance(model, WindowedDenoiser) or not hasattr(getattr(model, "config", None), "block_out_channels"):
        return 1, True
    return 2 ** (len(model.config.block_out_channels) - 1), False


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_compatible_schedulers(schedulers: list[SchedulerMixin]) -> None:
    """Raise a `ValueError` unless every scheduler has the same noise schedule and prediction type."""
    reference = schedulers[0].config
    for i, scheduler in enumerate(schedulers[1:], start=1):
        differing = {
            key: (reference.get(key), scheduler.config.get(key))
            for key in _SCHEDULE_KEYS
            if reference.get(key) != scheduler.config.get(key)
        }
        if differing:
            raise ValueError(
                f"the scheduler of model {i} has a different noise schedule than model 0's as (model 0, model {i}): "
                f"{differing}; Divide-and-Denoise needs models trained with one schedule and prediction type."
            )


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

    The same pipeline runs the baselines, for like-with-like comparisons: `composition="average"` (composable
    diffusion: equal weights everywhere) and `composition="multidiffusion"` (fixed regions).

    This model inherits from [`DiffusionPipeline`]. Check the superclass documentation for the generic methods.

    Parameters:
        denoisers ([`MultiDenoiserModel`]): the models; all share one sample space (channels and size). With one
            denoiser every agent uses it; otherwise agent `k` uses `denoisers[k]`.
        scheduler ([`SchedulerMixin`]): a diffusers scheduler with `alphas_cumprod` (DDPM, DDIM, PNDM, Euler, DPM-Solver,
            ...), shared by all models.
        vae ([`AutoencoderKL`], *optional*): the shared autoencoder of latent models (SD family); pixel models have none.
        text_encoder ([`CLIPTextModel`], *optional*): the text encoder of text-conditioned denoisers.
        tokenizer ([`CLIPTokenizer`], *optional*): its tokenizer.
        null_class_label (`int`, *optional*): the null class of class-conditional denoisers, for guidance.
    """

    model_cpu_offload_seq = "text_encoder->denoisers->vae"
    _optional_components = ["vae", "text_encoder", "tokenizer"]
    _callback_tensor_inputs = ["latents", "noise_pred", "allocation"]

    def __init__(
        self,
        denoisers: MultiDenoiserModel,
        scheduler: SchedulerMixin,
        vae: AutoencoderKL | None = None,
        text_encoder: CLIPTextModel | None = None,
        tokenizer: CLIPTokenizer | None = None,
        null_class_label: int | None = None,
    ):
        super().__init__()
        if not isinstance(denoisers, MultiDenoiserModel):
            raise TypeError(f"`denoisers` must be a MultiDenoiserModel, got {type(denoisers).__name__}.")
        kinds = {_conditioning(m) for m in denoisers}
        if len(kinds) > 1:
            raise ValueError(f"`denoisers` mix conditioning kinds {sorted(kinds)}; use models of one kind.")
        if "text" in kinds and (text_encoder is None or tokenizer is None):
            raise ValueError("text-conditioned `denoisers` need a `text_encoder` and a `tokenizer`.")
        channels = {_in_channels(m) for m in denoisers}
        if len(channels) > 1:
            raise ValueError(
                f"`denoisers` have different latent channels {sorted(channels)}; they must share a space."
            )
        sizes = {_native_size(m) for m in denoisers}
        if len(sizes) > 1:
            raise ValueError(f"`denoisers` have different sample sizes {sorted(sizes)}; they must share a space.")
        if vae is not None and vae.config.latent_channels not in channels:
            raise ValueError(
                f"the `vae` has {vae.config.latent_channels} latent channels but the denoisers take {channels.pop()}."
            )
        if not hasattr(scheduler, "alphas_cumprod"):
            raise ValueError(
                f"`scheduler` {type(scheduler).__name__} has no `alphas_cumprod`; Divide-and-Denoise needs a "
                "DDPM-family scheduler (DDPM, DDIM, PNDM, Euler, DPM-Solver, ...)."
            )
        self.register_modules(
            denoisers=denoisers, scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer
        )
        self.register_to_config(null_class_label=null_class_label)
        self.vae_scale_factor = 2 ** (len(vae.config.block_out_channels) - 1) if vae is not None else 1
        self.image_processor = VaeImageProcessor(vae_scale_factor=self.vae_scale_factor)
        self.last_call_timings: dict[str, float] = {}

    @classmethod
    def from_pipelines(
        cls, pipelines: list[DiffusionPipeline], scheduler: SchedulerMixin | None = None
    ) -> "DivideAndDenoisePipeline":
        """Build from loaded pipelines that share a latent space, e.g. several `StableDiffusionPipeline`s (their
        UNets; the first one's VAE, text encoder and tokenizer) or several `ClassConditionalDDPMPipeline`s.

        Raises a `ValueError` when their latent shapes, autoencoders or noise schedules differ.

        Args:
            pipelines (`list[DiffusionPipeline]`): pipelines with a `unet` (and, for latent models, a `vae`).
            scheduler (`SchedulerMixin`, *optional*): the sampler; a copy of the first pipeline's by default.
        """
        if not isinstance(pipelines, (list, tuple)) or not pipelines:
            raise ValueError(f"`pipelines` must be a non-empty list of pipelines, got {pipelines!r}.")
        for i, pipe in enumerate(pipelines):
            if not hasattr(pipe, "unet") or not hasattr(pipe, "scheduler"):
                raise ValueError(f"`pipelines[{i}]` ({type(pipe).__name__}) has no `unet` and `scheduler`.")
        check_compatible_schedulers([pipe.scheduler for pipe in pipelines])
        first = pipelines[0]
        for i, pipe in enumerate(pipelines[1:], start=1):
            shapes = [(_in_channels(p.unet), _native_size(p.unet)) for p in (first, pipe)]
            if shapes[0] != shapes[1]:
                raise ValueError(
                    f"`pipelines[{i}]` has latents (channels, size) {shapes[1]}; `pipelines[0]` has {shapes[0]}."
                )
            vaes = [getattr(p, "vae", None) for p in (first, pipe)]
            if (vaes[0] is None) != (vaes[1] is None) or (
                vaes[0] is not None and dict(vaes[0].config) != dict(vaes[1].config)
            ):
                raise ValueError(f"`pipelines[{i}]` has a different autoencoder than `pipelines[0]`; latents differ.")
            encoders = [getattr(p, "text_encoder", None) for p in (first, pipe)]
            if encoders[0] is not None and encoders[1] is not None and encoders[0] is not encoders[1]:
                a, b = encoders[0].state_dict(), encoders[1].state_dict()
                if a.keys() != b.keys() or any(not torch.equal(a[k], b[k]) for k in a):
                    logger.warning(
                        f"`pipelines[{i}]` has its own text encoder; every model is conditioned through the text "
                        "encoder of `pipelines[0]`."
                    )
        # one denoiser per distinct UNet (the same UNet under several pipelines is kept once)
        unets = list({id(p.unet): p.unet for p in pipelines}.values())
        if scheduler is None:
            scheduler = type(first.scheduler).from_config(first.scheduler.config)
        return cls(
            denoisers=MultiDenoiserModel(unets),
            scheduler=scheduler,
            vae=getattr(first, "vae", None),
            text_encoder=getattr(first, "text_encoder", None),
            tokenizer=getattr(first, "tokenizer", None),
            null_class_label=getattr(first.config, "null_class_label", None),
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
        return _conditioning(self.denoisers[0])

    @property
    def num_timesteps(self) -> int:
        return self._num_timesteps

    @property
    def interrupt(self) -> bool:
        return self._interrupt

    @property
    def sample_size(self) -> tuple[int, int]:
        """The denoisers' native latent size `(height, width)`."""
        return _native_size(self.denoisers[0])

    # inputs ---------------------------------------------------------------------------------------------------------

    def _num_agents(self, prompt, class_labels) -> int:
        if len(self.denoisers) > 1:
            return len(self.denoisers)
        if self.conditioning == "text" and isinstance(prompt, (list, tuple)):
            return len(prompt)
        if self.conditioning == "class" and isinstance(class_labels, (list, tuple, torch.Tensor)):
            return len(class_labels)
        return 1

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
        composition,
        regions,
        allocator,
        utility,
        utility_momentum,
        token_indices,
        alignment_scale,
        max_iter_to_align,
    ) -> dict:
        """Validate every argument before any model work; return the normalised per-agent settings."""
        if (
            not isinstance(num_inference_steps, int)
            or isinstance(num_inference_steps, bool)
            or num_inference_steps < 1
        ):
            raise ValueError(f"`num_inference_steps` must be a positive int, got {num_inference_steps!r}.")
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"`output_type` must be one of {OUTPUT_TYPES}, got {output_type!r}.")
        if (
            not isinstance(num_images_per_prompt, int)
            or isinstance(num_images_per_prompt, bool)
            or num_images_per_prompt < 1
        ):
            raise ValueError(f"`num_images_per_prompt` must be a positive int, got {num_images_per_prompt!r}.")
        check_callback_tensor_inputs(self, callback_on_step_end_tensor_inputs)
        if composition not in COMPOSITIONS:
            raise ValueError(f"`composition` must be one of {COMPOSITIONS}, got {composition!r}.")
        if allocator is not None and not isinstance(allocator, FairDivisionAllocator):
            raise TypeError(f"`allocator` must be a FairDivisionAllocator, got {type(allocator).__name__}.")
        if not _is_number(utility_momentum) or not 0 <= utility_momentum < 1:
            raise ValueError(f"`utility_momentum` must be a number in [0, 1), got {utility_momentum!r}.")
        if not _is_number(alignment_scale) or alignment_scale < 0:
            raise ValueError(f"`alignment_scale` must be a number >= 0, got {alignment_scale!r}.")
        if not isinstance(max_iter_to_align, int) or isinstance(max_iter_to_align, bool) or max_iter_to_align < 0:
            raise ValueError(f"`max_iter_to_align` must be an int >= 0, got {max_iter_to_align!r}.")

        kind = self.conditioning
        num_agents = self._num_agents(prompt, class_labels)
        prompts, labels = None, None
        if kind == "text":
            if class_labels is not None:
                raise ValueError("`class_labels` were given, but the denoisers are text-conditioned; pass `prompt`.")
            if isinstance(prompt, str):
                prompt = [prompt]
            if not isinstance(prompt, (list, tuple)) or not prompt or not all(isinstance(p, str) for p in prompt):
                raise ValueError(f"`prompt` must be a string or a list of strings (one per model), got {prompt!r}.")
            if len(prompt) != num_agents:
                raise ValueError(f"`prompt` has {len(prompt)} entries for {num_agents} models; pass one per model.")
            if negative_prompt is not None and not isinstance(negative_prompt, str):
                raise ValueError(f"`negative_prompt` must be a string or None, got {negative_prompt!r}.")
            prompts = list(prompt)
        else:
            if prompt is not None or negative_prompt is not None:
                raise ValueError(f"`prompt` was given, but the denoisers are not text-conditioned ({kind}).")
            if kind == "class":
                if isinstance(class_labels, int) and not isinstance(class_labels, bool):
                    class_labels = [class_labels]
                if class_labels is None:
                    raise ValueError("`class_labels` are required: the denoisers are class-conditional.")
                labels = torch.as_tensor(class_labels)
                if labels.ndim != 1 or labels.dtype.is_floating_point or labels.dtype == torch.bool:
                    raise ValueError(f"`class_labels` must be a list of ints (one per model), got {class_labels!r}.")
                if labels.numel() != num_agents:
                    raise ValueError(
                        f"`class_labels` has {labels.numel()} entries for {num_agents} models; pass one per model."
                    )
                num_classes = min(m.denoiser.config.num_class_embeds if isinstance(m, WindowedDenoiser)
                                  else m.config.num_class_embeds for m in self.denoisers)  # fmt: skip
                if ((labels < 0) | (labels >= num_classes)).any():
                    raise ValueError(f"`class_labels` must lie in [0, {num_classes - 1}], got {labels.tolist()}.")
                labels = labels.long()
            elif class_labels is not None:
                raise ValueError("`class_labels` were given, but the denoisers are unconditional.")

        if _is_number(guidance_scale):
            scales = [float(guidance_scale)] * num_agents
        elif isinstance(guidance_scale, (list, tuple)) and all(_is_number(g) for g in guidance_scale):
            scales = [float(g) for g in guidance_scale]
            if len(scales) != num_agents:
                raise ValueError(f"`guidance_scale` has {len(scales)} entries for {num_agents} models.")
        else:
            raise TypeError(f"`guidance_scale` must be a number or a list of numbers, got {guidance_scale!r}.")
        if utility == "auto":
            utility = "cross_attention" if kind == "text" else "x0_saliency"
        if utility not in UTILITIES:
            raise ValueError(f"`utility` must be 'auto' or one of {UTILITIES}, got {utility!r}.")
        if utility == "cross_attention" and kind != "text":
            raise ValueError("`utility` 'cross_attention' needs text-conditioned denoisers with cross-attention.")
        needs_uncond = any(g > 1 for g in scales) or (utility == "guidance_delta" and composition == COMPOSITIONS[0])
        if needs_uncond and kind == "none":
            raise ValueError(
                f"`guidance_scale` {guidance_scale!r} > 1 or `utility` 'guidance_delta' need conditional models; "
                "these denoisers are unconditional."
            )
        if needs_uncond and kind == "class" and self.config.null_class_label is None:
            raise ValueError(
                f"`guidance_scale` {guidance_scale!r} > 1 or `utility` 'guidance_delta' need a null class, but "
                "`null_class_label` is None."
            )
        if token_indices is not None:
            if utility != "cross_attention":
                raise ValueError("`token_indices` only apply to `utility='cross_attention'`.")
            if (
                not isinstance(token_indices, (list, tuple))
                or len(token_indices) != num_agents
                or not all(isinstance(t, (list, tuple)) and t and all(isinstance(i, int) for i in t)
                           for t in token_indices)
            ):  # fmt: skip
                raise ValueError(
                    f"`token_indices` must be one non-empty list of ints per model, got {token_indices!r}."
                )

        latent_height, latent_width = self.sample_size
        for name, value in (("height", height), ("width", width)):
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 1 or value % self.vae_scale_factor
            ):
                raise ValueError(f"`{name}` must be a positive multiple of {self.vae_scale_factor}, got {value!r}.")
        if height is not None:
            latent_height = height // self.vae_scale_factor
        if width is not None:
            latent_width = width // self.vae_scale_factor
        multiple, fixed = _latent_constraint(self.denoisers[0])
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
        shape = (num_images_per_prompt, _in_channels(self.denoisers[0]), latent_height, latent_width)
        if isinstance(generator, list) and len(generator) != num_images_per_prompt:
            raise ValueError(
                f"`generator` is a list of {len(generator)} generators, but `num_images_per_prompt` is "
                f"{num_images_per_prompt}."
            )
        if latents is not None and tuple(latents.shape) != shape:
            raise ValueError(f"`latents` has shape {tuple(latents.shape)}; expected {shape}.")
        if output_type != "latent" and self.conditioning == "text" and self.vae is None:
            raise ValueError("text-conditioned denoisers need a `vae` to decode; use output_type='latent'.")

        masks = None
        if composition == "multidiffusion":
            if regions is None:
                # equal vertical strips, left to right in agent order
                columns = torch.arange(latent_width) * num_agents // latent_width
                masks = (columns.view(1, 1, -1) == torch.arange(num_agents).view(-1, 1, 1)).float()
                masks = masks.expand(num_agents, latent_height, latent_width)
            else:
                masks = torch.as_tensor(regions, dtype=torch.float32)
                if masks.shape != (num_agents, latent_height, latent_width):
                    raise ValueError(
                        f"`regions` has shape {tuple(masks.shape)}; expected (num_models, latent height, latent "
                        f"width) = {(num_agents, latent_height, latent_width)}."
                    )
                if (masks < 0).any() or not torch.isfinite(masks).all():
                    raise ValueError("`regions` must be finite and >= 0.")
        elif regions is not None:
            raise ValueError(f"`regions` only apply to composition='multidiffusion', not {composition!r}.")
        return {
            "num_agents": num_agents,
            "prompts": prompts,
            "labels": labels,
            "scales": scales,
            "utility": utility,
            "needs_uncond": needs_uncond,
            "shape": shape,
            "regions": masks,
        }

    # model calls ----------------------------------------------------------------------------------------------------

    def _encode_prompts(self, prompts: list[str], negative_prompt: str | None, device) -> tuple:
        """Embeddings `(K, L, D)` of the prompts and `(1, L, D)` of the negative prompt, plus each prompt's token
        count (without start and end tokens)."""
        texts = prompts + [negative_prompt or ""]
        tokens = self.tokenizer(
            texts, padding="max_length", max_length=self.tokenizer.model_max_length, truncation=True,
            return_tensors="pt",
        )  # fmt: skip
        embeds = self.text_encoder(tokens.input_ids.to(device))[0]
        lengths = tokens.attention_mask.sum(dim=1)[:-1] - 2
        return embeds[:-1], embeds[-1:], lengths.tolist()

    def _predict(self, sample: torch.Tensor, t, settings: dict, cond: dict, record_attention: bool):
        """Every agent's guided prediction `(B, K, C, H, W)`, its conditional and unconditional predictions and, with
        `record_attention`, its conditional cross-attention maps `(B, K, H, W, tokens)`."""
        batch, num_agents = sample.shape[0], settings["num_agents"]
        branches = 2 if settings["needs_uncond"] else 1
        groups = [list(range(num_agents))] if len(self.denoisers) == 1 else [[k] for k in range(num_agents)]
        cond_out, uncond_out, attention = [None] * num_agents, [None] * num_agents, [None] * num_agents
        for agents in groups:
            index = 0 if len(self.denoisers) == 1 else agents[0]
            model = self.denoisers[index]
            n = len(agents)
            model_input = sample.repeat(branches * n, 1, 1, 1)
            kwargs = {}
            if self.conditioning == "text":
                embeds = cond["prompt_embeds"][agents].repeat_interleave(batch, dim=0)
                if branches == 2:
                    embeds = torch.cat([cond["negative_embeds"].expand(n * batch, -1, -1), embeds])
                kwargs["encoder_hidden_states"] = embeds
            elif self.conditioning == "class":
                labels = cond["labels"][agents].repeat_interleave(batch)
                if branches == 2:
                    labels = torch.cat([torch.full_like(labels, self.config.null_class_label), labels])
                kwargs["class_labels"] = labels
            timestep = t.expand(model_input.shape[0]) if isinstance(t, torch.Tensor) and t.ndim == 0 else t
            store = None
            if record_attention:
                store = ConceptAttentionStore(sample.shape[-2:])
                with record_cross_attention(model, store):
                    out = self.denoisers(index, model_input, timestep, **kwargs).sample
            else:
                out = self.denoisers(index, model_input, timestep, **kwargs).sample
            out = out.view(branches, n, batch, *out.shape[1:])
            maps = store.maps.view(branches, n, batch, *store.maps.shape[1:]) if store is not None else None
            for j, k in enumerate(agents):
                cond_out[k] = out[-1, j]
                uncond_out[k] = out[0, j] if branches == 2 else None
                attention[k] = maps[-1, j] if maps is not None else None
        cond_out = torch.stack(cond_out, dim=1)
        uncond_out = torch.stack(uncond_out, dim=1) if branches == 2 else None
        guided = cond_out
        if uncond_out is not None:
            scales = torch.tensor(settings["scales"], dtype=cond_out.dtype, device=cond_out.device)
            guided = uncond_out + scales.view(1, -1, 1, 1, 1) * (cond_out - uncond_out)
        attention = torch.stack(attention, dim=1) if record_attention else None
        return guided, cond_out, uncond_out, attention

    def _alpha_bar(self, t, like: torch.Tensor) -> torch.Tensor:
        index = int(torch.as_tensor(t).float().round().clamp(0, len(self.scheduler.alphas_cumprod) - 1))
        return self.scheduler.alphas_cumprod[index].to(device=like.device, dtype=like.dtype)

    def _predict_x0(self, model_output: torch.Tensor, scaled_sample: torch.Tensor, t) -> torch.Tensor:
        """The clean-sample prediction from a model output `(B, K, C, H, W)` and the scaled model input."""
        alpha_bar = self._alpha_bar(t, model_output)
        x_t = scaled_sample.unsqueeze(1)
        prediction_type = self.scheduler.config.get("prediction_type", "epsilon")
        if prediction_type == "epsilon":
            return (x_t - (1 - alpha_bar).sqrt() * model_output) / alpha_bar.sqrt()
        if prediction_type == "v_prediction":
            return alpha_bar.sqrt() * x_t - (1 - alpha_bar).sqrt() * model_output
        if prediction_type == "sample":
            return model_output
        raise ValueError(f"the scheduler's `prediction_type` {prediction_type!r} is not supported.")

    def _utilities(self, settings, x0, cond_out, uncond_out, attention, cond) -> torch.Tensor:
        """Per-agent utility maps `(B, K, H, W)`, each normalised to a maximum of 1 per image."""
        if settings["utility"] == "x0_saliency":
            maps = torch.stack([x0_saliency(x0[:, k]) for k in range(x0.shape[1])], dim=1)
        elif settings["utility"] == "guidance_delta":
            maps = torch.stack([guidance_delta(cond_out[:, k], uncond_out[:, k]) for k in range(x0.shape[1])], dim=1)
        else:
            per_agent = []
            for k, indices in enumerate(cond["token_indices"]):
                per_agent.append(attention[:, k, :, :, indices].mean(dim=-1))
            maps = torch.stack(per_agent, dim=1)
        maps = maps.float()
        return maps / maps.flatten(2).amax(dim=2).clamp_min(1e-12)[..., None, None]

    def _align(self, latents, scaled, x0, allocation, t, scale: float) -> torch.Tensor:
        """One closed-form alignment step on the latents.

        Energy `L = sum_k (1 - <X_k, s_k> / sum s_k)^2` with `s_k = |x0_k - b_k|^2` the squared saliency of agent `k`
        (layout-guidance form). Its gradient goes through `x0_k = (x_t - sqrt(1 - a) eps_k) / sqrt(a)` with the
        network output held fixed (no backpropagation through the models), which is what keeps alignment cheap.
        """
        background = x0.flatten(3).median(dim=3).values[..., None, None]  # (B, K, C, 1, 1)
        deviation = x0 - background
        saliency = deviation.pow(2).sum(dim=2)  # (B, K, H, W)
        total = saliency.flatten(2).sum(dim=2).clamp_min(1e-12)[..., None, None]
        inside = (allocation * saliency).flatten(2).sum(dim=2)[..., None, None] / total
        # dL/ds = -2 (1 - r) (X - r) / sum s ; ds/dx0 = 2 (x0 - b) ; dx0/dx_t = 1 / sqrt(a) (output held fixed)
        grad_s = -2 * (1 - inside) * (allocation - inside) / total
        grad_x0 = (grad_s.unsqueeze(2) * 2 * deviation).sum(dim=1)
        alpha_bar = self._alpha_bar(t, latents)
        grad = grad_x0 / alpha_bar.sqrt()
        # step size: `scale` times the sample's own per-position scale, in units of the normalised gradient
        norm = grad.flatten(1).abs().amax(dim=1).clamp_min(1e-12).view(-1, 1, 1, 1)
        step = scale * (1 - alpha_bar).sqrt() * grad / norm
        # the scheduler may scale its model input (Euler: x / sqrt(sigma^2 + 1)); move the latents accordingly
        ratio = (scaled.flatten(1).norm(dim=1) / latents.flatten(1).norm(dim=1).clamp_min(1e-12)).view(-1, 1, 1, 1)
        return latents - step / ratio

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
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.Tensor | None = None,
        output_type: str = "pil",
        return_dict: bool = True,
        callback_on_step_end: Callable | PipelineCallback | MultiPipelineCallbacks | None = None,
        callback_on_step_end_tensor_inputs: list[str] = ["latents"],
        composition: str = "divide_and_denoise",
        regions: torch.Tensor | None = None,
        allocator: FairDivisionAllocator | None = None,
        utility: str = "auto",
        utility_momentum: float = 0.5,
        token_indices: list[list[int]] | None = None,
        alignment_scale: float = 0.1,
        max_iter_to_align: int = 10,
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
                for all, or one per model); `1.0` disables it.
            num_images_per_prompt (`int`, defaults to 1): images to generate, each a composition of all models.
            generator (`torch.Generator` or `list[torch.Generator]`, *optional*): one generator, or one per image.
            latents (`torch.Tensor` of shape `(num_images_per_prompt, channels, height, width)`, *optional*): the
                starting noise (latent resolution).
            output_type (`str`, defaults to `"pil"`): `"pil"`, `"np"`, `"pt"` (images in [0, 1]) or `"latent"`.
            return_dict (`bool`, defaults to `True`): return a [`DivideAndDenoisePipelineOutput`], else a tuple
                `(images, allocations)`.
            callback_on_step_end (`Callable`, *optional*): called as `callback_on_step_end(self, i, t, kwargs)` after
                each step with the tensors named in `callback_on_step_end_tensor_inputs`; may return replacements
                for `"latents"`.
            callback_on_step_end_tensor_inputs (`list[str]`, defaults to `["latents"]`): a subset of `"latents"`,
                `"noise_pred"` (the composite prediction) and `"allocation"` (`(batch, K, H, W)`).
            composition (`str`, defaults to `"divide_and_denoise"`): `"divide_and_denoise"`, or a baseline:
                `"average"` (equal weights everywhere, composable diffusion) or `"multidiffusion"` (fixed `regions`).
            regions (`torch.Tensor` of shape `(K, latent_height, latent_width)`, *optional*): the fixed region weights
                of `"multidiffusion"` (normalised over models at each position); equal vertical strips by default.
            allocator ([`FairDivisionAllocator`], *optional*): the fair-division solver; by default proportional
                response (Nash welfare), 20 warm-started iterations per step, spatial smoothing `sigma=1`
                ([`~DivideAndDenoisePipeline.default_allocator`]).
            utility (`str`, defaults to `"auto"`): `"cross_attention"` (text models; attention to the concept tokens),
                `"guidance_delta"` (`|eps(c) - eps(null)|`) or `"x0_saliency"` (`|x0 - background|`); `"auto"` picks
                cross-attention for text models and x0 saliency otherwise.
            utility_momentum (`float`, defaults to 0.5): temporal smoothing `U <- m U_prev + (1 - m) U_new`.
            token_indices (`list[list[int]]`, *optional*): per model, the prompt token positions of its concept
                (1 is the first word token); all of its prompt's tokens by default.
            alignment_scale (`float`, defaults to 0.1): strength of the alignment step, relative to the noise level;
                `0` disables it.
            max_iter_to_align (`int`, defaults to 10): alignment runs on the first `max_iter_to_align` steps.

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
            [`DivideAndDenoisePipelineOutput`] or `tuple`: images and the per-step allocations.
        """
        if isinstance(callback_on_step_end, (PipelineCallback, MultiPipelineCallbacks)):
            callback_on_step_end_tensor_inputs = callback_on_step_end.tensor_inputs
        settings = self.check_inputs(
            prompt, class_labels, negative_prompt, height, width, num_inference_steps, guidance_scale,
            num_images_per_prompt, generator, latents, output_type, callback_on_step_end_tensor_inputs, composition,
            regions, allocator, utility, utility_momentum, token_indices, alignment_scale, max_iter_to_align,
        )  # fmt: skip
        self._interrupt = False
        timings = {"model_forwards": 0.0, "utility": 0.0, "allocation": 0.0, "alignment": 0.0}
        device = self._execution_device
        dtype = self.denoisers.dtype
        num_agents = settings["num_agents"]
        fair = composition == "divide_and_denoise"
        if allocator is None:
            allocator = self.default_allocator()

        cond = {}
        if self.conditioning == "text":
            embeds, negative, lengths = self._encode_prompts(settings["prompts"], negative_prompt, device)
            cond["prompt_embeds"], cond["negative_embeds"] = embeds.to(dtype), negative.to(dtype)
            if token_indices is None:
                if min(lengths) < 1:
                    raise ValueError("every prompt needs at least one token for the cross-attention utility.")
                token_indices = [list(range(1, 1 + n)) for n in lengths]
            cond["token_indices"] = token_indices
        elif self.conditioning == "class":
            cond["labels"] = settings["labels"].to(device)

        shape = settings["shape"]
        if latents is None:
            latents = randn_tensor(shape, generator=generator, device=device, dtype=dtype)
        else:
            latents = latents.to(device=device, dtype=dtype)
        latents = latents * self.scheduler.init_noise_sigma
        self.scheduler.set_timesteps(num_inference_steps, device=device)
        timesteps = self.scheduler.timesteps
        self._num_timesteps = len(timesteps)
        # stochastic schedulers take the generator; others (PNDM, ...) have no such argument
        step_kwargs = (
            {"generator": generator} if "generator" in inspect.signature(self.scheduler.step).parameters else {}
        )

        batch, height_l, width_l = shape[0], shape[2], shape[3]
        if composition == "average":
            fixed = torch.full((batch, num_agents, height_l, width_l), 1.0 / num_agents, device=device)
        elif composition == "multidiffusion":
            masks = settings["regions"].to(device)
            total = masks.sum(dim=0, keepdim=True)
            masks = torch.where(total > 0, masks / total.clamp_min(1e-12), torch.full_like(masks, 1.0 / num_agents))
            fixed = masks.unsqueeze(0).expand(batch, -1, -1, -1)
        record_attention = fair and settings["utility"] == "cross_attention"

        allocations, utility_maps, allocation = [], None, None
        for i, t in enumerate(self.progress_bar(timesteps)):
            if self.interrupt:
                continue
            scaled = self.scheduler.scale_model_input(latents, t)
            start = time.perf_counter()
            guided, cond_out, uncond_out, attention = self._predict(scaled, t, settings, cond, record_attention)
            timings["model_forwards"] += time.perf_counter() - start

            if fair:
                start = time.perf_counter()
                x0 = self._predict_x0(guided, scaled, t)
                new = self._utilities(settings, x0, cond_out, uncond_out, attention, cond)
                utility_maps = (
                    new if utility_maps is None else utility_momentum * utility_maps + (1 - utility_momentum) * new
                )
                timings["utility"] += time.perf_counter() - start
                start = time.perf_counter()
                progress = i / max(1, len(timesteps) - 1)
                allocation = allocator(utility_maps, warm_start=allocation, progress=progress)
                timings["allocation"] += time.perf_counter() - start
                if i < max_iter_to_align and alignment_scale > 0:
                    start = time.perf_counter()
                    latents = self._align(latents, scaled, x0, allocation.to(x0.dtype), t, alignment_scale)
                    timings["alignment"] += time.perf_counter() - start
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

        self.last_call_timings = timings
        if output_type == "latent":
            images = latents
        elif self.vae is not None:
            decoded = self.vae.decode(latents / self.vae.config.scaling_factor, return_dict=False)[0]
            images = self.image_processor.postprocess(decoded, output_type=output_type)
        else:  # pixel-space models: samples in [-1, 1]
            images = self.image_processor.postprocess(latents, output_type=output_type)

        self.maybe_free_model_hooks()
        stacked = torch.stack(allocations) if allocations else torch.zeros(0, batch, num_agents, height_l, width_l)
        if not return_dict:
            return (images, stacked)
        return DivideAndDenoisePipelineOutput(images=images, allocations=stacked)
