"""What every pipeline of the package shares: input checks, the VAE's latent scaling, prediction conversions and
CLIP-style prompt encoding."""

import inspect
import math

import torch

from ..utils import is_number


X0_PREDICTION_TYPES = ("epsilon", "v_prediction", "sample", "flow")
EPSILON_PREDICTION_TYPES = ("epsilon", "v_prediction")


def check_callback_tensor_inputs(pipeline, names) -> None:
    """Raise a `ValueError` unless `names` (`callback_on_step_end_tensor_inputs`, or None) is a subset of the
    pipeline's `_callback_tensor_inputs`."""
    if names is not None and not set(names) <= set(pipeline._callback_tensor_inputs):
        raise ValueError(
            f"`callback_on_step_end_tensor_inputs` must be a subset of {pipeline._callback_tensor_inputs}, got "
            f"{names!r}."
        )


def check_supported_denoiser(model, argument: str, user: str) -> None:
    """Raise a `ValueError` naming `argument` when `model` is a denoiser family `user` does not run.

    The pack's image methods condition a UNet on the prompt's token embeddings alone (SD 1.x / 2.x), or run SD3's
    transformer. SDXL-style UNets also need pooled text embeddings and size/crop time ids (`added_cond_kwargs`),
    and Flux transformers take packed 2x2 latent patches and a distilled guidance input; neither is wired in, so
    they are refused here, before any work, rather than failing inside the model with an unrelated message.
    """
    config = getattr(model, "config", None)
    addition = getattr(config, "addition_embed_type", None)
    if addition is not None:
        raise ValueError(
            f"`{argument}` is a UNet with `addition_embed_type={addition!r}` (SDXL-style: it needs pooled text "
            f"embeddings and time ids), which {user} does not support; use SD 1.x / 2.x-style UNets (see the "
            "method's page in docs/, 'Supported models')."
        )
    if type(model).__name__ == "FluxTransformer2DModel":
        raise ValueError(
            f"`{argument}` is a FluxTransformer2DModel (packed 2x2 latents, distilled guidance), which {user} does "
            "not support (see the method's page in docs/, 'Supported models')."
        )


# scheduler steps -----------------------------------------------------------------------------------------------------


def check_eta(eta) -> None:
    """Raise unless `eta` (DDIM's noise weight) is a finite number >= 0: a `TypeError` for a non-number, else a
    `ValueError`."""
    if not is_number(eta):
        raise TypeError(f"`eta` must be a number, got {type(eta).__name__}.")
    if not math.isfinite(eta) or eta < 0:
        raise ValueError(f"`eta` must be a finite number >= 0 (0: deterministic DDIM, 1: DDPM-like), got {eta!r}.")


def prepare_extra_step_kwargs(scheduler, generator=None, eta: float | None = None) -> dict:
    """The keyword arguments of `scheduler.step` that only some schedulers take (diffusers'
    `prepare_extra_step_kwargs`): `generator` for stochastic schedulers (DDPM, DDIM, Euler ancestral, ...) and `eta`
    (DDIM's noise weight, in [0, 1]) for those whose `step` declares it; the others (PNDM, UniPC, Heun, LMS, ...)
    get neither, so every diffusers scheduler swaps in."""
    parameters = inspect.signature(scheduler.step).parameters
    kwargs = {}
    if eta is not None and "eta" in parameters:
        kwargs["eta"] = eta
    if "generator" in parameters:
        kwargs["generator"] = generator
    return kwargs


def prepare_initial_noise(scheduler, num_inference_steps: int, latents: torch.Tensor, device, **options):
    """Set the scheduler's timesteps, then scale the starting noise `latents` by its `init_noise_sigma`, in that
    order (diffusers' pipelines): sigma-parameterised schedulers (Euler, Heun, LMS, ...) compute `init_noise_sigma`
    from the timesteps just set, so scaling first would use the previous call's (or the training schedule's) value.

    Returns:
        `(latents, timesteps)`: the scaled noise, of the shape of `latents`, and `scheduler.timesteps`.
    """
    scheduler.set_timesteps(num_inference_steps, device=device, **options)
    return latents * getattr(scheduler, "init_noise_sigma", 1.0), scheduler.timesteps


# VAE latents ---------------------------------------------------------------------------------------------------------


def vae_shift_factor(vae) -> float:
    """The VAE's `shift_factor` (SD3 and Flux have one; SD 1.x's VAE has none: 0)."""
    return getattr(vae.config, "shift_factor", None) or 0.0


def encode_vae_latents(vae, images: torch.Tensor) -> torch.Tensor:
    """Scaled latents `(B, c, h, w)` of images `(B, C, H, W)` in [-1, 1]: `(mode - shift_factor) * scaling_factor`
    of the VAE's posterior (diffusers' convention, the denoiser's space)."""
    latents = vae.encode(images.to(vae.dtype)).latent_dist.mode()
    return (latents - vae_shift_factor(vae)) * vae.config.scaling_factor


def decode_vae_latents(vae, latents: torch.Tensor) -> torch.Tensor:
    """Images `(B, C, H, W)` in (about) [-1, 1] from scaled latents `(B, c, h, w)`: the inverse of
    [`encode_vae_latents`], `vae.decode(latents / scaling_factor + shift_factor)` in the VAE's dtype."""
    latents = latents / vae.config.scaling_factor + vae_shift_factor(vae)
    return vae.decode(latents.to(vae.dtype), return_dict=False)[0]


# predictions ---------------------------------------------------------------------------------------------------------


def prediction_to_x0(
    model_output: torch.Tensor,
    sample: torch.Tensor,
    signal,
    noise,
    prediction_type: str,
    supported: tuple[str, ...] = X0_PREDICTION_TYPES,
) -> torch.Tensor:
    """The clean-sample estimate `x_0` from a denoiser output, for a noisy sample `x_t = signal * x_0 + noise * e`
    (DDPM family: `signal = sqrt(alpha_bar)`, `noise = sqrt(1 - alpha_bar)`; flow matching: `1 - sigma`, `sigma`).

    Args:
        model_output (`torch.Tensor`): the prediction, of the shape of `sample` (or broadcasting against it).
        sample (`torch.Tensor`): `x_t`.
        signal, noise (`float` or `torch.Tensor` broadcasting against `sample`): the scales of `x_0` and `e`.
        prediction_type (`str`): `"epsilon"`, `"v_prediction"`, `"sample"` or `"flow"` (the velocity `e - x_0`).
        supported (`tuple[str]`): the prediction types the caller accepts; another raises a `ValueError`.
    """
    if prediction_type not in supported:
        raise ValueError(f"the scheduler's `prediction_type` {prediction_type!r} is not one of {supported}.")
    if prediction_type == "epsilon":
        return (sample - noise * model_output) / signal
    if prediction_type == "v_prediction":
        return signal * sample - noise * model_output
    if prediction_type == "sample":
        return model_output
    return sample - noise * model_output  # flow: x_0 = x_t - sigma v


def prediction_to_epsilon(model_output: torch.Tensor, sample: torch.Tensor, signal, noise, prediction_type: str):
    """The noise estimate `e` from a denoiser output (`"epsilon"` or `"v_prediction"`), for a noisy sample
    `x_t = signal * x_0 + noise * e` (see [`prediction_to_x0`]); another type raises a `ValueError`."""
    if prediction_type == "epsilon":
        return model_output
    if prediction_type == "v_prediction":
        return signal * model_output + noise * sample
    raise ValueError(
        f"a noise estimate needs `prediction_type` in {EPSILON_PREDICTION_TYPES}, got {prediction_type!r}."
    )


# prompts -------------------------------------------------------------------------------------------------------------


def encode_text(tokenizer, text_encoder, texts: list[str], device) -> tuple[torch.Tensor, torch.LongTensor]:
    """CLIP-style prompt encoding (diffusers' `StableDiffusionPipeline`): `texts` padded to the tokenizer's
    `model_max_length` and truncated; returns the text encoder's last hidden states `(N, L, D)` and the attention
    mask `(N, L)` (to count each prompt's tokens)."""
    tokens = tokenizer(
        list(texts), padding="max_length", max_length=tokenizer.model_max_length, truncation=True, return_tensors="pt"
    )
    return text_encoder(tokens.input_ids.to(device))[0], tokens.attention_mask
