"""EpiDiffForecastPipeline: probabilistic spatio-temporal forecasts by DDIM, steered towards a mechanistic forecast."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from diffusers import DDIMScheduler, DiffusionPipeline
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.utils import BaseOutput, logging
from diffusers.utils.torch_utils import randn_tensor

from ...models.spatiotemporal_denoiser import SpatioTemporalDenoiser
from ...utils import check_finite, check_positive_int, is_number, public
from ..pipeline_utils import check_callback_tensor_inputs, prediction_to_x0, vp_coefficients
from .mechanistic import uncertainty_to_sigma


logger = logging.get_logger(__name__)

OUTPUT_TYPES = ("pt", "np", "latent")
DEFAULT_QUANTILES = tuple(round(0.05 * k, 2) for k in range(1, 20))
GUIDANCE_CLAMP = 100.0


@public
@dataclass
class EpiDiffForecastOutput(BaseOutput):
    """Output of [`EpiDiffForecastPipeline`] (data units; incidence is clipped at 0).

    Args:
        samples (`torch.Tensor` or `np.ndarray` of shape `(batch, num_samples, nodes, horizon)`): forecast draws.
        mean (`torch.Tensor` or `np.ndarray` of shape `(batch, nodes, horizon)`): their mean (the point forecast).
        quantiles (`torch.Tensor` or `np.ndarray` of shape `(batch, len(quantile_levels), nodes, horizon)`): their
            empirical quantiles at `quantile_levels`.
        quantile_levels (`tuple[float, ...]`): the levels.
    """

    samples: torch.Tensor | np.ndarray
    mean: torch.Tensor | np.ndarray
    quantiles: torch.Tensor | np.ndarray
    quantile_levels: tuple


def _as_tensor(name: str, value, ndim: int) -> torch.Tensor:
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    if not isinstance(value, torch.Tensor) or value.ndim != ndim:
        raise ValueError(
            f"`{name}` must be a tensor or array with {ndim} dimensions, got "
            f"{getattr(value, 'shape', type(value).__name__)}."
        )
    check_finite(name, value)
    return value


@public
class EpiDiffForecastPipeline(DiffusionPipeline):
    r"""
    Forecast a graph signal (incidence per region) with a spatio-temporal diffusion model, optionally steered at every
    DDIM step towards a mechanistic forecast with a per-point strength set by that forecast's uncertainty (EpiDiff).

    At each step the clean window is predicted, `x0 = (x_t - sqrt(1 - a) eps) / sqrt(a)`; on the future positions the
    guidance `g = clamp((mu_mech - x0) / sigma^2, -100, 100)` (in the model's normalised space) shifts the noise
    estimate, `eps <- eps - guidance_scale sqrt(1 - a) g`, and the DDIM update uses the shifted estimate. The shift
    this gives the predicted clean window, `guidance_scale (1 - a) / sqrt(a) g`, is capped at the distance to
    `mu_mech` (a pull never overshoots the mechanistic forecast; the reference only clamps `g`). No gradient flows
    through the network. `sigma` comes from the mechanistic variance by
    [`~diffusers_ext.pipelines.epidiff.mechanistic.uncertainty_to_sigma`] with bounds fitted on training windows
    (`sigma_bounds`), so confident mechanistic points pull harder; without a variance (or with `constant_sigma`) it
    is constant: `(sigma_min + sigma_max) / 2` unless given.

    Parameters:
        denoiser ([`SpatioTemporalDenoiser`]): the noise-prediction network (trained with a `DDPMScheduler`).
        scheduler ([`DDIMScheduler`]): the sampler (`eta = 0`).
    """

    model_cpu_offload_seq = "denoiser"
    _optional_components = []
    _callback_tensor_inputs = ["latents"]

    def __init__(self, denoiser: SpatioTemporalDenoiser, scheduler: DDIMScheduler):
        super().__init__()
        self.register_modules(denoiser=denoiser, scheduler=scheduler)

    @property
    def num_timesteps(self) -> int:
        """DDIM steps of the last call."""
        return self._num_timesteps

    @property
    def guidance_scale(self) -> float:
        """The steering strength, read at every step (a callback may change `_guidance_scale`)."""
        return self._guidance_scale

    @property
    def do_classifier_free_guidance(self) -> bool:
        """Whether the sampling is steered (there is no classifier-free guidance; the name is diffusers')."""
        return self._guided and self._guidance_scale > 0

    @property
    def interrupt(self) -> bool:
        return self._interrupt

    def check_inputs(
        self,
        history,
        adjacency,
        mechanistic_mean,
        mechanistic_var,
        guidance_scale,
        sigma_min,
        sigma_max,
        sigma_bounds,
        constant_sigma,
        tau,
        num_samples,
        num_inference_steps,
        max_timestep_fraction,
        quantile_levels,
        generator,
        latents,
        output_type,
        tensor_inputs,
    ) -> tuple:
        """Validate a call before any model work; returns `(history, adjacency, mean, var)` as tensors."""
        history = _as_tensor("history", history, 3)
        batch, nodes, steps = history.shape
        window = self.denoiser.config.window_length
        if not 1 <= steps < window:
            raise ValueError(
                f"`history` must have 1 .. {window - 1} steps (the model's window is {window}), got {steps}."
            )
        horizon = window - steps
        adjacency = _as_tensor("adjacency", adjacency, 2)
        if tuple(adjacency.shape) != (nodes, nodes):
            raise ValueError(f"`adjacency` must have shape ({nodes}, {nodes}), got {tuple(adjacency.shape)}.")
        future_shape = (batch, nodes, horizon)
        if mechanistic_mean is not None:
            mechanistic_mean = _as_tensor("mechanistic_mean", mechanistic_mean, 3)
            if tuple(mechanistic_mean.shape) != future_shape:
                raise ValueError(
                    f"`mechanistic_mean` must have shape (batch, nodes, horizon) = {future_shape}, got "
                    f"{tuple(mechanistic_mean.shape)}."
                )
        if mechanistic_var is not None:
            if mechanistic_mean is None:
                raise ValueError("`mechanistic_var` was given without `mechanistic_mean`.")
            mechanistic_var = _as_tensor("mechanistic_var", mechanistic_var, 3)
            if tuple(mechanistic_var.shape) != future_shape or (mechanistic_var <= 0).any():
                raise ValueError(
                    f"`mechanistic_var` must be positive with shape {future_shape}, got "
                    f"{tuple(mechanistic_var.shape)}."
                )
            if guidance_scale and sigma_bounds is None and constant_sigma is None:
                raise ValueError(
                    "`sigma_bounds` is required with `mechanistic_var`: fit it on training windows with "
                    "`fit_sigma_bounds` (bounds taken from the windows being forecast would leak)."
                )
        if not is_number(guidance_scale) or guidance_scale < 0:
            raise ValueError(f"`guidance_scale` must be a number >= 0, got {guidance_scale!r}.")
        for name, value in (("sigma_min", sigma_min), ("sigma_max", sigma_max), ("tau", tau)):
            if not is_number(value) or value <= 0:
                raise ValueError(f"`{name}` must be a positive number, got {value!r}.")
        if sigma_max < sigma_min:
            raise ValueError(f"`sigma_max` ({sigma_max}) must be >= `sigma_min` ({sigma_min}).")
        if sigma_bounds is not None and (
            len(sigma_bounds) != 2
            or not all(is_number(b) for b in sigma_bounds)
            or not sigma_bounds[1] > sigma_bounds[0]
        ):
            raise ValueError(
                f"`sigma_bounds` must be (low, high) of log-variance with low < high, got {sigma_bounds!r}."
            )
        if constant_sigma is not None and (not is_number(constant_sigma) or constant_sigma <= 0):
            raise ValueError(f"`constant_sigma` must be a positive number or None, got {constant_sigma!r}.")
        check_positive_int("num_samples", num_samples)
        check_positive_int("num_inference_steps", num_inference_steps)
        if not is_number(max_timestep_fraction) or not 0 < max_timestep_fraction <= 1:
            raise ValueError(f"`max_timestep_fraction` must lie in (0, 1], got {max_timestep_fraction!r}.")
        if (
            not isinstance(quantile_levels, Sequence)
            or not quantile_levels
            or not all(is_number(q) and 0 < q < 1 for q in quantile_levels)
        ):
            raise ValueError(
                f"`quantile_levels` must be a non-empty sequence of levels in (0, 1), got {quantile_levels!r}."
            )
        if isinstance(generator, list) and len(generator) != batch:
            raise ValueError(f"`generator` is a list of {len(generator)}, but `history` holds {batch} windows.")
        shape = (batch, num_samples, nodes, window)
        if latents is not None and (
            not isinstance(latents, torch.Tensor) or not latents.is_floating_point() or tuple(latents.shape) != shape
        ):
            raise ValueError(
                f"`latents` must be a float tensor of shape (batch, num_samples, nodes, window) = {shape}, got "
                f"{getattr(latents, 'shape', type(latents).__name__)}."
            )
        if latents is not None:
            check_finite("latents", latents)
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"`output_type` must be one of {OUTPUT_TYPES}, got {output_type!r}.")
        check_callback_tensor_inputs(self, tensor_inputs)
        return history, adjacency, mechanistic_mean, mechanistic_var

    def _timesteps(self, num_inference_steps: int, max_timestep_fraction: float, device) -> torch.Tensor:
        """The DDIM timesteps; with `max_timestep_fraction < 1` the scheduler is set for proportionally more steps
        and only those below `fraction * num_train_timesteps` are run (DiffSTG starts at 0.8, i.e. t = 160 of 200)."""
        if max_timestep_fraction >= 1:
            self.scheduler.set_timesteps(num_inference_steps, device=device)
            return self.scheduler.timesteps
        total = max(num_inference_steps, int(round(num_inference_steps / max_timestep_fraction)))
        self.scheduler.set_timesteps(total, device=device)
        limit = max_timestep_fraction * self.scheduler.config.num_train_timesteps
        return self.scheduler.timesteps[self.scheduler.timesteps < limit]

    @torch.no_grad()
    def __call__(
        self,
        history: torch.Tensor | np.ndarray,
        adjacency: torch.Tensor | np.ndarray,
        mechanistic_mean: torch.Tensor | np.ndarray | None = None,
        mechanistic_var: torch.Tensor | np.ndarray | None = None,
        guidance_scale: float = 0.0,
        sigma_min: float = 0.15,
        sigma_max: float = 2.5,
        sigma_bounds: tuple[float, float] | None = None,
        constant_sigma: float | None = None,
        tau: float = 1.0,
        num_samples: int = 4,
        num_inference_steps: int = 40,
        max_timestep_fraction: float = 1.0,
        quantile_levels: Sequence[float] = DEFAULT_QUANTILES,
        generator: torch.Generator | list[torch.Generator] | None = None,
        latents: torch.Tensor | None = None,
        output_type: str = "pt",
        return_dict: bool = True,
        callback_on_step_end: Callable | PipelineCallback | MultiPipelineCallbacks | None = None,
        callback_on_step_end_tensor_inputs: list[str] | None = None,
    ) -> EpiDiffForecastOutput | tuple:
        r"""
        Forecast the `horizon = window_length - T_h` steps after each history window.

        Args:
            history (`torch.Tensor` or `np.ndarray` of shape `(batch, nodes, T_h)`): observed values, data units.
            adjacency (`torch.Tensor` or `np.ndarray` of shape `(nodes, nodes)`): the graph.
            mechanistic_mean (of shape `(batch, nodes, horizon)`, *optional*): the mechanistic forecast (data units);
                needed for guidance.
            mechanistic_var (of shape `(batch, nodes, horizon)`, *optional*): its variance `u` (data units).
            guidance_scale (`float`, defaults to 0): the steering strength `s`; 0 (or no `mechanistic_mean`) samples
                the unguided forecaster.
            sigma_min (`float`, defaults to 0.15), sigma_max (`float`, defaults to 2.5): the range of `sigma`.
            sigma_bounds (`tuple`, *optional*): `(low, high)` of `log u` from training windows
                ([`~diffusers_ext.pipelines.epidiff.mechanistic.fit_sigma_bounds`]); required with `mechanistic_var`.
            constant_sigma (`float`, *optional*): one `sigma` for every point (the "without uncertainty" steering).
            tau (`float`, defaults to 1): a common factor of `sigma`.
            num_samples (`int`, defaults to 4): draws per window.
            num_inference_steps (`int`, defaults to 40): DDIM steps.
            max_timestep_fraction (`float`, defaults to 1): start below this fraction of the training timesteps
                (0.8 reproduces DiffSTG).
            quantile_levels (`Sequence[float]`, defaults to 0.05 .. 0.95): the returned quantiles.
            generator (`torch.Generator` or a list of `batch`, *optional*): draws the noise; with a list, window `b`
                depends on `generator[b]` only.
            latents (`torch.Tensor` of shape `(batch, num_samples, nodes, window_length)`, *optional*): the initial
                noise.
            output_type (`str`, defaults to `"pt"`): `"pt"`, `"np"` or `"latent"` (tensors in the model's
                standardised space, not clipped).
            return_dict (`bool`, defaults to `True`): return an [`EpiDiffForecastOutput`] or a tuple.
            callback_on_step_end (`Callable`, *optional*): `callback(pipe, step, timestep, callback_kwargs)` after every
                step; it may return new `latents` (shape `(batch * num_samples, nodes, window_length)`).
            callback_on_step_end_tensor_inputs (`list[str]`, *optional*): names among `_callback_tensor_inputs`.

        Returns:
            [`EpiDiffForecastOutput`] or `(samples, mean, quantiles, quantile_levels)`.
        """
        if isinstance(callback_on_step_end, (PipelineCallback, MultiPipelineCallbacks)):
            callback_on_step_end_tensor_inputs = callback_on_step_end.tensor_inputs
        if callback_on_step_end_tensor_inputs is None:
            callback_on_step_end_tensor_inputs = ["latents"]
        history, adjacency, mechanistic_mean, mechanistic_var = self.check_inputs(
            history,
            adjacency,
            mechanistic_mean,
            mechanistic_var,
            guidance_scale,
            sigma_min,
            sigma_max,
            sigma_bounds,
            constant_sigma,
            tau,
            num_samples,
            num_inference_steps,
            max_timestep_fraction,
            quantile_levels,
            generator,
            latents,
            output_type,
            callback_on_step_end_tensor_inputs,
        )
        device, dtype = self._execution_device, self.denoiser.dtype
        batch, nodes, steps = history.shape
        window = self.denoiser.config.window_length
        horizon = window - steps
        shape = (batch, num_samples, nodes, window)
        if latents is None:
            if isinstance(generator, list):
                latents = torch.cat(
                    [randn_tensor((1,) + shape[1:], generator=g, device=device, dtype=dtype) for g in generator]
                )
            else:
                latents = randn_tensor(shape, generator=generator, device=device, dtype=dtype)
        latents = latents.to(device=device, dtype=dtype).reshape(batch * num_samples, nodes, window)

        observed = self.denoiser.normalize(history.to(device=device, dtype=torch.float64)).to(dtype)
        condition = torch.zeros(batch, nodes, window, device=device, dtype=dtype)
        condition[..., :steps] = observed
        condition = condition.repeat_interleave(num_samples, 0)
        mask = torch.zeros(window, device=device, dtype=dtype)
        mask[:steps] = 1
        adjacency = adjacency.to(device=device, dtype=dtype)

        self._guidance_scale = float(guidance_scale)
        self._guided = mechanistic_mean is not None
        self._interrupt = False
        if self._guided:
            target = self.denoiser.normalize(mechanistic_mean.to(device=device, dtype=torch.float64))
            if constant_sigma is not None or mechanistic_var is None:
                value = constant_sigma if constant_sigma is not None else (sigma_min + sigma_max) / 2
                sigma = torch.full_like(target, float(value))
            else:
                sigma = torch.from_numpy(
                    uncertainty_to_sigma(
                        mechanistic_var.double().cpu().numpy(), sigma_bounds, sigma_min, sigma_max, tau
                    )
                ).to(device)
            target = target.to(dtype).repeat_interleave(num_samples, 0)
            precision = sigma.pow(-2).to(dtype).repeat_interleave(num_samples, 0)

        timesteps = self._timesteps(num_inference_steps, max_timestep_fraction, device)
        self._num_timesteps = len(timesteps)
        alphas = self.scheduler.alphas_cumprod.to(device=device, dtype=torch.float64)
        with self.progress_bar(total=len(timesteps)) as progress_bar:
            for i, t in enumerate(timesteps):
                if self.interrupt:
                    break
                eps = self.denoiser(latents, t, condition, mask, adjacency).sample
                if self.do_classifier_free_guidance:
                    signal, noise = (float(c) for c in vp_coefficients(alphas[int(t)]))
                    x0 = prediction_to_x0(eps, latents, signal, noise, "epsilon")
                    gap = target - x0[..., steps:]
                    g = (gap * precision).clamp(-GUIDANCE_CLAMP, GUIDANCE_CLAMP)
                    # the shift of x0 is guidance_scale (1 - a) / sqrt(a) g; it never carries x0 past mu_mech
                    shift = self._guidance_scale * noise**2 / signal * g
                    shift = torch.minimum(shift.abs(), gap.abs()) * gap.sign()
                    eps = eps.clone()
                    eps[..., steps:] = eps[..., steps:] - shift * signal / noise
                latents = self.scheduler.step(eps, t, latents, eta=0.0, return_dict=False)[0]
                if callback_on_step_end is not None:
                    local_vars = {"latents": latents}
                    outputs = (
                        callback_on_step_end(
                            self, i, t, {k: local_vars[k] for k in callback_on_step_end_tensor_inputs}
                        )
                        or {}
                    )
                    latents = outputs.pop("latents", latents)
                progress_bar.update()
        self.maybe_free_model_hooks()

        if output_type == "latent":
            future = latents[..., steps:].double()
        else:
            future = self.denoiser.denormalize(latents[..., steps:].double()).clamp(min=0)
        samples = future.reshape(batch, num_samples, nodes, horizon)
        levels = tuple(float(q) for q in quantile_levels)
        quantiles = torch.quantile(samples, torch.tensor(levels, dtype=samples.dtype, device=samples.device), dim=1)
        samples, mean, quantiles = samples.to(dtype), samples.mean(1).to(dtype), quantiles.transpose(0, 1).to(dtype)
        if output_type == "np":
            samples, mean, quantiles = (x.cpu().float().numpy() for x in (samples, mean, quantiles))
        if not return_dict:
            return (samples, mean, quantiles, levels)
        return EpiDiffForecastOutput(samples=samples, mean=mean, quantiles=quantiles, quantile_levels=levels)
