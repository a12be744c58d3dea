r"""Differentiable K-step inversion and reconstruction of a rectified flow (SD3, Flux) by its Euler ODE steps.

A rectified flow samples by Euler steps of its ODE from noise level `s = 1` down to 0 (diffusers'
`FlowMatchEulerDiscreteScheduler.step`): `z_k = z_{k+1} + (s_k - s_{k+1}) v(z_{k+1}, s_{k+1})`. The inversion takes the
same steps upward with the velocity at the *noisier* level evaluated at the current point,

    z_{k+1} = z_k + (s_{k+1} - s_k) v(z_k, s_{k+1}),

the flow-matching counterpart of DDIM inversion (`ddim_inversion.py`): with the same velocity estimates on the way up
and down, reconstruction undoes inversion exactly (to floating point), so the round trip's error measures only how
far the model's velocity moves between `z_k` and `z_{k+1}` at the same level, which is what DIRP minimises. (Solving
the implicit inversion step exactly, as exact-inversion samplers do, would make the round trip the identity for every
image, and DIRP's objective zero.) The noise levels are the pipeline's own scheduler's (`set_timesteps`, with Flux's
resolution-dependent shift), so inversion runs on the grid the model samples on.
"""

from collections.abc import Callable

import numpy as np
import torch

from .ddim_inversion import checkpointed


VelocityFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""`velocity_fn(z, sigma) -> v`: the model's velocity for `z` of shape `(B, C, H, W)` at noise level `sigma` (0-d)."""


def flow_inversion_sigmas(
    scheduler,
    num_inversion_steps: int,
    strength: float = 1.0,
    image_seq_len: int | None = None,
    flux_levels: bool = False,
) -> torch.Tensor:
    r"""
    The noise levels of a `num_inversion_steps`-step inversion up to `strength` of the flow, from the scheduler.

    A copy of `scheduler` is set to `N = round(K / strength)` steps as the model's text-to-image pipeline sets it
    (`StableDiffusion3Pipeline`: `set_timesteps(N)`; `FluxPipeline`: levels `linspace(1, 1/N, N)` shifted by the
    `mu` of `image_seq_len`), and its last `K` levels are kept (as diffusers' image-to-image pipelines do for their
    `strength`): `strength=1` inverts to pure noise (`s = 1`) on exactly the levels the pipeline samples with.

    Args:
        scheduler: a `FlowMatchEulerDiscreteScheduler` (its configuration: `shift`, dynamic shifting).
        num_inversion_steps (`int`): `K >= 1`.
        strength (`float`, defaults to 1.0): in (0, 1].
        image_seq_len (`int`, *optional*): image tokens of the transformer (a dynamic shift depends on it).
        flux_levels (`bool`, defaults to False): start from FluxPipeline's levels `linspace(1, 1/N, N)` rather than
            the scheduler's own spacing (`StableDiffusion3Pipeline`).

    Returns:
        `torch.Tensor` of shape `(K + 1,)`, float64, ascending: `[0, s_1, ..., s_K]`.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler

    schedule = FlowMatchEulerDiscreteScheduler.from_config(scheduler.config)
    total = max(num_inversion_steps, round(num_inversion_steps / strength))
    kwargs = {}
    if schedule.config.get("use_dynamic_shifting", False):
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift

        if image_seq_len is None:
            raise ValueError("a dynamically shifted flow schedule (Flux, SD3.5) needs `image_seq_len`.")
        kwargs["mu"] = calculate_shift(
            image_seq_len,
            schedule.config.get("base_image_seq_len", 256),
            schedule.config.get("max_image_seq_len", 4096),
            schedule.config.get("base_shift", 0.5),
            schedule.config.get("max_shift", 1.15),
        )
    if flux_levels:  # FluxPipeline's own levels: evenly spaced from 1 to 1 / N, then shifted by mu
        schedule.set_timesteps(sigmas=np.linspace(1.0, 1.0 / total, total), device="cpu", **kwargs)
    else:
        schedule.set_timesteps(total, device="cpu", **kwargs)
    sigmas = schedule.sigmas.double()  # descending, ending with the terminal 0
    return sigmas[-(num_inversion_steps + 1) :].flip(0)


def flow_invert(
    velocity_fn: VelocityFn, z0: torch.Tensor, sigmas: torch.Tensor, use_checkpoint: bool = False
) -> torch.Tensor:
    """Euler inversion of clean `z0` `(B, C, H, W)` through the levels `sigmas` `(K + 1,)` (from
    [`flow_inversion_sigmas`]); `use_checkpoint` recomputes each model call in the backward pass."""
    z = z0
    for k in range(len(sigmas) - 1):
        sigma = torch.tensor(float(sigmas[k + 1]))
        v = checkpointed(velocity_fn, z, sigma) if use_checkpoint else velocity_fn(z, sigma)
        z = z + float(sigmas[k + 1] - sigmas[k]) * v
    return z


def flow_reconstruct(
    velocity_fn: VelocityFn, zK: torch.Tensor, sigmas: torch.Tensor, use_checkpoint: bool = False
) -> torch.Tensor:
    """Euler sampling of `zK` from `sigmas[-1]` down to 0 (the scheduler's step); the inverse of [`flow_invert`] when
    the velocity estimates agree."""
    z = zK
    for k in range(len(sigmas) - 1, 0, -1):
        sigma = torch.tensor(float(sigmas[k]))
        v = checkpointed(velocity_fn, z, sigma) if use_checkpoint else velocity_fn(z, sigma)
        z = z + float(sigmas[k - 1] - sigmas[k]) * v
    return z


def flow_round_trip(
    velocity_fn: VelocityFn, z0: torch.Tensor, sigmas: torch.Tensor, use_checkpoint: bool = False
) -> torch.Tensor:
    """Invert `z0` with [`flow_invert`] and reconstruct it with [`flow_reconstruct`]: `2K` model calls."""
    return flow_reconstruct(velocity_fn, flow_invert(velocity_fn, z0, sigmas, use_checkpoint), sigmas, use_checkpoint)
