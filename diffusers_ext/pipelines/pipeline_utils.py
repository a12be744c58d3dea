"""What every pipeline of the package shares: input checks, the VAE's latent scaling, noise levels and prediction
conversions, the deterministic DDIM move and CLIP-style prompt encoding.

Each of these formulas is written here once (`tests/test_formula_homes.py` fails on a copy elsewhere): a noisy
sample is `x_t = signal * x_0 + noise * e`, with `(signal, noise) = (sqrt(alpha_bar_t), sqrt(1 - alpha_bar_t))` for
DDPM-family schedulers ([`vp_coefficients`]) and `(1 - sigma_t, sigma_t)` for flow matching ([`is_flow_matching`]);
[`NoiseLevels`] reads them off a scheduler and converts a model output to `(eps, x0)` and back.
"""

import inspect

import torch

from ..utils import check_finite


X0_PREDICTION_TYPES = ("epsilon", "v_prediction", "sample", "flow")
# the types a noise estimate is read from without a division (from a clean-sample prediction it needs `noise > 0`)
EPSILON_PREDICTION_TYPES = ("epsilon", "v_prediction")
PREDICTION_TYPES = X0_PREDICTION_TYPES


def check_callback_tensor_inputs(pipeline, names) -> None:
    """Raise a `ValueError` unless `names` (`callback_on_step_end_tensor_inputs`, or None) is a subset of the
    pipeline's `_callback_tensor_inputs`."""
    if names is not None and not set(names) <= set(pipeline._callback_tensor_inputs):
        raise ValueError(
            f"`callback_on_step_end_tensor_inputs` must be a subset of {pipeline._callback_tensor_inputs}, got "
            f"{names!r}."
        )


def check_generator(generator, batch_size: int, batch: str = "`batch_size`") -> None:
    """Raise unless `generator` is None, one `torch.Generator`, or, as diffusers' pipelines take it, a list of
    `batch_size` of them (sample `b` then draws from `generator[b]` alone, so a batch row equals its single run):
    a `TypeError` for anything else, a `ValueError` naming `batch` (the argument that sets the batch, as the
    message should say it) when the list's length differs."""
    if generator is None or isinstance(generator, torch.Generator):
        return
    if not isinstance(generator, list) or not all(isinstance(g, torch.Generator) for g in generator):
        raise TypeError(
            f"`generator` must be a torch.Generator, a list of {batch_size} (one per sample) or None, got "
            f"{type(generator).__name__}" + (" holding non-generators." if isinstance(generator, list) else ".")
        )
    if len(generator) != batch_size:
        raise ValueError(
            f"`generator` is a list of {len(generator)} generators, but {batch} makes a batch of {batch_size}; "
            "give one generator per sample, or a single one."
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
    expected = "a finite number >= 0 (0: deterministic DDIM, 1: DDPM-like)"
    check_finite("eta", eta, minimum=0, scalar=True, expected=expected)


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


def prediction_to_epsilon(
    model_output: torch.Tensor,
    sample: torch.Tensor,
    signal,
    noise,
    prediction_type: str,
    supported: tuple[str, ...] = EPSILON_PREDICTION_TYPES,
):
    """The noise estimate `e` from a denoiser output, for a noisy sample `x_t = signal * x_0 + noise * e` (see
    [`prediction_to_x0`]).

    `"epsilon"`: the output; `"v_prediction"`: `signal * v + noise * x_t`; `"sample"` (a clean-sample prediction):
    `(x_t - signal * x_0) / noise`; `"flow"` (the velocity `v = e - x_0`): `x_t + signal * v`. Shapes as in
    [`prediction_to_x0`]; a type outside `supported` (by default the two that need no division) raises a
    `ValueError`.
    """
    if prediction_type not in supported:
        raise ValueError(f"a noise estimate needs `prediction_type` in {supported}, got {prediction_type!r}.")
    if prediction_type == "epsilon":
        return model_output
    if prediction_type == "v_prediction":
        return signal * model_output + noise * sample
    if prediction_type == "sample":
        return (sample - signal * model_output) / noise
    return sample + signal * model_output  # flow: e = x_t + (1 - sigma) v


def epsilon_and_x0_to_prediction(eps: torch.Tensor, x0: torch.Tensor, signal, noise, prediction_type: str):
    """The denoiser output of `prediction_type` that predicts the noise `eps` and the clean sample `x0` (both of
    the sample's shape) at the level `(signal, noise)`: the inverse of [`prediction_to_epsilon`] and
    [`prediction_to_x0`]. `"epsilon"`: `eps`; `"sample"`: `x0`; `"v_prediction"`: `signal * eps - noise * x0`;
    `"flow"`: `eps - x0`."""
    if prediction_type not in PREDICTION_TYPES:
        raise ValueError(f"`prediction_type` must be one of {PREDICTION_TYPES}, got {prediction_type!r}.")
    if prediction_type == "epsilon":
        return eps
    if prediction_type == "sample":
        return x0
    if prediction_type == "v_prediction":
        return signal * eps - noise * x0
    return eps - x0


def ddim_move(sample: torch.Tensor, eps: torch.Tensor, alpha_from, alpha_to) -> torch.Tensor:
    """One deterministic DDIM move (eta = 0) of `sample` from the cumulative alpha `alpha_from` to `alpha_to`, given
    the noise estimate `eps` (of the shape of `sample`; the alphas floats or tensors broadcasting against it):
    `x0 = (x - sqrt(1 - a_from) eps) / sqrt(a_from)`, then `sqrt(a_to) x0 + sqrt(1 - a_to) eps`. Towards less noise
    it is DDIM's sampling step between any two levels (not only `t - T // n`, as `DDIMScheduler.step` takes them),
    towards more noise DDIM inversion's; pure tensor arithmetic, so gradients flow through it."""
    signal, noise = vp_coefficients(alpha_from)
    x0 = prediction_to_x0(eps, sample, signal, noise, "epsilon")
    signal_to, noise_to = vp_coefficients(alpha_to)
    return signal_to * x0 + noise_to * eps


# noise levels --------------------------------------------------------------------------------------------------------


def vp_coefficients(alpha_bar):
    """`(signal, noise) = (sqrt(alpha_bar), sqrt(1 - alpha_bar))`: the scales of `x_0` and `e` in a
    variance-preserving noisy sample, for a cumulative alpha `alpha_bar` (a float, or a tensor of any shape: the
    scales have its shape and dtype)."""
    if isinstance(alpha_bar, torch.Tensor):
        return alpha_bar.sqrt(), (1 - alpha_bar).sqrt()
    return alpha_bar**0.5, (1 - alpha_bar) ** 0.5


def is_flow_matching(scheduler) -> bool:
    """Whether `scheduler` samples a flow-matching path `x_t = (1 - sigma) x_0 + sigma e`: a diffusers `FlowMatch*`
    scheduler by its class hierarchy (a class of its MRO is named `FlowMatch...`, so a renamed subclass of
    `FlowMatchEulerDiscreteScheduler` counts), with `sigmas` and no `alphas_cumprod`."""
    flow_class = any(cls.__name__.startswith("FlowMatch") for cls in type(scheduler).__mro__)
    return flow_class and not hasattr(scheduler, "alphas_cumprod") and hasattr(scheduler, "sigmas")


def scheduler_prediction_type(scheduler) -> str:
    """What `scheduler`'s denoiser predicts: `"flow"` (the velocity `e - x_0`) for flow matching, else the
    scheduler's `config.prediction_type` (`"epsilon"` when it has none)."""
    return "flow" if is_flow_matching(scheduler) else scheduler.config.get("prediction_type", "epsilon")


def _schedule_positions(scheduler, timestep) -> torch.LongTensor:
    """The position in `scheduler.timesteps` of every entry of `timestep` (a number or a tensor, any shape; the
    result has its shape), -1 where it is not there (within 1e-6)."""
    schedule = torch.as_tensor(scheduler.timesteps).detach().cpu().double().reshape(1, -1)
    values = torch.as_tensor(timestep).detach().cpu().double()
    if schedule.numel() == 0:
        return torch.full(values.shape, -1, dtype=torch.long)
    matches = (schedule - values.reshape(-1, 1)).abs() < 1e-6
    positions = torch.where(matches.any(dim=1), matches.int().argmax(dim=1), -1)
    return positions.reshape(values.shape)


def timestep_index(scheduler, timestep) -> int:
    """The index of `timestep` (a number, or a tensor of one element) in `scheduler.timesteps` (its first entry
    within 1e-6); a `ValueError` when it is not there."""
    position = int(_schedule_positions(scheduler, torch.as_tensor(timestep).reshape(-1)[:1])[0])
    if position < 0:
        value = float(torch.as_tensor(timestep).reshape(-1)[0])
        raise ValueError(f"`timestep` {value} is not in `scheduler.timesteps`; call `set_timesteps` first.")
    return position


def alpha_bar_at(alphas_cumprod: torch.Tensor, timestep, device=None, dtype=None) -> torch.Tensor:
    """`alphas_cumprod` at `timestep` (a number or a tensor, any shape; the result has its shape), the timestep
    rounded to the nearest training step and clamped to `[0, T - 1]` (schedulers such as Euler's interpolate
    non-integer timesteps); on `device` in `dtype` (default: those of `alphas_cumprod`)."""
    index = torch.as_tensor(timestep, device=alphas_cumprod.device).float().round().long()
    alpha_bar = alphas_cumprod[index.clamp(0, len(alphas_cumprod) - 1)]
    return alpha_bar.to(device=alpha_bar.device if device is None else device, dtype=dtype or alpha_bar.dtype)


class NoiseLevels:
    """A scheduler's noise levels, `x_t = signal_t x_0 + noise_t e`, and the conversions of its model output.

    DDPM-family schedulers (with `alphas_cumprod`: DDPM, DDIM, PNDM, Euler, DPM-Solver, ...) have
    `signal = sqrt(alpha_bar_t)`, `noise = sqrt(1 - alpha_bar_t)` and the model output of `config.prediction_type`;
    flow-matching ones ([`is_flow_matching`]) have `signal = 1 - sigma_t`, `noise = sigma_t` and the velocity
    `v = e - x_0` (`"flow"`).

    Args:
        scheduler: a diffusers scheduler, either kind (another raises a `TypeError`).
        supported (`tuple[str]`, defaults to all four): the prediction types the caller handles; another raises a
            `ValueError`.

    Attributes:
        kind (`str`): `"vp"` or `"flow"`.
        prediction_type (`str`): `"epsilon"`, `"v_prediction"`, `"sample"` or `"flow"`.
        min_signal, min_noise (`float` or `None`): floors of `signal` and `noise` where [`split`] divides by them
            (`None`: no floor; a subclass may set them, e.g. for levels at pure noise).
    """

    min_signal: float | None = None
    min_noise: float | None = None

    def __init__(self, scheduler, supported: tuple[str, ...] = PREDICTION_TYPES):
        if is_flow_matching(scheduler):
            self.kind = "flow"
        elif hasattr(scheduler, "alphas_cumprod"):
            self.kind = "vp"
        else:
            raise TypeError(
                f"`scheduler` must have `alphas_cumprod` (DDPM/DDIM) or be a FlowMatch scheduler, got "
                f"{type(scheduler).__name__}."
            )
        self.prediction_type = scheduler_prediction_type(scheduler)
        if self.prediction_type not in supported:
            raise ValueError(
                f"`scheduler.config.prediction_type` must be one of {supported}, got {self.prediction_type!r}."
            )
        self.scheduler = scheduler
        self.num_train_timesteps = scheduler.config.num_train_timesteps

    def coefficients(
        self, timestep, batch_size: int | None = None, device=None, dtype=torch.float64, step_index: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`(signal, noise)` of the level at `timestep`.

        Args:
            timestep: a number, a 0-d or an `(N,)` tensor; `None` is the clean end (`signal = 1`, `noise = 0`).
            batch_size (`int`, *optional*): expand the scales to `(batch_size,)`; else they have the shape of
                `timestep`.
            device, dtype: of the scales (default: the CPU, float64).
            step_index (`int`, *optional*): flow matching only, the position of `timestep` in `scheduler.timesteps`
                when the caller knows it (a sampling loop's index); else it is looked up ([`timestep_index`]).

        DDPM family: `alphas_cumprod` at the timestep ([`alpha_bar_at`]) through [`vp_coefficients`]. Flow matching:
        `sigma = scheduler.sigmas[i]` at the timestep's position `i` in `scheduler.timesteps`; a timestep between
        them (a rollout's intermediate level, say) has `sigma = timestep / num_train_timesteps`, the relation
        diffusers' flow-matching schedulers make their timesteps by.
        """
        if timestep is None:
            shape = () if batch_size is None else (batch_size,)
            signal = torch.ones(shape, dtype=dtype, device=device)
            return signal, torch.zeros_like(signal)
        if self.kind == "vp":
            alpha_bar = alpha_bar_at(self.scheduler.alphas_cumprod, timestep, device=device, dtype=dtype)
            signal, noise = vp_coefficients(alpha_bar)
        else:
            values = torch.as_tensor(timestep).detach().cpu()
            if step_index is not None:
                positions = torch.full(values.shape, step_index, dtype=torch.long)
            else:
                positions = _schedule_positions(self.scheduler, values)
            sigmas = torch.as_tensor(self.scheduler.sigmas).detach().cpu()
            on_schedule = sigmas[positions.clamp(min=0)].to(dtype)
            between = (values.to(dtype) / self.num_train_timesteps).clamp(0, 1)
            sigma = torch.where(positions >= 0, on_schedule, between).to(device)
            signal, noise = 1 - sigma, sigma
        if batch_size is not None:
            signal, noise = signal.reshape(-1).expand(batch_size), noise.reshape(-1).expand(batch_size)
        return signal, noise

    def split(
        self, model_output: torch.Tensor, sample: torch.Tensor, signal, noise
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`(eps, x0)` that `model_output` predicts at `sample` (all three of one shape; `signal`, `noise` broadcasting
        against it), by [`prediction_to_epsilon`] and [`prediction_to_x0`]."""
        kind = self.prediction_type
        if kind == "epsilon" and self.min_signal is not None:
            signal = signal.clamp_min(self.min_signal)  # divides only x0 = (x_t - noise * eps) / signal
        if kind == "sample" and self.min_noise is not None:
            noise = noise.clamp_min(self.min_noise)  # divides only eps = (x_t - signal * x0) / noise
        x0 = prediction_to_x0(model_output, sample, signal, noise, kind)
        return prediction_to_epsilon(model_output, sample, signal, noise, kind, PREDICTION_TYPES), x0

    def merge(self, eps: torch.Tensor, x0: torch.Tensor, signal, noise) -> torch.Tensor:
        """The model output that predicts `(eps, x0)`: the inverse of [`split`] ([`epsilon_and_x0_to_prediction`])."""
        return epsilon_and_x0_to_prediction(eps, x0, signal, noise, self.prediction_type)


# prompts -------------------------------------------------------------------------------------------------------------


def encode_text(tokenizer, text_encoder, texts: list[str], device) -> tuple[torch.Tensor, torch.LongTensor]:
    """CLIP-style prompt encoding (diffusers' `StableDiffusionPipeline`): `texts` padded to the tokenizer's
    `model_max_length` and truncated; returns the text encoder's last hidden states `(N, L, D)` and the attention
    mask `(N, L)` (to count each prompt's tokens)."""
    tokens = tokenizer(
        list(texts), padding="max_length", max_length=tokenizer.model_max_length, truncation=True, return_tensors="pt"
    )
    return text_encoder(tokens.input_ids.to(device))[0], tokens.attention_mask
