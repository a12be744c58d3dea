"""DIRP: purify images of anti-mimicry perturbations by minimising their DDIM-inversion reconstruction error."""

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import PIL.Image
import torch
from diffusers import (
    DiffusionPipeline,
    FlowMatchEulerDiscreteScheduler,
    FluxTransformer2DModel,
    SD3Transformer2DModel,
    UNet2DConditionModel,
    UNet2DModel,
)
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.image_processor import VaeImageProcessor
from diffusers.models import AutoencoderKL
from diffusers.schedulers.scheduling_utils import SchedulerMixin
from diffusers.utils import BaseOutput, logging
from diffusers.utils.torch_utils import randn_tensor

from ...utils import check_positive_int, is_int, is_number, public
from ..denoiser_families import get_denoiser_family
from ..pipeline_utils import (
    check_callback_tensor_inputs,
    decode_vae_latents,
    encode_text,
    encode_vae_latents,
    prediction_to_epsilon,
    vp_coefficients,
)
from .ddim_inversion import (
    SUPPORTED_PREDICTION_TYPES,
    ddim_round_trip,
    inversion_timesteps,
    noise_levels,
    vae_layer_checkpointing,
)
from .flow_inversion import flow_inversion_sigmas, flow_round_trip
from .perceptual import PerceptualDistance, get_perceptual_distance
from .text_conditioning import check_text_conditioning


logger = logging.get_logger(__name__)

OUTPUT_TYPES = ("pil", "np", "pt")
ImageInput = PIL.Image.Image | np.ndarray | torch.Tensor | list


@public
@dataclass
class DIRPPipelineOutput(BaseOutput):
    r"""
    Output of [`DIRPPipeline`].

    Args:
        images (`list[PIL.Image.Image]`, `np.ndarray` of shape `(B, H, W, C)` or `torch.Tensor` of shape
            `(B, C, H, W)`): the purified images, in [0, 1] for `"np"` and `"pt"`.
        recon_error_before (`torch.Tensor` of shape `(B,)`): DDIM-inversion reconstruction error (mean squared, in
            [-1, 1] pixel units) of each input image.
        recon_error_after (`torch.Tensor` of shape `(B,)`): the same for each purified image.
        perceptual_distance (`torch.Tensor` of shape `(B,)`): distance of each purified image to its input.
        loss_history (`torch.Tensor` of shape `(num_iterations, B)`): the per-image objective at every iteration.
    """

    images: list[PIL.Image.Image] | np.ndarray | torch.Tensor
    recon_error_before: torch.Tensor
    recon_error_after: torch.Tensor
    perceptual_distance: torch.Tensor
    loss_history: torch.Tensor


@contextlib.contextmanager
def _frozen(*modules: torch.nn.Module | None) -> Iterator[None]:
    """Switch off `requires_grad` of the modules' parameters (gradients are only wanted for the image), then
    restore it."""
    params = [p for m in modules if m is not None for p in m.parameters()]
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in zip(params, flags):
            p.requires_grad_(flag)


def _check_denoisers(unet, transformer) -> None:
    """Raise a `TypeError` / `ValueError` naming the argument unless the pipeline holds one denoiser it runs."""
    if unet is not None and transformer is not None:
        raise ValueError("DIRPPipeline takes `unet` (UNet models) or `transformer` (SD3, Flux), not both.")
    if transformer is not None and not isinstance(transformer, (SD3Transformer2DModel, FluxTransformer2DModel)):
        raise TypeError(
            f"`transformer` must be an SD3Transformer2DModel or a FluxTransformer2DModel, got {type(transformer).__name__}."
        )
    addition = getattr(getattr(unet, "config", None), "addition_embed_type", None)
    if addition not in (None, "text_time"):
        raise ValueError(
            f"`unet` has `addition_embed_type={addition!r}`; DIRPPipeline runs SD 1.x / 2.x UNets and SDXL's 'text_time'."
        )


@public
class DIRPPipeline(DiffusionPipeline):
    r"""
    DIRP purification: optimise each image to minimise its inversion reconstruction error (DDIM inversion, or the
    Euler inversion of a rectified flow), within a perceptual budget of the input.

    For an input `x_in` the purified image minimises, by Adam with a cosine learning-rate decay,

        L(x) = mean((x - D(R_K(I_K(E(x)))))^2) + perceptual_weight * max(d(x, x_in) - perceptual_budget, 0)

    where `I_K` / `R_K` are `K`-step deterministic DDIM inversion and reconstruction with the denoiser (conditioned
    on `prompt`, empty by default, or on the null class of a class-conditional pixel model) on the scheduler's noise
    schedule, or for SD3 / Flux the Euler inversion and reconstruction of the flow ODE on the scheduler's noise levels
    (`flow_inversion.py`), `E` / `D` the VAE's
    encoder and decoder (identity for pixel-space models) and `d` the perceptual distance. Gradients flow through
    every denoiser call (with the same noise estimates inversion followed by reconstruction is the identity, so a
    stop-gradient there would make the objective constant); gradient checkpointing keeps memory near one denoiser
    forward+backward. With `num_inversion_steps=0` and a VAE the objective is IMPRESS's VAE consistency.

    This model inherits from [`DiffusionPipeline`]. Check the superclass documentation for the generic methods
    implemented for all pipelines (downloading, saving, running on a particular device, etc.).

    The same pipeline runs SD 1.x / 2.x, SDXL, SD3 / SD3.5 and Flux: load their folders with `from_pretrained`, or
    reuse a loaded pipeline's components with `DIRPPipeline.from_pipe(pipe)`. SDXL, SD3 and Flux prompts are encoded
    with the diffusers pipeline's own `encode_prompt` (SDXL's pooled embedding and time ids of the image size; SD3's
    and Flux's CLIP and T5 encoders), and Flux's latents are packed in 2x2 patches for each transformer call.

    Parameters:
        unet ([`UNet2DModel`] or [`UNet2DConditionModel`], *optional*): the denoiser of a UNet model (SDXL's with
            `addition_embed_type="text_time"` included), predicting `"epsilon"` or `"v_prediction"`.
        scheduler ([`SchedulerMixin`]): for a UNet, any scheduler with `alphas_cumprod` (e.g. [`DDIMScheduler`],
            SDXL's `EulerDiscreteScheduler`): the noise schedule of the inversion; for SD3 / Flux their
            `FlowMatchEulerDiscreteScheduler`.
        vae ([`AutoencoderKL`], *optional*): for latent models; omit for pixel-space models.
        text_encoder ([`~transformers.CLIPTextModel`], *optional*), tokenizer ([`~transformers.CLIPTokenizer`],
            *optional*): for text-conditioned denoisers.
        null_class_label (`int`, *optional*): the unconditional class of a class-conditional pixel UNet.
        transformer ([`SD3Transformer2DModel`] or [`FluxTransformer2DModel`], *optional*): the denoiser of SD3 /
            Flux (rectified flow, velocity prediction), in place of `unet`.
        text_encoder_2, tokenizer_2, text_encoder_3, tokenizer_3 (*optional*): the further text encoders of SDXL
            (second CLIP), SD3 (second CLIP, T5) and Flux (T5), as in their diffusers pipelines.
    """

    model_cpu_offload_seq = "text_encoder->text_encoder_2->text_encoder_3->unet->transformer->vae"
    # `unet` / `transformer` (one of them) and `scheduler` default to None so that `from_pipe` takes any family's
    # pipeline; the constructor refuses a missing scheduler or denoiser
    _optional_components = [
        "unet",
        "transformer",
        "scheduler",
        "vae",
        "text_encoder",
        "tokenizer",
        "text_encoder_2",
        "tokenizer_2",
        "text_encoder_3",
        "tokenizer_3",
    ]
    _callback_tensor_inputs = ["images", "reconstruction"]

    def __init__(
        self,
        unet: UNet2DModel | UNet2DConditionModel | None = None,
        scheduler: SchedulerMixin = None,
        vae: AutoencoderKL | None = None,
        text_encoder=None,
        tokenizer=None,
        null_class_label: int | None = None,
        transformer: SD3Transformer2DModel | FluxTransformer2DModel | None = None,
        text_encoder_2=None,
        tokenizer_2=None,
        text_encoder_3=None,
        tokenizer_3=None,
    ):
        super().__init__()
        if scheduler is None:
            raise ValueError("DIRPPipeline needs a `scheduler` (the noise schedule of its inversion).")
        if unet is None and transformer is None:
            raise ValueError("DIRPPipeline needs a denoiser: `unet` (UNet models) or `transformer` (SD3, Flux).")
        _check_denoisers(unet, transformer)
        self.register_modules(
            unet=unet,
            scheduler=scheduler,
            vae=vae,
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            transformer=transformer,
            text_encoder_2=text_encoder_2,
            tokenizer_2=tokenizer_2,
            text_encoder_3=text_encoder_3,
            tokenizer_3=tokenizer_3,
        )
        self.register_to_config(null_class_label=null_class_label)
        self.image_processor = VaeImageProcessor(do_resize=False)

    # ----------------------------------------------------------------------------------------------------- shapes

    @property
    def denoiser(self) -> torch.nn.Module:
        """The UNet, or the SD3 / Flux transformer."""
        unet = getattr(self, "unet", None)
        return unet if unet is not None else self.transformer

    @property
    def model_family(self) -> str:
        """`"sdxl"`, `"sd3"` or `"flux"` for the families encoded with their diffusers pipeline's `encode_prompt`;
        `"unet"` for pixel, class-conditional and SD 1.x / 2.x UNets."""
        denoiser = self.denoiser
        if isinstance(denoiser, SD3Transformer2DModel):
            return "sd3"
        if isinstance(denoiser, FluxTransformer2DModel):
            return "flux"
        if getattr(denoiser.config, "addition_embed_type", None) == "text_time":
            return "sdxl"
        return "unet"

    @property
    def is_flow_matching(self) -> bool:
        """Whether the denoiser is a rectified flow (SD3, Flux): Euler inversion of the flow ODE, not DDIM."""
        return self.model_family in ("sd3", "flux")

    def denoiser_family(self, guidance_scale: float = 1.0):
        """The [`DenoiserFamily`] of an SDXL, SD3 or Flux denoiser (the shared prompt encoding and call), built on
        that model's diffusers pipeline assembled from this pipeline's components (no weights are copied)."""
        from diffusers import FluxPipeline, StableDiffusion3Pipeline, StableDiffusionXLPipeline

        family = self.model_family
        if family == "unet":
            raise ValueError("`denoiser_family` is for SDXL, SD3 and Flux denoisers.")
        common = {"vae": self.vae, "scheduler": self.scheduler, "text_encoder": self.text_encoder}
        common.update(tokenizer=self.tokenizer, text_encoder_2=self.text_encoder_2, tokenizer_2=self.tokenizer_2)
        if family == "sdxl":
            pipe = StableDiffusionXLPipeline(unet=self.unet, add_watermarker=False, **common)
        elif family == "sd3":
            pipe = StableDiffusion3Pipeline(
                transformer=self.transformer,
                text_encoder_3=self.text_encoder_3,
                tokenizer_3=self.tokenizer_3,
                **common,
            )
        else:
            pipe = FluxPipeline(transformer=self.transformer, **common)
        return get_denoiser_family(pipe, guidance_scale=guidance_scale)

    @property
    def vae_scale_factor(self) -> int:
        """Pixels per latent pixel (1 for pixel-space models)."""
        if getattr(self, "vae", None) is None:
            return 1
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    @property
    def image_channels(self) -> int:
        """Channels of the images the pipeline purifies."""
        return (
            self.vae.config.in_channels if getattr(self, "vae", None) is not None else self.denoiser.config.in_channels
        )

    @property
    def size_multiple(self) -> int:
        """Image height and width must be multiples of this (the VAE's and the UNet's downsampling, SD3's patches,
        Flux's 2x2 packing)."""
        family = self.model_family
        if family == "sd3":
            return self.vae_scale_factor * self.transformer.config.patch_size
        if family == "flux":
            return self.vae_scale_factor * 2
        return self.vae_scale_factor * 2 ** (len(self.unet.config.block_out_channels) - 1)

    @property
    def num_timesteps(self) -> int:
        """Optimisation iterations of the last call (one callback and one progress-bar tick each)."""
        return self._num_timesteps

    # ------------------------------------------------------------------------------------------ model components

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """Images `(B, C, H, W)` in [-1, 1] to the denoiser's space (scaled VAE latents, or the images themselves)."""
        if getattr(self, "vae", None) is None:
            return images
        return encode_vae_latents(self.vae, images)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """The inverse of [`encode_images`]: denoiser-space samples to images in (about) [-1, 1]."""
        if getattr(self, "vae", None) is None:
            return latents
        return decode_vae_latents(self.vae, latents)

    def encode_prompt(
        self,
        prompt: str | list[str] | None,
        device: torch.device | None = None,
        num_images_per_prompt: int = 1,
        do_classifier_free_guidance: bool = False,
        negative_prompt: str | list[str] | None = None,
        prompt_embeds: torch.Tensor | None = None,
        negative_prompt_embeds: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        r"""
        Encode `prompt` with the text encoder, with the signature of diffusers' `StableDiffusionPipeline.encode_prompt`.

        Args:
            prompt (`str` or `list[str]`, *optional*): the prompts; ignored when `prompt_embeds` is given.
            device (`torch.device`, *optional*): defaults to the execution device.
            num_images_per_prompt (`int`, defaults to 1): each embedding is repeated this many times.
            do_classifier_free_guidance (`bool`, defaults to False): also encode `negative_prompt` (`""` if None).
            negative_prompt (`str` or `list[str]`, *optional*), prompt_embeds (`torch.Tensor` of shape
                `(B, L, D)`, *optional*), negative_prompt_embeds (`torch.Tensor` of shape `(B, L, D)`, *optional*):
                as in diffusers; precomputed embeddings skip the tokenizer and text encoder.

        Returns:
            `tuple`: `prompt_embeds` `(B * num_images_per_prompt, L, D)` and `negative_prompt_embeds` (same shape, or
            None without guidance).
        """
        device = device or self._execution_device

        def encode(text) -> torch.Tensor:
            if self.tokenizer is None or self.text_encoder is None:
                raise ValueError(
                    "DIRPPipeline needs `tokenizer` and `text_encoder` to encode a prompt (its `unet` is "
                    "text-conditioned); build the pipeline with both, or pass `prompt_embeds`."
                )
            texts = [text] if isinstance(text, str) else list(text)
            return encode_text(self.tokenizer, self.text_encoder, texts, device)[0]

        if prompt_embeds is None:
            prompt_embeds = encode(prompt)
        negative = None
        if do_classifier_free_guidance:
            if negative_prompt_embeds is None:
                negative_prompt = "" if negative_prompt is None else negative_prompt
                if isinstance(negative_prompt, str):
                    negative_prompt = [negative_prompt] * prompt_embeds.shape[0]
                negative_prompt_embeds = encode(negative_prompt)
            negative = negative_prompt_embeds.to(device).repeat_interleave(num_images_per_prompt, dim=0)
        return prompt_embeds.to(device).repeat_interleave(num_images_per_prompt, dim=0), negative

    def noise_function(
        self,
        batch_size: int,
        device,
        prompt: str | list[str] = "",
        unet: torch.nn.Module | None = None,
        prompt_embeds: torch.Tensor | None = None,
        image_size: tuple[int, int] | None = None,
        guidance_scale: float = 1.0,
    ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        r"""
        `noise_fn(z, t) -> eps` for the denoiser under this pipeline's condition (the prompt for a text-conditioned
        model, the null class for a class-conditional one, else none); for SD3 / Flux `noise_fn(z, sigma) -> v`, the
        velocity at noise level `sigma`.

        `z` has shape `(batch_size, C, h, w)` and `t` is an integer timestep, 0-d or of shape `(batch_size,)`
        (`sigma` a 0-d float). `unet` replaces the pipeline's own denoiser (a surrogate being fine-tuned, say); it
        must take the same condition. `prompt_embeds` `(batch_size, L, D)` or `(1, L, D)` replaces the encoded
        `prompt` (SD 1.x / 2.x). `image_size` `(height, width)` in pixels gives SDXL's time ids (default the UNet's
        size); `guidance_scale` is Flux.1-dev's distilled guidance input.
        """
        if self.model_family != "unet":
            return self._family_noise_function(batch_size, device, prompt, unet, image_size, guidance_scale)
        unet = self.unet if unet is None else unet
        condition = {}
        if isinstance(unet, UNet2DConditionModel):
            if prompt_embeds is None:
                prompts = [prompt] * batch_size if isinstance(prompt, str) else prompt
                with torch.no_grad():
                    prompt_embeds = self.encode_prompt(prompts, device)[0]
            # embeddings are a fixed condition: no gradient flows into the text encoder
            condition["encoder_hidden_states"] = prompt_embeds.detach().to(device).expand(batch_size, -1, -1)
        elif unet.config.num_class_embeds is not None:
            condition["class_labels"] = torch.full((batch_size,), self.config.null_class_label, device=device)
        prediction_type = self.scheduler.config.prediction_type

        def noise_fn(z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            t = t.to(z.device)
            output = unet(z.to(unet.dtype), t, **condition).sample.to(z.dtype)
            alpha = self.scheduler.alphas_cumprod.to(z.device, z.dtype)[t]
            alpha = alpha.view(-1, *[1] * (z.ndim - 1)) if alpha.ndim else alpha
            signal, noise = vp_coefficients(alpha)
            return prediction_to_epsilon(output, z, signal, noise, prediction_type)

        return noise_fn

    def _family_noise_function(self, batch_size, device, prompt, model, image_size, guidance_scale):
        """`noise_function` for SDXL, SD3 and Flux: the shared family's prompt encoding and call."""
        family = self.denoiser_family(guidance_scale)
        model = self.denoiser if model is None else model
        prompts = [prompt] * batch_size if isinstance(prompt, str) else list(prompt)
        with torch.no_grad():
            cond = family.encode_prompts(prompts, "prompt", image_size).to(device)
        if self.is_flow_matching:
            num_train_timesteps = self.scheduler.config.num_train_timesteps

            def velocity_fn(z: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
                timestep = (sigma * num_train_timesteps).to(z.device, torch.float32).expand(z.shape[0])
                return family.predict(model, z, timestep, cond, model.dtype).to(z.dtype)

            return velocity_fn
        prediction_type = self.scheduler.config.prediction_type

        def noise_fn(z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            t = t.to(z.device)
            output = family.predict(model, z, t.expand(z.shape[0]), cond, model.dtype).to(z.dtype)
            alpha = self.scheduler.alphas_cumprod.to(z.device, z.dtype)[t]
            alpha = alpha.view(-1, *[1] * (z.ndim - 1)) if alpha.ndim else alpha
            signal, noise = vp_coefficients(alpha)
            return prediction_to_epsilon(output, z, signal, noise, prediction_type)

        return noise_fn

    def image_seq_len(self, latents: torch.Tensor) -> int:
        """Image tokens of the transformer for `latents` `(B, C, h, w)`: SD3's patches, Flux's 2x2 packs."""
        patch = self.transformer.config.patch_size if self.model_family == "sd3" else 2
        return (latents.shape[-2] // patch) * (latents.shape[-1] // patch)

    def reconstruct(
        self,
        images: torch.Tensor,
        num_inversion_steps: int,
        inversion_strength: float = 0.5,
        prompt: str | list[str] = "",
        gradient_checkpointing: bool = True,
        noise_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        r"""
        `D(R_K(I_K(E(images))))`: the DDIM-inversion round trip of images `(B, C, H, W)` in [-1, 1] (for SD3 / Flux
        the Euler inversion of the flow ODE, [`flow_round_trip`]), differentiable.
        With `num_inversion_steps=0` only the VAE round trip remains. `noise_fn` (from [`noise_function`]) saves
        encoding `prompt` again when the round trip is repeated. `gradient_checkpointing` recomputes activations in
        the backward pass: each denoiser call's, the VAE encoder's and each VAE decoder layer's (residual block,
        resampler, attention, output layers), so that memory holds one of them at a time; the outputs of attention
        over long key sequences are kept instead of recomputed. It is on by default, as in `__call__` (without it one
        SD-shaped 512 px backward keeps about 9 GB of activations), and only acts while gradients are recorded: under
        `torch.no_grad()` there is nothing to keep.
        """
        gradient_checkpointing = gradient_checkpointing and torch.is_grad_enabled()
        with vae_layer_checkpointing(getattr(self, "vae", None), gradient_checkpointing):
            latents = self.encode_images(images)
            # The DDIM arithmetic runs in float32 at least, whatever the models' dtype: in bf16 the round trip's own
            # rounding is a large share of the reconstruction error being minimised.
            latents = latents.to(torch.promote_types(latents.dtype, torch.float32))
            if num_inversion_steps > 0:
                noise_fn = noise_fn or self.noise_function(
                    images.shape[0], images.device, prompt, image_size=tuple(images.shape[-2:])
                )
                if self.is_flow_matching:
                    sigmas = flow_inversion_sigmas(
                        self.scheduler,
                        num_inversion_steps,
                        inversion_strength,
                        self.image_seq_len(latents),
                        flux_levels=self.model_family == "flux",
                    )
                    latents = flow_round_trip(noise_fn, latents, sigmas, use_checkpoint=gradient_checkpointing)
                else:
                    timesteps = inversion_timesteps(self.scheduler, num_inversion_steps, inversion_strength)
                    alphas = noise_levels(self.scheduler, timesteps)
                    latents = ddim_round_trip(
                        noise_fn, latents, timesteps, alphas, use_checkpoint=gradient_checkpointing
                    )
            return self.decode_latents(latents).to(images.dtype)

    @torch.no_grad()
    def reconstruction_error(
        self,
        image: ImageInput,
        num_inversion_steps: int = 10,
        inversion_strength: float = 0.5,
        prompt: str | list[str] = "",
    ) -> torch.Tensor:
        """Per-image mean squared DDIM-inversion reconstruction error `(B,)` of `image` (any input `__call__`
        takes), in [-1, 1] pixel units."""
        self._check_schedule(num_inversion_steps, inversion_strength)
        images = self.preprocess(image).to(self._execution_device)
        self._check_prompt(prompt, images.shape[0])
        recon = self.reconstruct(images, num_inversion_steps, inversion_strength, prompt)
        return (recon - images).pow(2).flatten(1).mean(1).cpu()

    # ------------------------------------------------------------------------------------------------- inputs

    def preprocess(self, image: ImageInput) -> torch.Tensor:
        r"""
        Convert `image` to a float32 batch `(B, C, H, W)` in [-1, 1], checking range, channels and size.

        Accepts a PIL image, a numpy array (`(H, W)`, `(H, W, C)` or `(B, H, W, C)`; float in [0, 1] or [-1, 1], or
        uint8), a tensor (`(C, H, W)` or `(B, C, H, W)` in [0, 1] or [-1, 1]) or a list of any of these. Arrays and
        tensors with a negative value are read as [-1, 1], others as [0, 1] (diffusers' convention).
        """
        items = image if isinstance(image, list) else [image]
        if not items:
            raise ValueError("`image` is an empty list; expected at least one image.")
        channels = self.image_channels
        batches = []
        for item in items:
            if isinstance(item, PIL.Image.Image):
                item = np.asarray(item.convert("L" if channels == 1 else "RGB"))
            if isinstance(item, np.ndarray):
                array = item.astype(np.float32) / 255.0 if item.dtype == np.uint8 else item
                if array.ndim == 2:
                    array = array[..., None]
                if array.ndim == 3:
                    array = array[None]
                if array.ndim != 4:
                    raise ValueError(
                        f"`image` numpy arrays must be (H, W), (H, W, C) or (B, H, W, C); got {item.shape}."
                    )
                tensor = torch.from_numpy(np.ascontiguousarray(array)).permute(0, 3, 1, 2)
            elif isinstance(item, torch.Tensor):
                tensor = item.detach().cpu()
                if tensor.ndim == 3:
                    tensor = tensor[None]
                if tensor.ndim != 4:
                    raise ValueError(f"`image` tensors must be (C, H, W) or (B, C, H, W); got {tuple(item.shape)}.")
            else:
                raise TypeError(
                    f"`image` must be a PIL image, numpy array, torch tensor or a list of them; got {type(item).__name__}."
                )
            if not tensor.is_floating_point():
                raise TypeError(f"`image` values must be floats (or uint8 numpy arrays); got dtype {tensor.dtype}.")
            tensor = tensor.float()
            if not torch.isfinite(tensor).all():
                raise ValueError("`image` contains NaN or infinite values.")
            low, high = float(tensor.min()), float(tensor.max())
            if low < -1.0 - 1e-6 or high > 1.0 + 1e-6:
                raise ValueError(
                    f"`image` values span [{low:.3g}, {high:.3g}]; expected [0, 1] or [-1, 1] (uint8 only as numpy)."
                )
            batches.append(tensor if low < 0 else tensor * 2.0 - 1.0)
        shapes = {tuple(t.shape[1:]) for t in batches}
        if len(shapes) > 1:
            raise ValueError(f"`image` items have different shapes {sorted(shapes)}; expected one size.")
        images = torch.cat(batches).clamp(-1.0, 1.0)
        c, h, w = images.shape[1:]
        if c != channels:
            raise ValueError(f"`image` has {c} channels; this pipeline's model expects {channels}.")
        m = self.size_multiple
        if h % m or w % m:
            raise ValueError(f"`image` size {h}x{w} is not a multiple of {m}, which this pipeline's model needs.")
        return images

    def _check_schedule(self, num_inversion_steps, inversion_strength) -> None:
        check_positive_int("num_inversion_steps", num_inversion_steps, minimum=0)
        if num_inversion_steps == 0 and getattr(self, "vae", None) is None:
            raise ValueError(
                "`num_inversion_steps` 0 leaves only the VAE round trip, but this pipeline has no `vae`; use >= 1."
            )
        if not isinstance(inversion_strength, (int, float)) or not 0.0 < inversion_strength <= 1.0:
            raise ValueError(f"`inversion_strength` must lie in (0, 1], got {inversion_strength!r}.")
        if self.is_flow_matching:
            if not isinstance(self.scheduler, FlowMatchEulerDiscreteScheduler):
                raise TypeError(
                    f"the {type(self.transformer).__name__} is a rectified flow: its inversion needs a "
                    f"FlowMatchEulerDiscreteScheduler, but the pipeline's scheduler is a {type(self.scheduler).__name__}."
                )
            if getattr(self, "vae", None) is None:
                raise ValueError(
                    f"the {type(self.transformer).__name__} works on VAE latents: the pipeline needs `vae`."
                )
            return
        if num_inversion_steps > 0 and getattr(self.scheduler, "alphas_cumprod", None) is None:
            raise TypeError(
                f"DDIM inversion reads the noise schedule `alphas_cumprod` of a DDPM-family scheduler (DDIM, DDPM, "
                f"Euler, PNDM, ...); the pipeline's {type(self.scheduler).__name__} has none (flow matching?)."
            )
        prediction_type = self.scheduler.config.prediction_type
        if num_inversion_steps > 0 and prediction_type not in SUPPORTED_PREDICTION_TYPES:
            raise ValueError(
                f"the scheduler's `prediction_type` {prediction_type!r} is not supported by DDIM inversion; expected "
                f"one of {SUPPORTED_PREDICTION_TYPES}."
            )
        if (
            getattr(self.denoiser.config, "num_class_embeds", None) is not None
            and self.config.null_class_label is None
        ):
            raise ValueError(
                "the UNet is class-conditional, so inversion needs its unconditional class: set `null_class_label`."
            )

    def _check_prompt(self, prompt, batch_size: int) -> None:
        if prompt is None or isinstance(prompt, str):
            return
        if not isinstance(prompt, list) or not all(isinstance(p, str) for p in prompt):
            raise TypeError(f"`prompt` must be a str or a list of str, got {type(prompt).__name__}.")
        if len(prompt) != batch_size:
            raise ValueError(f"`prompt` has {len(prompt)} entries for {batch_size} images; expected one per image.")

    def check_inputs(
        self,
        num_inversion_steps,
        inversion_strength,
        num_iterations,
        learning_rate,
        perceptual_budget,
        perceptual_weight,
        init_noise_std,
        output_type,
        callback_on_step_end_tensor_inputs,
    ) -> None:
        """Validate the scalar arguments before any model work (the images are checked by [`preprocess`])."""
        self._check_schedule(num_inversion_steps, inversion_strength)
        check_positive_int("num_iterations", num_iterations)
        for name, value, allow_zero in (
            ("learning_rate", learning_rate, False),
            ("perceptual_budget", perceptual_budget, False),
            ("perceptual_weight", perceptual_weight, True),
            ("init_noise_std", init_noise_std, True),
        ):
            if not is_number(value) or not math.isfinite(value):
                raise TypeError(f"`{name}` must be a finite number, got {value!r}.")
            if value < 0 or (value == 0 and not allow_zero):
                raise ValueError(f"`{name}` must be {'>= 0' if allow_zero else '> 0'}, got {value!r}.")
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"`output_type` must be one of {OUTPUT_TYPES}, got {output_type!r}.")
        check_callback_tensor_inputs(self, callback_on_step_end_tensor_inputs)

    # --------------------------------------------------------------------------------------------------- call

    def __call__(
        self,
        image: ImageInput,
        prompt: str | list[str] | None = "",
        num_inversion_steps: int = 10,
        inversion_strength: float = 0.5,
        num_iterations: int = 100,
        learning_rate: float = 0.003,
        perceptual: str | PerceptualDistance = "ssim",
        perceptual_budget: float = 0.02,
        perceptual_weight: float = 1.0,
        init_noise_std: float = 0.0,
        gradient_checkpointing: bool = True,
        distilled_guidance_scale: float = 1.0,
        num_images_per_prompt: int = 1,
        prompt_embeds: torch.Tensor | None = None,
        generator: torch.Generator | list[torch.Generator] | None = None,
        output_type: str = "pil",
        return_dict: bool = True,
        callback_on_step_end: Callable | PipelineCallback | MultiPipelineCallbacks | None = None,
        callback_on_step_end_tensor_inputs: list[str] = ["images"],
    ) -> DIRPPipelineOutput | tuple:
        r"""
        Purify `image`. Gradients are enabled inside (the images are optimised); the models' weights are frozen.

        Args:
            image (PIL image, `np.ndarray`, `torch.Tensor` or a list of them): the (possibly protected) images; see
                [`preprocess`] for shapes and value ranges. Height and width must be multiples of `size_multiple`.
            prompt (`str` or `list[str]`, defaults to `""`): the condition of a text-conditioned denoiser during
                inversion (one per image, or one for all). Ignored by unconditional and class-conditional models,
                which use no condition or the null class.
            num_inversion_steps (`int`, defaults to 10): DDIM steps `K` of the inversion (and of the reconstruction);
                `0` (latent models only) leaves the VAE round trip (IMPRESS).
            inversion_strength (`float`, defaults to 0.5): how far up the noise schedule the inversion goes, in
                (0, 1]: the `K` steps are spaced evenly up to timestep `strength * (T - 1)` (partial inversion).
                Near 1 many schedules have cumulative alphas near 0 (1e-9 for the cosine schedule at its last step),
                where DDIM inversion is ill-conditioned and the reconstruction error explodes.
            num_iterations (`int`, defaults to 100): Adam iterations.
            learning_rate (`float`, defaults to 0.003): Adam's initial learning rate (cosine decay to 1/1000 of it),
                in [-1, 1] pixel units. Each iteration moves a pixel by about this much, so `num_iterations *
                learning_rate` bounds the change; larger rates overshoot past the clean image.
            perceptual (`str` or callable, defaults to `"ssim"`): the distance to the input: `"ssim"` (1 - SSIM),
                `"l2"` (RMS), or any differentiable callable `(x, y) -> (B,)` on [-1, 1] images (an LPIPS model,
                for instance).
            perceptual_budget (`float`, defaults to 0.02): distance allowed for free (the hinge's threshold).
            perceptual_weight (`float`, defaults to 1.0): weight of the hinge `max(d - budget, 0)`.
            init_noise_std (`float`, defaults to 0.0): standard deviation of Gaussian noise added to the input
                before optimising (IMPRESS uses 0.1 against PhotoGuard); drawn from `generator`.
            gradient_checkpointing (`bool`, defaults to True): recompute each denoiser call, the VAE encoder and
                each VAE decoder layer in the backward pass, so memory holds one of them at a time instead of `2K`
                calls and the whole VAE (which dominates at Stable Diffusion resolutions). Attention over long key
                sequences is not recomputed: its output is kept (selective checkpointing), which spares most of the
                recomputation's time on CPU for a few activations.
            distilled_guidance_scale (`float`, defaults to 1.0): the distilled guidance input of a guidance-distilled Flux
                transformer (Flux.1-dev) during inversion and reconstruction; DIRP uses no classifier-free guidance,
                and other models ignore it.
            num_images_per_prompt (`int`, defaults to 1): purified versions of each input image, from different
                `init_noise_std` draws; the output holds them image by image (`B * num_images_per_prompt` rows).
            prompt_embeds (`torch.Tensor` of shape `(B, L, D)` or `(1, L, D)`, *optional*): precomputed text
                embeddings (see [`encode_prompt`]) instead of `prompt`, for a text-conditioned denoiser. DIRP uses no
                classifier-free guidance, so there is no `negative_prompt_embeds`.
            generator (`torch.Generator` or `list[torch.Generator]`, *optional*): for `init_noise_std`; a list has one
                generator per output image.
            output_type (`str`, defaults to `"pil"`): `"pil"`, `"np"` (`(B, H, W, C)` in [0, 1]) or `"pt"`
                (`(B, C, H, W)` in [0, 1]).
            return_dict (`bool`, defaults to True): return a [`DIRPPipelineOutput`], else a tuple in its order.
            callback_on_step_end (`Callable`, *optional*): called as `callback_on_step_end(self, i, i, kwargs)` after
                every iteration with the tensors named in `callback_on_step_end_tensor_inputs` (`"images"`: the
                current images `(B, C, H, W)` in [-1, 1]; `"reconstruction"`: their round trip); returning
                `{"images": ...}` replaces the images being optimised.
            callback_on_step_end_tensor_inputs (`list[str]`, defaults to `["images"]`).

        Examples:

        ```py
        >>> from diffusers_ext import DIRPPipeline, zoo

        >>> pipe = DIRPPipeline.from_pretrained(zoo.path("digits-ddpm"))
        >>> out = pipe(protected_images, num_inversion_steps=10, num_iterations=60, output_type="pt")
        >>> out.recon_error_before, out.recon_error_after
        ```

        Returns:
            [`DIRPPipelineOutput`] or `tuple`.
        """
        if isinstance(callback_on_step_end, (PipelineCallback, MultiPipelineCallbacks)):
            callback_on_step_end_tensor_inputs = callback_on_step_end.tensor_inputs
        self.check_inputs(
            num_inversion_steps,
            inversion_strength,
            num_iterations,
            learning_rate,
            perceptual_budget,
            perceptual_weight,
            init_noise_std,
            output_type,
            callback_on_step_end_tensor_inputs,
        )
        if not is_int(num_images_per_prompt):  # a wrong type is a TypeError, a wrong value a ValueError
            raise TypeError(f"`num_images_per_prompt` must be a positive int, got {num_images_per_prompt!r}.")
        check_positive_int("num_images_per_prompt", num_images_per_prompt)
        distance = get_perceptual_distance(perceptual)
        device = self._execution_device
        source = self.preprocess(image).to(device)
        self._check_prompt(prompt, source.shape[0])
        check_text_conditioning(self, prompt, prompt_embeds, source.shape[0])
        prompt = "" if prompt is None and prompt_embeds is None else prompt
        source = source.repeat_interleave(num_images_per_prompt, dim=0)
        batch_size = source.shape[0]
        if isinstance(prompt, list):
            prompt = [p for p in prompt for _ in range(num_images_per_prompt)]
        if prompt_embeds is not None:
            prompt_embeds = prompt_embeds.repeat_interleave(num_images_per_prompt if len(prompt_embeds) > 1 else 1, 0)
        if isinstance(generator, list) and len(generator) != batch_size:
            raise ValueError(
                f"`generator` is a list of {len(generator)} generators for {batch_size} output images (images x "
                "`num_images_per_prompt`)."
            )
        self._num_timesteps = num_iterations

        noise_fn = self.noise_function(
            batch_size,
            device,
            prompt,
            prompt_embeds=prompt_embeds,
            image_size=tuple(source.shape[-2:]),
            guidance_scale=distilled_guidance_scale,
        )

        def objective(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            recon = self.reconstruct(
                x, num_inversion_steps, inversion_strength, prompt, gradient_checkpointing, noise_fn=noise_fn
            )
            recon_error = (recon - x).pow(2).flatten(1).mean(1)
            hinge = torch.relu(distance(x, source).to(x.dtype) - perceptual_budget)
            return recon_error + perceptual_weight * hinge, recon_error, recon

        text_encoders = [getattr(self, name, None) for name in ("text_encoder", "text_encoder_2", "text_encoder_3")]
        with _frozen(self.denoiser, getattr(self, "vae", None), *text_encoders):
            with torch.no_grad():
                recon_error_before = objective(source)[1]
            images = source
            if init_noise_std > 0:
                noise = randn_tensor(source.shape, generator=generator, device=device, dtype=source.dtype)
                images = (source + init_noise_std * noise).clamp(-1.0, 1.0)
            images = images.detach().clone().requires_grad_(True)
            optimizer = torch.optim.Adam([images], lr=learning_rate, eps=1e-8)
            schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, num_iterations, learning_rate * 1e-3)
            history = []
            for i in self.progress_bar(range(num_iterations)):
                with torch.enable_grad():
                    loss, _, recon = objective(images)
                    optimizer.zero_grad(set_to_none=True)
                    loss.sum().backward()  # a sum: each image's gradient is its own objective's
                optimizer.step()
                schedule.step()
                with torch.no_grad():
                    images.clamp_(-1.0, 1.0)
                history.append(loss.detach().cpu())
                if callback_on_step_end is not None:
                    step_tensors = {"images": images.detach(), "reconstruction": recon.detach()}
                    callback_kwargs = {k: step_tensors[k] for k in callback_on_step_end_tensor_inputs}
                    callback_outputs = callback_on_step_end(self, i, i, callback_kwargs) or {}
                    if "images" in callback_outputs:
                        with torch.no_grad():
                            images.copy_(callback_outputs["images"])
            purified = images.detach()
            with torch.no_grad():
                recon_error_after = objective(purified)[1]
                final_distance = distance(purified, source)

        output = self.image_processor.postprocess(purified, output_type=output_type)
        self.maybe_free_model_hooks()
        result = (
            output,
            recon_error_before.detach().cpu(),
            recon_error_after.detach().cpu(),
            final_distance.detach().float().cpu(),
            torch.stack(history),
        )
        if not return_dict:
            return result
        return DIRPPipelineOutput(*result)
