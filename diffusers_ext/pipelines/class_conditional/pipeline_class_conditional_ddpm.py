"""Class-conditional pixel-space diffusion with classifier-free guidance against a learned null class."""

from collections.abc import Callable

import torch
from diffusers import DDIMScheduler, DDPMScheduler, DiffusionPipeline, ImagePipelineOutput, UNet2DModel
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.image_processor import VaeImageProcessor
from diffusers.schedulers.scheduling_utils import SchedulerMixin
from diffusers.utils import logging
from diffusers.utils.torch_utils import randn_tensor

from ...utils import check_finite, check_positive_int, is_int, public
from ..pipeline_utils import (
    check_callback_tensor_inputs,
    check_eta,
    prepare_extra_step_kwargs,
    prepare_initial_noise,
)


logger = logging.get_logger(__name__)

OUTPUT_TYPES = ("pil", "np", "pt", "latent")


@public
class ClassConditionalDDPMPipeline(DiffusionPipeline):
    r"""
    Pipeline for class-conditional (or unconditional) image generation with a pixel-space [`UNet2DModel`].

    The UNet is conditioned through its class embedding (`num_class_embeds`). When the model was trained with a
    *null class* (labels randomly replaced by `null_class_label`), classifier-free guidance is available and
    `class_labels=None` samples unconditionally.

    This model inherits from [`DiffusionPipeline`]. Check the superclass documentation for the generic methods
    implemented for all pipelines (downloading, saving, running on a particular device, etc.).

    Parameters:
        unet ([`UNet2DModel`]): the denoiser, predicting noise (or whatever the scheduler's `prediction_type` says).
        scheduler ([`SchedulerMixin`]): any diffusers scheduler, e.g. [`DDPMScheduler`] or [`DDIMScheduler`].
        null_class_label (`int`, *optional*): the label of the null (unconditional) class, if the UNet has one.
    """

    model_cpu_offload_seq = "unet"
    _optional_components = []
    _callback_tensor_inputs = ["latents", "noise_pred"]

    def __init__(self, unet: UNet2DModel, scheduler: SchedulerMixin, null_class_label: int | None = None):
        super().__init__()
        self.register_modules(unet=unet, scheduler=scheduler)
        self.register_to_config(null_class_label=null_class_label)
        # Samples live in [-1, 1] pixel space: the processor only maps them to [0, 1] and the output type.
        self.image_processor = VaeImageProcessor(do_resize=False)

    @property
    def num_class_embeds(self) -> int | None:
        return self.unet.config.num_class_embeds

    @property
    def guidance_scale(self) -> float:
        return self._guidance_scale

    @property
    def do_classifier_free_guidance(self) -> bool:
        return self._guidance_scale > 1.0

    @property
    def num_timesteps(self) -> int:
        return self._num_timesteps

    @property
    def interrupt(self) -> bool:
        return self._interrupt

    def _sample_shape(self, batch_size: int) -> tuple[int, ...]:
        size = self.unet.config.sample_size
        size = (size, size) if isinstance(size, int) else tuple(size)
        return (batch_size, self.unet.config.in_channels, *size)

    def check_inputs(
        self,
        class_labels,
        batch_size,
        num_inference_steps,
        guidance_scale,
        generator,
        latents,
        output_type,
        callback_on_step_end_tensor_inputs,
        num_images_per_prompt=1,
        eta=0.0,
        guidance=None,
    ) -> torch.Tensor | None:
        """Validate the call's arguments before any model work; return the labels as a `(batch,)` LongTensor."""
        check_positive_int("num_inference_steps", num_inference_steps)
        check_eta(eta)
        check_finite("guidance_scale", guidance_scale, scalar=True)  # TypeError: not a number; ValueError: NaN
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"`output_type` must be one of {OUTPUT_TYPES}, got {output_type!r}.")
        check_callback_tensor_inputs(self, callback_on_step_end_tensor_inputs)
        null_label = self.config.null_class_label
        if guidance_scale > 1.0 and null_label is None:
            raise ValueError(
                f"`guidance_scale` {guidance_scale} > 1 needs a null class, but this pipeline's `null_class_label` "
                "is None; use guidance_scale=1.0."
            )

        labels = None
        if class_labels is not None:
            if self.num_class_embeds is None:
                raise ValueError(
                    "`class_labels` were given, but the UNet has no class embedding (`num_class_embeds`)."
                )
            if is_int(class_labels):
                class_labels = [class_labels]
            labels = torch.as_tensor(class_labels)
            if labels.ndim != 1 or labels.numel() == 0 or labels.dtype.is_floating_point or labels.dtype == torch.bool:
                raise ValueError(
                    f"`class_labels` must be an int or a non-empty 1-D sequence of ints, got {class_labels!r}."
                )
            labels = labels.long()
            bad = (labels < 0) | (labels >= self.num_class_embeds)
            if bad.any():
                raise ValueError(
                    f"`class_labels` must lie in [0, {self.num_class_embeds - 1}], got {labels[bad].tolist()}."
                )
            if batch_size is not None and batch_size != labels.numel():
                raise ValueError(
                    f"`batch_size` {batch_size} does not match the {labels.numel()} `class_labels` given; pass one of them."
                )
        else:
            check_positive_int("batch_size", batch_size, optional=True)
            if self.num_class_embeds is not None and null_label is None:
                raise ValueError(
                    "`class_labels` is None, but the UNet is class-conditional and has no `null_class_label` to "
                    "sample unconditionally; pass `class_labels`."
                )

        check_positive_int("num_images_per_prompt", num_images_per_prompt)
        if guidance is not None:
            if not callable(getattr(guidance, "guide", None)) or not callable(getattr(guidance, "reset", None)):
                raise TypeError(
                    "`guidance` must be None or an object with `reset()` and `guide(model_fn, scheduler, timestep, "
                    f"sample, generator=...)` (e.g. a `DoobGuidance`), got {type(guidance).__name__}."
                )
            if not isinstance(self.scheduler, (DDPMScheduler, DDIMScheduler)):
                raise ValueError(
                    f"`guidance` needs a DDPMScheduler or DDIMScheduler (unscaled model input, `alphas_cumprod`), but "
                    f"this pipeline's scheduler is {type(self.scheduler).__name__}."
                )
            for g in generator if isinstance(generator, list) else [generator] * (generator is not None):
                if not isinstance(g, torch.Generator) or g.device.type != "cpu":
                    raise ValueError(
                        f"`generator` must be a CPU generator (or a list of them) when `guidance` is given (the "
                        f"rollouts' noise is drawn on the CPU), got {getattr(g, 'device', type(g).__name__)}."
                    )
        n = (labels.numel() if labels is not None else (batch_size or 1)) * num_images_per_prompt
        if isinstance(generator, list) and len(generator) != n:
            raise ValueError(f"`generator` is a list of {len(generator)} generators, but the batch has {n} images.")
        if latents is not None and tuple(latents.shape) != self._sample_shape(n):
            raise ValueError(f"`latents` has shape {tuple(latents.shape)}; expected {self._sample_shape(n)}.")
        if latents is not None:
            check_finite("latents", latents)
        return labels

    def _guided_model_fn(self, labels: torch.Tensor | None, batch_size: int):
        """The model as a `guidance` evaluates it: `(x (M, C, H, W), t (M,)) -> noise prediction (M, C, H, W)`,
        with `M` a multiple of `batch_size` (rollouts repeat each image's rows, so its labels are repeated alike) and
        classifier-free guidance applied when it is on. `labels` are the call's `(batch_size,)` labels, or
        `(2 * batch_size,)` null-then-conditional ones under classifier-free guidance."""

        def model_fn(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            repeats = x.shape[0] // batch_size
            class_labels = None
            if labels is not None:
                halves = labels.view(-1, batch_size)  # (1 or 2, batch_size)
                class_labels = halves.repeat_interleave(repeats, dim=1).reshape(-1)
            model_input = torch.cat([x] * 2) if self.do_classifier_free_guidance else x
            timesteps = torch.cat([t] * 2) if self.do_classifier_free_guidance else t
            noise_pred = self.unet(model_input.to(self.unet.dtype), timesteps, class_labels=class_labels).sample
            if self.do_classifier_free_guidance:
                noise_uncond, noise_cond = noise_pred.chunk(2)
                noise_pred = noise_uncond + self.guidance_scale * (noise_cond - noise_uncond)
            return noise_pred.to(x.dtype)

        return model_fn

    @torch.no_grad()
    def __call__(
        self,
        class_labels: int | list[int] | torch.Tensor | None = None,
        batch_size: int | None = None,
        num_inference_steps: int = 50,
        guidance_scale: float = 1.0,
        num_images_per_prompt: int = 1,
        eta: float = 0.0,
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.Tensor | None = None,
        output_type: str = "pil",
        return_dict: bool = True,
        callback_on_step_end: Callable | PipelineCallback | MultiPipelineCallbacks | None = None,
        callback_on_step_end_tensor_inputs: list[str] = ["latents"],
        guidance=None,
    ) -> ImagePipelineOutput | tuple:
        r"""
        Generate images, one per class label (or `batch_size` unconditional images).

        Args:
            class_labels (`int`, `list[int]` or `torch.Tensor` of shape `(batch_size,)`, *optional*):
                The class of each image. `None` samples unconditionally from the null class.
            batch_size (`int`, *optional*): number of images when `class_labels` is None (defaults to 1).
            num_inference_steps (`int`, defaults to 50): denoising steps.
            guidance_scale (`float`, defaults to 1.0): classifier-free guidance weight against the null class;
                `1.0` disables guidance (one UNet pass per step instead of two).
            num_images_per_prompt (`int`, defaults to 1): images per class label (or per unconditional image), one
                after the other in the output.
            eta (`float`, defaults to 0.0): the noise weight of [`DDIMScheduler`] (0: deterministic DDIM, 1: DDPM's
                variance); schedulers whose `step` takes no `eta` ignore it.
            generator (`torch.Generator` or `list[torch.Generator]`, *optional*): one generator, or one per image
                for per-image reproducibility.
            latents (`torch.Tensor` of shape `(batch_size, in_channels, height, width)`, *optional*):
                the starting noise; sampled from `generator` when omitted.
            output_type (`str`, defaults to `"pil"`): `"pil"`, `"np"` (`(batch, H, W, C)` in [0, 1]), `"pt"`
                (`(batch, C, H, W)` in [0, 1]) or `"latent"` (the raw sample in the model's [-1, 1] space).
            return_dict (`bool`, defaults to `True`): return an [`~pipelines.ImagePipelineOutput`], else a tuple.
            callback_on_step_end (`Callable`, *optional*): called as `callback_on_step_end(self, i, t, kwargs)` at
                the end of every step with the tensors named in `callback_on_step_end_tensor_inputs`; may return a
                dict that replaces them.
            callback_on_step_end_tensor_inputs (`list[str]`, defaults to `["latents"]`): a subset of
                `self._callback_tensor_inputs` (`"latents"`, `"noise_pred"`).
            guidance (`DoobGuidance`, *optional*): training-free guidance applied around every `scheduler.step`
                (any object with `reset()` and `guide(model_fn, scheduler, timestep, sample, generator=...)`, e.g.
                a [`DoobGuidance`] built on a [`ClassifierConstraint`]). At each step it evaluates the model itself
                as `model_fn(x (M, C, H, W), t (M,)) -> noise prediction (M, C, H, W)`, where `M` is the batch or a
                multiple of it (its rollouts repeat each image's rows, and its labels with them; classifier-free
                guidance, if on, is part of `model_fn`), and returns the output that `scheduler.step` takes.
                Gradients are enabled locally where its estimator needs them. The scheduler must be one it supports
                (`DDPMScheduler`, `DDIMScheduler`); `generator` must then be on the CPU (with a list, image `b`'s
                rollouts draw from `generator[b]` alone, so it equals its single run). After the call,
                `guidance.num_model_evaluations`, `guidance.kl_estimate` and `guidance.satisfaction_lower_bound()`
                describe the run.

        Examples:

        ```py
        >>> from diffusers_ext import zoo

        >>> pipe = zoo.load("digits-ddpm")
        >>> images = pipe(class_labels=[0, 1, 2], num_inference_steps=25, guidance_scale=2.0).images
        ```

        Returns:
            [`~pipelines.ImagePipelineOutput`] or `tuple`: the generated images (a tuple `(images,)` when
            `return_dict` is False).
        """
        if isinstance(callback_on_step_end, (PipelineCallback, MultiPipelineCallbacks)):
            callback_on_step_end_tensor_inputs = callback_on_step_end.tensor_inputs
        labels = self.check_inputs(
            class_labels,
            batch_size,
            num_inference_steps,
            guidance_scale,
            generator,
            latents,
            output_type,
            callback_on_step_end_tensor_inputs,
            num_images_per_prompt,
            eta,
            guidance,
        )
        self._guidance_scale = float(guidance_scale)
        self._interrupt = False

        device = self._execution_device
        n = (labels.numel() if labels is not None else (batch_size or 1)) * num_images_per_prompt
        if labels is not None:
            labels = labels.repeat_interleave(num_images_per_prompt)
        if labels is None and self.num_class_embeds is not None:
            labels = torch.full((n,), self.config.null_class_label, dtype=torch.long)
        if labels is not None:
            labels = labels.to(device)
            if self.do_classifier_free_guidance:
                labels = torch.cat([torch.full_like(labels, self.config.null_class_label), labels])

        if latents is None:
            latents = randn_tensor(self._sample_shape(n), generator=generator, device=device, dtype=self.unet.dtype)
        else:
            latents = latents.to(device=device, dtype=self.unet.dtype)
        # timesteps first: `init_noise_sigma` of sigma schedulers (Euler, Heun, ...) depends on them
        latents, timesteps = prepare_initial_noise(self.scheduler, num_inference_steps, latents, device)
        self._num_timesteps = len(timesteps)
        extra_step_kwargs = prepare_extra_step_kwargs(self.scheduler, generator, eta)
        if guidance is not None:
            guidance.reset()
            model_fn = self._guided_model_fn(labels, n)

        for i, t in enumerate(self.progress_bar(timesteps)):
            if self.interrupt:
                continue
            if guidance is not None:
                noise_pred = guidance.guide(model_fn, self.scheduler, t, latents, generator=generator)
            else:
                model_input = torch.cat([latents] * 2) if self.do_classifier_free_guidance else latents
                model_input = self.scheduler.scale_model_input(model_input, t)
                noise_pred = self.unet(model_input, t, class_labels=labels).sample
                if self.do_classifier_free_guidance:
                    noise_uncond, noise_cond = noise_pred.chunk(2)
                    noise_pred = noise_uncond + self.guidance_scale * (noise_cond - noise_uncond)

            latents = self.scheduler.step(noise_pred, t, latents, **extra_step_kwargs).prev_sample

            if callback_on_step_end is not None:
                step_tensors = {"latents": latents, "noise_pred": noise_pred}
                callback_kwargs = {k: step_tensors[k] for k in callback_on_step_end_tensor_inputs}
                callback_outputs = callback_on_step_end(self, i, t, callback_kwargs) or {}
                latents = callback_outputs.pop("latents", latents)

        images = self.image_processor.postprocess(latents, output_type=output_type)

        self.maybe_free_model_hooks()

        if not return_dict:
            return (images,)
        return ImagePipelineOutput(images=images)
