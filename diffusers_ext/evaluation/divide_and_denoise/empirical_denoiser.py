"""[`EmpiricalOptimalDenoiser`]: the exact denoiser of a finite set of templates, an "expert" with known behaviour.

Sampling with it can only ever produce its own templates, so a composition benchmark knows what each expert wants
(`diffusers_ext.evaluation.divide_and_denoise.composition` builds the disc experts from it). It is called like a
`UNet2DModel` and saves like one, so a [`MultiDenoiserModel`] can hold it.
"""

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from diffusers.models.unets.unet_2d import UNet2DOutput

from ...pipelines.divide_and_denoise.denoisers import alpha_bar_at, as_pair, schedule_alphas_cumprod
from ...pipelines.pipeline_utils import PREDICTION_TYPES, prediction_to_epsilon, vp_coefficients


class EmpiricalOptimalDenoiser(ModelMixin, ConfigMixin):
    r"""
    The exact minimum-mean-squared-error denoiser of a finite set of templates (an analytic "expert").

    For a noisy sample `x_t = sqrt(a) x_0 + sqrt(1 - a) eps` with `x_0` uniform over the templates, the posterior mean
    is `E[x_0 | x_t] = sum_k softmax_k(-|x_t - sqrt(a) x_k|^2 / (2 (1 - a))) x_k`; the model returns the matching
    noise prediction `(x_t - sqrt(a) E[x_0 | x_t]) / sqrt(1 - a)`. Sampling with it can only ever produce (up to the
    sampler's error) one of its templates.

    Args:
        templates (`torch.Tensor` of shape `(num_templates, channels, height, width)`, *optional*): the data set;
            zeros of the configured shape when omitted (as when `from_pretrained` builds it before loading weights).
        num_templates, in_channels, sample_size: the shape of the template set (taken from `templates` when given).
        num_train_timesteps, beta_start, beta_end, beta_schedule: the noise schedule (as in `DDPMScheduler`); it must
            match the scheduler used for sampling.
    """

    @register_to_config
    def __init__(
        self,
        num_templates: int = 1,
        in_channels: int = 1,
        sample_size: int | tuple[int, int] = 8,
        num_train_timesteps: int = 1000,
        beta_start: float = 0.0001,
        beta_end: float = 0.02,
        beta_schedule: str = "linear",
        templates: torch.Tensor | None = None,
    ):
        super().__init__()
        height, width = as_pair(sample_size, "sample_size")
        if templates is None:
            templates = torch.zeros(num_templates, in_channels, height, width)
        elif tuple(templates.shape) != (num_templates, in_channels, height, width):
            raise ValueError(
                f"`templates` has shape {tuple(templates.shape)}; expected (num_templates, in_channels, height, width) "
                f"= {(num_templates, in_channels, height, width)}."
            )
        self.register_buffer("templates", templates.detach().clone().float())
        self.register_buffer(
            "alphas_cumprod",
            schedule_alphas_cumprod(num_train_timesteps, beta_start, beta_end, beta_schedule),
            persistent=False,
        )

    @classmethod
    def from_templates(cls, templates: torch.Tensor, **schedule) -> "EmpiricalOptimalDenoiser":
        """Build from a `(num_templates, channels, height, width)` tensor; `schedule` as in the constructor."""
        if not isinstance(templates, torch.Tensor) or templates.ndim != 4:
            raise ValueError(f"`templates` must be a 4-D tensor, got {getattr(templates, 'shape', templates)!r}.")
        num, channels, height, width = templates.shape
        return cls(num, channels, (height, width), templates=templates, **schedule)

    def register_to_config(self, **kwargs):
        kwargs.pop("templates", None)  # weights, not configuration
        super().register_to_config(**kwargs)

    def posterior_mean(self, sample: torch.Tensor, timestep) -> torch.Tensor:
        """`E[x_0 | x_t = sample]`, shape of `sample`."""
        batch = sample.shape[0]
        alpha_bar = alpha_bar_at(self.alphas_cumprod, timestep, batch, sample)
        templates = self.templates.to(sample.dtype)
        diff = sample.unsqueeze(1) - alpha_bar.sqrt().unsqueeze(1) * templates.unsqueeze(0)
        logits = -diff.pow(2).flatten(2).sum(dim=2) / (2 * (1 - alpha_bar.view(batch, 1)))
        weights = torch.softmax(logits, dim=1)
        return torch.einsum("bk,kchw->bchw", weights, templates)

    def forward(self, sample: torch.Tensor, timestep, class_labels=None, return_dict: bool = True):
        batch = sample.shape[0]
        signal, noise = vp_coefficients(alpha_bar_at(self.alphas_cumprod, timestep, batch, sample))
        x0 = self.posterior_mean(sample, timestep)
        eps = prediction_to_epsilon(x0, sample, signal, noise, "sample", PREDICTION_TYPES)
        return UNet2DOutput(sample=eps) if return_dict else (eps,)
