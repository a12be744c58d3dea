"""Stochastic (SDE) sampling for flow-matching models, with the Gaussian log-probability of every step.

Policy-gradient training of flow models (Flow-GRPO and descendants) needs a stochastic sampler whose transition
density is known: the deterministic Euler step of [`FlowMatchEulerDiscreteScheduler`] is replaced by a Gaussian
transition with the same marginals, and `step` also returns the transition mean and the log-probability of the
sample it drew.
"""

import math
from dataclasses import dataclass
from typing import Literal

import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.configuration_utils import register_to_config
from diffusers.utils import BaseOutput
from diffusers.utils.torch_utils import randn_tensor

from ..utils import public
from .compatibility import CompatiblesMixin


SDE_TYPES = ("sde", "cps")


@public
@dataclass
class FlowMatchSDESchedulerOutput(BaseOutput):
    """
    Output of [`FlowMatchSDEScheduler.step`].

    Args:
        prev_sample (`torch.Tensor` of shape `(batch_size, ...)`): the sample at the next (less noisy) timestep.
        log_prob (`torch.Tensor` of shape `(batch_size,)` or `None`): log-density of `prev_sample` under the step's
            Gaussian transition, averaged over all non-batch dimensions; `None` for a deterministic (ODE) step.
        prev_sample_mean (`torch.Tensor` of shape `(batch_size, ...)`): the transition mean.
        std_dev (`torch.Tensor` of shape `(batch_size,)`): the transition's standard deviation (0 for an ODE step).
    """

    prev_sample: torch.Tensor
    log_prob: torch.Tensor | None
    prev_sample_mean: torch.Tensor
    std_dev: torch.Tensor


@public
class FlowMatchSDEScheduler(CompatiblesMixin, FlowMatchEulerDiscreteScheduler):
    r"""
    A flow-matching scheduler that samples with a stochastic differential equation and reports log-probabilities.

    It takes every [`FlowMatchEulerDiscreteScheduler`] configuration (timesteps, shifting and sigmas are the same;
    `FlowMatchSDEScheduler.from_config(pipe.scheduler.config)` swaps it into an SD3 or Flux pipeline) and adds:

    Parameters:
        noise_level (`float`, defaults to 0.7): the SDE's noise scale `a`. 0 gives the deterministic Euler step.
        sde_type (`str`, defaults to `"sde"`): `"sde"`, the reverse SDE with the probability-flow marginals,
            `sigma_t = a * sqrt(sigma / (1 - sigma))`, transition std `sigma_t * sqrt(sigma - sigma_next)`; or
            `"cps"`, coefficient-preserving sampling, std `sigma_next * sin(a * pi / 2)` and mean
            `(1 - sigma_next) * x0_hat + sqrt(sigma_next^2 - std^2) * x1_hat`.
        sde_window (`tuple[int, int]`, *optional*): step indices `[start, end)` sampled stochastically; steps
            outside it take the deterministic Euler step (their `log_prob` is `None`). `None`: every step.
        **kwargs: the [`FlowMatchEulerDiscreteScheduler`] parameters.

    The log-probability is the exact Gaussian log-density, averaged (not summed) over the non-batch dimensions so
    that its scale does not depend on the resolution.
    """

    _compatibles = ["FlowMatchEulerDiscreteScheduler"]
    order = 1

    @register_to_config
    def __init__(
        self,
        num_train_timesteps: int = 1000,
        shift: float = 1.0,
        use_dynamic_shifting: bool = False,
        base_shift: float | None = 0.5,
        max_shift: float | None = 1.15,
        base_image_seq_len: int = 256,
        max_image_seq_len: int = 4096,
        invert_sigmas: bool = False,
        shift_terminal: float | None = None,
        use_karras_sigmas: bool = False,
        use_exponential_sigmas: bool = False,
        use_beta_sigmas: bool = False,
        time_shift_type: Literal["exponential", "linear"] = "exponential",
        stochastic_sampling: bool = False,
        noise_level: float = 0.7,
        sde_type: str = "sde",
        sde_window: tuple[int, int] | None = None,
    ):
        if sde_type not in SDE_TYPES:
            raise ValueError(f"`sde_type` must be one of {SDE_TYPES}, got {sde_type!r}.")
        if not noise_level >= 0:
            raise ValueError(f"`noise_level` must be >= 0, got {noise_level!r}.")
        if sde_type == "cps" and noise_level > 1:
            raise ValueError(f"`noise_level` must lie in [0, 1] for sde_type='cps', got {noise_level!r}.")
        if sde_window is not None and (len(sde_window) != 2 or not 0 <= sde_window[0] < sde_window[1]):
            raise ValueError(
                f"`sde_window` must be (start, end) step indices with 0 <= start < end, got {sde_window!r}."
            )
        if sde_window is not None:
            # JSON stores tuples as lists: keep the documented tuple in the config after a save/load round trip
            self.register_to_config(sde_window=tuple(int(i) for i in sde_window))
        if stochastic_sampling:
            raise ValueError(
                "`stochastic_sampling` is FlowMatchEulerDiscreteScheduler's own noise; use `noise_level`."
            )
        super().__init__(
            num_train_timesteps=num_train_timesteps,
            shift=shift,
            use_dynamic_shifting=use_dynamic_shifting,
            base_shift=base_shift,
            max_shift=max_shift,
            base_image_seq_len=base_image_seq_len,
            max_image_seq_len=max_image_seq_len,
            invert_sigmas=invert_sigmas,
            shift_terminal=shift_terminal,
            use_karras_sigmas=use_karras_sigmas,
            use_exponential_sigmas=use_exponential_sigmas,
            use_beta_sigmas=use_beta_sigmas,
            time_shift_type=time_shift_type,
            stochastic_sampling=False,
        )

    def is_stochastic_step(self, step_index: int) -> bool:
        """Whether step `step_index` samples from the SDE (inside `sde_window`, with a positive noise level)."""
        window = self.config.sde_window
        inside = window is None or window[0] <= step_index < window[1]
        return inside and self.config.noise_level > 0

    def _sigmas_at(self, step_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= step_index < len(self.sigmas) - 1:
            raise ValueError(f"step index {step_index} outside the schedule of {len(self.sigmas) - 1} steps.")
        return self.sigmas[step_index].float(), self.sigmas[step_index + 1].float()

    def transition(
        self, model_output: torch.Tensor, sample: torch.Tensor, step_index: int, noise_level: float | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""
        The Gaussian transition of step `step_index`: its mean and standard deviation (computed in float32).

        Args:
            model_output (`torch.Tensor` of shape `(batch_size, ...)`): the predicted velocity `v`.
            sample (`torch.Tensor` of shape `(batch_size, ...)`): the current sample `x_t`.
            step_index (`int`): index into `sigmas` (`sigma = sigmas[i]`, `sigma_next = sigmas[i + 1]`).
            noise_level (`float`, *optional*): overrides `config.noise_level`.

        Returns:
            `(mean, std)`: `mean` shaped like `sample`, `std` a 0-d tensor (0 for a deterministic step).
        """
        a = self.config.noise_level if noise_level is None else noise_level
        if not self.is_stochastic_step(step_index) and noise_level is None:
            a = 0.0
        sigma, sigma_next = self._sigmas_at(step_index)
        x, v = sample.float(), model_output.float()
        dt = sigma_next - sigma
        if a == 0:
            return x + dt * v, torch.zeros((), dtype=torch.float32, device=x.device)
        if self.config.sde_type == "sde":
            sigma_t = self._sde_noise_scale(step_index, a)
            mean = x * (1 + sigma_t**2 / (2 * sigma) * dt) + v * (1 + sigma_t**2 * (1 - sigma) / (2 * sigma)) * dt
            std = sigma_t * torch.sqrt(-dt)
        else:
            std = sigma_next * math.sin(a * math.pi / 2)
            x0_hat, x1_hat = x - sigma * v, x + (1 - sigma) * v
            mean = (1 - sigma_next) * x0_hat + torch.sqrt(sigma_next**2 - std**2) * x1_hat
        return mean, std.to(x.device)

    def _sde_noise_scale(self, step_index: int, noise_level: float) -> torch.Tensor:
        """The `"sde"` type's diffusion coefficient `sigma_t = a * sqrt(sigma / (1 - sigma))` at step `step_index`."""
        sigma, _ = self._sigmas_at(step_index)
        # At sigma = 1 the SDE's noise scale is infinite; use the next sigma for the (1 - sigma) factor there.
        denominator = 1 - sigma if sigma < 1 else 1 - self.sigmas[min(1, len(self.sigmas) - 1)].float()
        return noise_level * torch.sqrt(sigma / denominator)

    def kl_penalty(self, mean: torch.Tensor, reference_mean: torch.Tensor, step_index: int) -> torch.Tensor:
        r"""
        The KL penalty between two models' transitions of step `step_index` from the same sample, in the units of the
        reference implementations, so that their `beta` values carry over.

        Both transitions share their standard deviation, so the KL is a scaled squared distance of the means. For
        `"sde"` it is Flow-GRPO's `mean((mean - reference_mean)^2) / (2 sigma_t^2)` with `sigma_t` the SDE's noise
        scale (the exact Gaussian KL would divide by the transition variance `sigma_t^2 (sigma - sigma_next)`, a
        factor `1 / (sigma - sigma_next)` larger). For `"cps"` it is Flow-CPS's `mean((mean - reference_mean)^2)`
        (the exact KL times `2 std^2`).

        Args:
            mean (`torch.Tensor` of shape `(batch_size, ...)`): the policy's transition mean.
            reference_mean (`torch.Tensor` of shape `(batch_size, ...)`): the reference model's transition mean.
            step_index (`int`): a stochastic step (see [`~FlowMatchSDEScheduler.is_stochastic_step`]).

        Returns:
            `torch.Tensor` of shape `(batch_size,)`, float32.
        """
        if not self.is_stochastic_step(step_index):
            raise ValueError(f"`step_index` {step_index} is a deterministic step: its transitions have no KL.")
        squared = ((mean.float() - reference_mean.float()) ** 2).mean(dim=tuple(range(1, mean.ndim)))
        if self.config.sde_type == "cps":
            return squared
        sigma_t = self._sde_noise_scale(step_index, self.config.noise_level).to(squared.device)
        return squared / (2 * sigma_t**2)

    @staticmethod
    def gaussian_log_prob(value: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """Log-density of `value` under `N(mean, std^2)` per element, averaged over all non-batch dimensions."""
        log_density = -((value.float() - mean) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * math.log(2 * math.pi)
        return log_density.mean(dim=tuple(range(1, value.ndim)))

    def step(
        self,
        model_output: torch.Tensor,
        timestep: float | torch.Tensor,
        sample: torch.Tensor,
        generator: torch.Generator | list[torch.Generator] | None = None,
        prev_sample: torch.Tensor | None = None,
        noise_level: float | None = None,
        return_dict: bool = True,
    ) -> FlowMatchSDESchedulerOutput | tuple:
        r"""
        One SDE step from `timestep`; with `prev_sample` given, score that sample instead of drawing one.

        Args:
            model_output (`torch.Tensor` of shape `(batch_size, ...)`): the model's velocity prediction.
            timestep (`float` or `torch.Tensor`): a value from `self.timesteps`.
            sample (`torch.Tensor` of shape `(batch_size, ...)`): the current sample.
            generator (`torch.Generator` or a list of them, *optional*): for the step's noise.
            prev_sample (`torch.Tensor` of shape `(batch_size, ...)`, *optional*): a sample to score (e.g. a stored
                rollout, under the current policy's `model_output`); no noise is drawn then.
            noise_level (`float`, *optional*): overrides `config.noise_level` and the window for this step.
            return_dict (`bool`, defaults to `True`): return a [`FlowMatchSDESchedulerOutput`], else its
                `to_tuple()`: `(prev_sample, log_prob, prev_sample_mean, std_dev)`, without `log_prob` on an ODE step.
        """
        if isinstance(timestep, int) or (isinstance(timestep, torch.Tensor) and not timestep.is_floating_point()):
            raise ValueError(
                f"`timestep` must be one of `scheduler.timesteps` (floats), got {timestep!r}; integer step indices "
                "are not timesteps."
            )
        if model_output.shape != sample.shape:
            raise ValueError(f"`model_output` has shape {tuple(model_output.shape)}, `sample` {tuple(sample.shape)}.")
        if prev_sample is not None and prev_sample.shape != sample.shape:
            raise ValueError(f"`prev_sample` has shape {tuple(prev_sample.shape)}; expected {tuple(sample.shape)}.")
        if self.step_index is None:
            self._init_step_index(timestep)

        mean, std = self.transition(model_output, sample, self.step_index, noise_level)
        log_prob = None
        if std > 0:
            if prev_sample is None:
                noise = randn_tensor(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
                prev_sample = mean + std * noise
            log_prob = self.gaussian_log_prob(prev_sample, mean, std)
        elif prev_sample is None:
            prev_sample = mean
        self._step_index += 1

        prev_sample = prev_sample.to(model_output.dtype)
        std = std.expand(sample.shape[0])
        output = FlowMatchSDESchedulerOutput(
            prev_sample=prev_sample, log_prob=log_prob, prev_sample_mean=mean, std_dev=std
        )
        return output if return_dict else output.to_tuple()
