r"""
The forward noising of [`ConstrainedUnlearningTrainer`]: the DDPM process of epsilon-prediction UNets and the
rectified flow of SD3 / Flux transformers.

Both are indexed by an integer training step `t` in `[0, T)`, noisier as `t` grows, so that the objectives draw `t`
uniformly and weight a Monte-Carlo path sum `T * E_t[w_t * ||.||^2]` the same way whatever the model. What differs:

| | noised sample `x_t` | the model predicts | denoising target | path weight `w_t` |
| --- | --- | --- | --- | --- |
| DDPM ([`VPNoiseProcess`]) | `sqrt(a_t) x0 + sqrt(1 - a_t) eps` | the noise `eps` | `eps` | `beta_t / (2 (1 - a_t))` |
| rectified flow ([`FlowMatchingNoiseProcess`]) | `(1 - s_t) x0 + s_t eps` | the velocity `eps - x0` | `eps - x0` | `(1 - s_t) / s_t * ds_t` |

`docs/unlearning.md` derives the flow-matching weight: the KL between two reverse SDEs that share the forward process
`dx = -x / (1 - s) ds + sqrt(2 s / (1 - s)) dW` is `int (1 - s) / s ||v_1 - v_2||^2 ds`.
"""

import torch

from ..pipelines.pipeline_utils import PREDICTION_TYPES, prediction_to_epsilon, vp_coefficients


class VPNoiseProcess:
    r"""
    The DDPM forward process of a DDPM-family scheduler's configuration (`alphas_cumprod`), epsilon prediction.

    Attributes:
        num_train_timesteps (`int`): T.
        path_weights (`torch.Tensor` of shape `(T,)`): the Girsanov / ELBO weight of `||delta eps||^2` per step in
            continuous-time form `beta_t / (2 (1 - a_t))`. The exact discrete weight has an extra `1 / alpha_t` that
            explodes at the capped last step of cosine schedules.
        scheduler: the `DDPMScheduler` built from the configuration.
    """

    flow_matching = False
    prediction = "noise"

    def __init__(self, scheduler_config):
        from diffusers import DDPMScheduler

        self.scheduler = DDPMScheduler.from_config(scheduler_config)
        self.num_train_timesteps = int(self.scheduler.config.num_train_timesteps)
        alphas_cumprod = self.scheduler.alphas_cumprod.to(torch.float64)
        betas = 1.0 - alphas_cumprod / torch.cat([torch.ones(1, dtype=torch.float64), alphas_cumprod[:-1]])
        self.path_weights = (betas / (2.0 * (1.0 - alphas_cumprod))).float()

    def _alpha_bar(self, t: torch.Tensor) -> torch.Tensor:
        return self.scheduler.alphas_cumprod.to(t.device)[t].view(-1, 1, 1, 1)

    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """`x_t` `(B, C, H, W)` from clean `x0` and `noise` of that shape at steps `t` `(B,)`."""
        return self.scheduler.add_noise(x0, noise, t)

    def denoising_target(self, x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """What the model regresses on for `x_t = add_noise(x0, noise, t)`: the noise."""
        return noise

    def noise_between(self, x0: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The noise that takes clean `x0` to `x_t` at steps `t`; `-||.||^2 / 2` is `log q(x_t | x0)` up to a
        constant (SISS's importance weights)."""
        signal, noise = vp_coefficients(self._alpha_bar(t))
        return prediction_to_epsilon(x0, x_t, signal, noise, "sample", PREDICTION_TYPES)

    def model_timestep(self, t: torch.Tensor) -> torch.Tensor:
        """The timestep input of the model at steps `t`: the step itself."""
        return t

    @torch.no_grad()
    def sample(self, predict, noise: torch.Tensor, num_steps: int) -> torch.Tensor:
        """Deterministic DDIM sampling (eta 0) in `num_steps` steps from `noise` `(B, C, H, W)`; `predict(x,
        timestep)` is the model's noise prediction."""
        from diffusers import DDIMScheduler

        scheduler = DDIMScheduler.from_config(self.scheduler.config, clip_sample=False)
        scheduler.set_timesteps(num_steps, device=noise.device)
        x = noise
        for t in scheduler.timesteps:
            x = scheduler.step(predict(x, t), t, x).prev_sample
        return x


class FlowMatchingNoiseProcess:
    r"""
    The rectified flow of a `FlowMatchEulerDiscreteScheduler` configuration (SD3, Flux): `x_t = (1 - s_t) x0 + s_t
    eps`, velocity prediction `eps - x0`.

    The noise levels `s_t` are the scheduler's training sigmas (SD3's `shift` applied; Flux's resolution-dependent
    shift is an inference-time setting and its training sigmas are unshifted, as in diffusers' Flux training
    scripts), ascending in `t`; the model's timestep input is `s_t * T`, as the pipelines pass it.

    Attributes:
        num_train_timesteps (`int`): T.
        sigmas (`torch.Tensor` of shape `(T,)`): `s_t`, ascending, float32.
        path_weights (`torch.Tensor` of shape `(T,)`): `(1 - s_t) / s_t * (s_t - s_{t-1})` (with `s_{-1} = 0`), so
            that `sum_t w_t ||v_1 - v_2||^2` is the Riemann sum of the path KL `int (1 - s) / s ||v_1 - v_2||^2 ds`.
    """

    flow_matching = True
    prediction = "velocity"

    def __init__(self, scheduler_config):
        from diffusers import FlowMatchEulerDiscreteScheduler

        scheduler = FlowMatchEulerDiscreteScheduler.from_config(scheduler_config)
        self.num_train_timesteps = int(scheduler.config.num_train_timesteps)
        sigmas = scheduler.sigmas.to(torch.float64).flip(0)  # the scheduler stores them descending
        if len(sigmas) > self.num_train_timesteps:  # a terminal 0 appended by `set_timesteps`
            sigmas = sigmas[sigmas > 0]
        self.sigmas = sigmas.float()
        spacing = sigmas - torch.cat([torch.zeros(1, dtype=torch.float64), sigmas[:-1]])
        self.path_weights = ((1.0 - sigmas) / sigmas * spacing).float()

    def _sigma(self, t: torch.Tensor) -> torch.Tensor:
        return self.sigmas.to(t.device)[t].view(-1, 1, 1, 1)

    def add_noise(self, x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        sigma = self._sigma(t)
        return (1.0 - sigma) * x0 + sigma * noise

    def denoising_target(self, x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """The velocity `noise - x0` (what SD3 and Flux are trained to predict)."""
        return noise - x0

    def noise_between(self, x0: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        sigma = self._sigma(t)
        return prediction_to_epsilon(x0, x_t, 1.0 - sigma, sigma, "sample", PREDICTION_TYPES)

    def model_timestep(self, t: torch.Tensor) -> torch.Tensor:
        return self.sigmas.to(t.device)[t] * self.num_train_timesteps

    @torch.no_grad()
    def sample(self, predict, noise: torch.Tensor, num_steps: int) -> torch.Tensor:
        """Euler integration of the flow ODE from `s = 1` (`noise`) to 0 over `num_steps` of the training noise
        levels, evenly spaced in index; `predict(x, timestep)` is the model's velocity."""
        index = torch.linspace(self.num_train_timesteps - 1, 0, num_steps).round().long()
        sigmas = torch.cat([self.sigmas[index], torch.zeros(1)]).tolist()
        x = noise
        for k in range(num_steps):
            timestep = torch.full((len(x),), sigmas[k] * self.num_train_timesteps, device=x.device)
            x = x + (sigmas[k + 1] - sigmas[k]) * predict(x, timestep)
        return x
