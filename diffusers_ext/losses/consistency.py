"""Easy consistency training (ECT): the noise-level pairs, the consistency function and the per-sample losses.

The consistency function uses exactly the parameterisation of diffusers' `CMStochasticIterativeScheduler`
(boundary-condition `c_skip`/`c_out`, input scaling `1 / sqrt(sigma^2 + sigma_data^2)`, timestep
`250 * log(sigma)`), so a `UNet2DModel` trained with it samples with diffusers' `ConsistencyModelPipeline`.
"""

import math
from dataclasses import dataclass

import torch
from torch import nn

from .manifold_feature_distance import normalized_distance_gradient


LOSS_TYPES = ("pseudo_huber", "l2", "normalized_gradient")


@dataclass(frozen=True)
class EasyConsistencySchedule:
    r"""
    The ECT curriculum of noise-level pairs `(t, r)`, `r < t`, for consistency training.

    `t` is log-normal, `log t ~ N(p_mean, p_std^2)`, clipped to `[2 sigma_min, sigma_max]`; then

        r = max(t * (1 - n(t) / q^(stage + stage_offset)), 0),   n(t) = 1 + k * sigmoid(-b * t),

    with `stage = floor(step / (total_steps / num_stages))`: the gap `t - r` shrinks by a factor `q` per stage. With
    `stage_offset=0` the first stage has `r = 0` everywhere (`n(t) >= 1`), i.e. it is denoising (diffusion)
    pretraining, which is how ECT trains from scratch; a pretrained start may skip it with `stage_offset >= 1`. An
    `r` below `sigma_min` is set to 0, where the consistency function is the identity and the target is the clean
    image.

    Args:
        total_steps (`int`): optimizer steps of the whole run.
        num_stages (`int`, defaults to 4): number of stages.
        q (`float`, defaults to 2.0): gap shrink factor per stage.
        k (`float`, defaults to 8.0), b (`float`, defaults to 1.0): the adjustment `n(t)` (larger gaps at low noise).
        stage_offset (`int`, defaults to 0): added to the stage in the exponent.
        p_mean (`float`, defaults to -1.1), p_std (`float`, defaults to 2.0): the log-normal of `t`.
        sigma_min (`float`, defaults to 0.002), sigma_max (`float`, defaults to 80.0): the noise range (the same
            values as the sampling scheduler's config).
    """

    total_steps: int
    num_stages: int = 4
    q: float = 2.0
    k: float = 8.0
    b: float = 1.0
    stage_offset: int = 0
    p_mean: float = -1.1
    p_std: float = 2.0
    sigma_min: float = 0.002
    sigma_max: float = 80.0

    def __post_init__(self):
        if self.total_steps < 1:
            raise ValueError(f"`total_steps` must be >= 1, got {self.total_steps}.")
        if not 1 <= self.num_stages <= self.total_steps:
            raise ValueError(f"`num_stages` must lie in [1, total_steps={self.total_steps}], got {self.num_stages}.")
        if self.q <= 1:
            raise ValueError(f"`q` must be > 1, got {self.q}.")
        if self.k < 0 or self.stage_offset < 0 or self.p_std <= 0:
            raise ValueError(
                f"expected k >= 0, stage_offset >= 0 and p_std > 0; got k={self.k}, stage_offset={self.stage_offset}, "
                f"p_std={self.p_std}."
            )
        if not 0 < self.sigma_min < self.sigma_max:
            raise ValueError(f"expected 0 < sigma_min < sigma_max, got {self.sigma_min} and {self.sigma_max}.")

    def stage(self, step: int) -> int:
        """The curriculum stage of optimizer step `step` (0-based)."""
        return min(int(step * self.num_stages // self.total_steps), self.num_stages - 1)

    def r_from_t(self, t: torch.Tensor, step: int) -> torch.Tensor:
        """The smaller noise level `r` paired with `t` (same shape) at optimizer step `step`."""
        adjustment = 1 + self.k * torch.sigmoid(-self.b * t)
        r = t * (1 - adjustment / self.q ** (self.stage(step) + self.stage_offset))
        r = r.clamp(min=0)
        return torch.where(r < self.sigma_min, torch.zeros_like(r), r)

    def sample(self, batch_size: int, step: int, generator: torch.Generator | None = None):
        """Draw `batch_size` pairs; return `(t, r)`, each of shape `(batch_size,)` (float32, CPU)."""
        log_t = torch.randn(batch_size, generator=generator) * self.p_std + self.p_mean
        t = log_t.exp().clamp(min=2 * self.sigma_min, max=self.sigma_max)
        return t, self.r_from_t(t, step)


def consistency_model_output(
    unet: nn.Module,
    sample: torch.Tensor,
    sigma: torch.Tensor,
    class_labels: torch.Tensor | None = None,
    sigma_data: float = 0.5,
    sigma_min: float = 0.002,
) -> torch.Tensor:
    r"""
    The consistency function `f(x, sigma) = c_skip(sigma) x + c_out(sigma) F(c_in(sigma) x, 250 log sigma)`, as
    `CMStochasticIterativeScheduler.step` computes it (without its final clipping).

    Args:
        unet (`torch.nn.Module`): a diffusers `UNet2DModel`-like model called as `unet(x, timestep,
            class_labels=...)`.
        sample (`torch.Tensor` of shape `(batch_size, C, H, W)`): noisy images `x + sigma * noise`.
        sigma (`torch.Tensor` of shape `(batch_size,)`): their noise levels (> 0).
        class_labels (`torch.Tensor` of shape `(batch_size,)`, *optional*): for class-conditional models.
        sigma_data (`float`, defaults to 0.5), sigma_min (`float`, defaults to 0.002): the scheduler's values.

    Returns:
        `torch.Tensor` of the shape of `sample`: the estimate of the clean image.
    """
    # the preconditioning is computed in float32 for half-precision models and in float64 for a float64 one
    dtype = torch.promote_types(sample.dtype, torch.float32)
    sigma = sigma.to(device=sample.device, dtype=dtype)
    s = sigma[:, None, None, None]
    c_skip = sigma_data**2 / ((s - sigma_min) ** 2 + sigma_data**2)
    c_out = (s - sigma_min) * sigma_data / (s**2 + sigma_data**2).sqrt()
    c_in = 1 / (s**2 + sigma_data**2).sqrt()
    timestep = 250.0 * torch.log(sigma + 1e-44)
    output = unet((c_in * sample).to(sample.dtype), timestep, class_labels=class_labels).sample
    return c_skip * sample + c_out * output.to(dtype)


def pseudo_huber_constant(sample_shape: tuple[int, ...]) -> float:
    """The pseudo-Huber constant of improved consistency training, `0.00054 * sqrt(C * H * W)`."""
    return 0.00054 * math.sqrt(math.prod(sample_shape))


def consistency_training_loss(
    prediction: torch.Tensor,
    target: torch.Tensor,
    t: torch.Tensor,
    r: torch.Tensor,
    loss_type: str = "pseudo_huber",
    distance: nn.Module | None = None,
    huber_c: float | None = None,
) -> torch.Tensor:
    r"""
    The per-sample consistency-training loss `w(t, r) * L(f(x_t, t), sg(f(x_r, r)))` with `w = 1 / (t - r)`.

    - `"l2"`: `L = ||Δ||^2`.
    - `"pseudo_huber"`: `L = sqrt(||Δ||^2 + c^2) - c`, `c = huber_c` (default `0.00054 sqrt(dim)`).
    - `"normalized_gradient"`: AYT's update with the image distance `distance` (e.g. a
      [`ManifoldFeatureDistance`]): with `g` the unit-normalised per-sample gradient of
      `distance(prediction, target)` at `prediction`, `L = 1/2 ||prediction - sg(prediction - g)||^2`, whose
      gradient with respect to `prediction` is exactly `g`.

    Args:
        prediction (`torch.Tensor` of shape `(batch_size, C, H, W)`): `f(x + t noise, t)`, with gradients.
        target (`torch.Tensor` of the same shape): `f(x + r noise, r)` (or `x` where `r = 0`); detached here.
        t, r (`torch.Tensor` of shape `(batch_size,)`): the noise levels, `r < t`.
        loss_type (`str`, defaults to `"pseudo_huber"`): one of `"pseudo_huber"`, `"l2"`, `"normalized_gradient"`.
        distance (`torch.nn.Module`, *optional*): per-sample image distance; required by `"normalized_gradient"`.
        huber_c (`float`, *optional*): the pseudo-Huber constant.

    Returns:
        `torch.Tensor` of shape `(batch_size,)`: the weighted loss of each sample (average it for the update).
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"`loss_type` must be one of {LOSS_TYPES}, got {loss_type!r}.")
    if prediction.shape != target.shape:
        raise ValueError(f"`prediction` {tuple(prediction.shape)} and `target` {tuple(target.shape)} differ in shape.")
    if loss_type == "normalized_gradient" and distance is None:
        raise ValueError("`loss_type='normalized_gradient'` needs a `distance` module.")
    weight = 1.0 / (t - r).to(device=prediction.device, dtype=torch.float32)
    target = target.detach().float()
    prediction = prediction.float()
    if loss_type == "normalized_gradient":
        direction = normalized_distance_gradient(distance, prediction, target)
        per_sample = 0.5 * (prediction - (prediction - direction).detach()).square().flatten(1).sum(dim=1)
    else:
        squared = (prediction - target).square().flatten(1).sum(dim=1)
        if loss_type == "l2":
            per_sample = squared
        else:
            c = pseudo_huber_constant(tuple(prediction.shape[1:])) if huber_c is None else huber_c
            per_sample = (squared + c**2).sqrt() - c
    return weight * per_sample
