"""Deterministic DDIM Monte-Carlo samples of a [`ScalarDiffusionSurrogate`] (differentiable; used by the predictive
pipeline and by the trainer's calibration term)."""

import numpy as np
import torch

from ..pipeline_utils import ddim_move, prediction_to_x0, vp_coefficients


def inference_timesteps(scheduler, num_inference_steps: int | None = None, timesteps=None) -> torch.Tensor:
    r"""
    The descending integer timesteps of a DDIM run: `timesteps` if given (checked to be strictly decreasing and in
    `[0, T)`), else the scheduler's after `set_timesteps(num_inference_steps)`.

    With `DDIMScheduler(timestep_spacing="linspace")` these are `round(linspace(T - 1, 0, n))`; the reference code
    truncates instead of rounding, which agrees when `n - 1` divides `T - 1` (10 steps of 100) and differs by at most
    one step otherwise (pass the reference's `timesteps` for exact parity).
    """
    total = scheduler.config.num_train_timesteps
    if timesteps is None:
        scheduler.set_timesteps(num_inference_steps)
        return scheduler.timesteps.to(torch.long)
    values = torch.as_tensor(np.asarray(timesteps), dtype=torch.long).reshape(-1)
    if values.numel() < 1 or (values.numel() > 1 and not bool((values[1:] < values[:-1]).all())):
        raise ValueError(f"`timesteps` must be a non-empty strictly decreasing sequence, got {values.tolist()}.")
    if int(values.min()) < 0 or int(values.max()) >= total:
        raise ValueError(f"`timesteps` must lie in [0, {total}), got {values.tolist()}.")
    return values


def ddim_step(model, alphas_cumprod: torch.Tensor, timesteps: torch.Tensor, i: int, features, y: torch.Tensor):
    r"""
    One deterministic DDIM update at `timesteps[i]` of samples `y` of shape `(S, N)`.

    `y0 = (y - sqrt(1 - abar_t) eps) / sqrt(abar_t)`, then `y <- sqrt(abar_t') y0 + sqrt(1 - abar_t') eps` with `t'`
    the next entry of `timesteps` (`pipeline_utils.ddim_move`); the last step returns `y0`. (diffusers'
    `DDIMScheduler.step` takes the previous timestep as `t - T // n`, which is not the next entry of a "linspace"
    schedule, so the move between the two entries is taken with the scheduler's `alphas_cumprod`.) `features` is
    `model.encode_x(x)` repeated `S` times, `(S N, H)`.
    """
    num_samples, count = y.shape
    alphas_cumprod = alphas_cumprod.to(device=y.device, dtype=y.dtype)
    t = int(timesteps[i])
    flat = y.reshape(-1, 1)
    eps = model(flat, t, x_features=features).sample
    if i + 1 == len(timesteps):
        signal, noise = vp_coefficients(alphas_cumprod[t])
        return prediction_to_x0(eps, flat, signal, noise, "epsilon").reshape(num_samples, count)
    moved = ddim_move(flat, eps, alphas_cumprod[t], alphas_cumprod[int(timesteps[i + 1])])
    return moved.reshape(num_samples, count)


def predictive_samples(
    model, alphas_cumprod: torch.Tensor, timesteps: torch.Tensor, x: torch.Tensor, latents: torch.Tensor
) -> torch.Tensor:
    r"""
    Deterministic DDIM (eta = 0) from `latents` to scores, for every design and sample ([`ddim_step`] at each of
    `timesteps`). Pure tensor operations: gradients flow to the model's parameters and to `x` (SPADE's calibration
    term differentiates through the sampler).

    Args:
        model ([`ScalarDiffusionSurrogate`]): the noise predictor (normalised units).
        alphas_cumprod (`torch.Tensor` of shape `(T,)`).
        timesteps (`torch.Tensor` of shape `(n,)`, long, decreasing).
        x (`torch.Tensor` of shape `(N, D)`): normalised designs.
        latents (`torch.Tensor` of shape `(S, N)`): the initial noise, `S` samples per design.

    Returns:
        `torch.Tensor` of shape `(S, N)`: the samples (normalised units).
    """
    features = model.encode_x(x).repeat(latents.shape[0], 1)
    y = latents
    for i in range(len(timesteps)):
        y = ddim_step(model, alphas_cumprod, timesteps, i, features, y)
    return y
