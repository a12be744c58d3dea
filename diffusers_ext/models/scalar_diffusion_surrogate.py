"""[`ScalarDiffusionSurrogate`]: SPADE's noise-prediction network for a scalar score `y` given a design `x`."""

import math
from dataclasses import dataclass

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from diffusers.utils import BaseOutput
from torch import nn

from ..utils import check_positive_int, public


@public
@dataclass
class ScalarDiffusionSurrogateOutput(BaseOutput):
    """Output of [`ScalarDiffusionSurrogate`].

    Args:
        sample (`torch.Tensor` of shape `(batch, 1)`): the predicted noise `epsilon`.
    """

    sample: torch.Tensor


class _SinusoidalTimeEmbedding(nn.Module):
    """`[sin(t f), cos(t f)]` with `f = exp(linspace(0, log 10000, dim / 2))` for continuous `t` in `[0, 1]`, then
    Linear -> SiLU -> Linear (SPADE's time embedding; note the frequencies *grow* from 1 to 10^4)."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self.linear_1 = nn.Linear(dim, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        freqs = torch.exp(torch.linspace(0, math.log(10000.0), self.dim // 2, device=t.device, dtype=t.dtype))
        args = t[:, None] * freqs
        emb = torch.cat([torch.sin(args), torch.cos(args)], dim=-1)
        return self.linear_2(nn.functional.silu(self.linear_1(emb)))


@public
class ScalarDiffusionSurrogate(ModelMixin, ConfigMixin):
    r"""
    The conditional noise-prediction network of SPADE's surrogate `p(y | x)`: a DDPM over a scalar `y` conditioned on a
    design `x`.

    `x` goes through Linear(D, H) -> SiLU -> Linear(H, H) -> SiLU, the noisy `y_t` through Linear(1, H), the timestep
    (as continuous time `(t + 0.5) / num_train_timesteps`) through a sinusoidal embedding with two linear layers; the
    concatenation goes through Linear -> SiLU -> Linear -> SiLU -> Linear(H, 1).

    Sample with diffusers' `DDIMScheduler` through [`SurrogatePredictivePipeline`]; train with `DDPMScheduler`
    (`num_train_timesteps=100, beta_schedule="linear", beta_start=1e-4, beta_end=2e-2`).

    Args:
        x_dim (`int`): the design dimension `D`.
        hidden_size (`int`, defaults to 2048): `H` (the paper's; 256 is enough on the CPU tasks).
        time_embed_dim (`int`, defaults to 128): the sinusoidal embedding's size (even).
        num_train_timesteps (`int`, defaults to 100): `T`, which maps an integer timestep to continuous time.
    """

    @register_to_config
    def __init__(self, x_dim: int, hidden_size: int = 2048, time_embed_dim: int = 128, num_train_timesteps: int = 100):
        super().__init__()
        check_positive_int("x_dim", x_dim)
        check_positive_int("hidden_size", hidden_size)
        check_positive_int("num_train_timesteps", num_train_timesteps)
        if time_embed_dim < 2 or time_embed_dim % 2:
            raise ValueError(f"`time_embed_dim` must be an even integer >= 2, got {time_embed_dim}.")
        self.time_embedding = _SinusoidalTimeEmbedding(time_embed_dim)
        self.x_encoder = nn.Sequential(
            nn.Linear(x_dim, hidden_size), nn.SiLU(), nn.Linear(hidden_size, hidden_size), nn.SiLU()
        )
        self.y_proj = nn.Linear(1, hidden_size)
        self.head = nn.Sequential(
            nn.Linear(2 * hidden_size + time_embed_dim, hidden_size),
            nn.SiLU(),
            nn.Linear(hidden_size, hidden_size),
            nn.SiLU(),
            nn.Linear(hidden_size, 1),
        )
        # the z-scoring of the training data (set by `set_normalization`; saved with the weights)
        self.register_buffer("x_mean", torch.zeros(x_dim))
        self.register_buffer("x_std", torch.ones(x_dim))
        self.register_buffer("y_mean", torch.zeros(()))
        self.register_buffer("y_std", torch.ones(()))

    def set_normalization(self, x_mean, x_std, y_mean, y_std) -> None:
        """Store the z-scoring of the training data: `x_mean`, `x_std` of shape `(x_dim,)`, scalars `y_mean`,
        `y_std`. The network itself sees normalised data; the pipelines map designs and scores through these."""
        values = {"x_mean": x_mean, "x_std": x_std, "y_mean": y_mean, "y_std": y_std}
        for name, value in values.items():
            value = torch.as_tensor(value, dtype=self.x_mean.dtype).reshape(getattr(self, name).shape)
            if name.endswith("std") and not bool((value > 0).all()):
                raise ValueError(f"`{name}` must be > 0 everywhere, got {value}.")
            getattr(self, name).copy_(value)

    def normalize_x(self, x: torch.Tensor) -> torch.Tensor:
        """Designs `(N, x_dim)` in data units -> the network's units."""
        return (x - self.x_mean) / self.x_std

    def denormalize_x(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.x_std + self.x_mean

    def denormalize_y(self, y: torch.Tensor) -> torch.Tensor:
        """Scores in the network's units -> data units."""
        return y * self.y_std + self.y_mean

    def encode_x(self, x: torch.Tensor) -> torch.Tensor:
        """The design features `(batch, H)`; computed once per design when sampling many steps."""
        return self.x_encoder(x)

    def forward(
        self,
        sample: torch.Tensor,
        timestep: torch.Tensor | int,
        x: torch.Tensor | None = None,
        x_features: torch.Tensor | None = None,
        return_dict: bool = True,
    ) -> ScalarDiffusionSurrogateOutput | tuple:
        r"""
        Args:
            sample (`torch.Tensor` of shape `(batch, 1)`): the noisy scores `y_t`.
            timestep (`torch.Tensor` of shape `(batch,)` or `()`, or `int`): integer timesteps in `[0, T)`.
            x (`torch.Tensor` of shape `(batch, x_dim)`): the designs (or pass `x_features`).
            x_features (`torch.Tensor` of shape `(batch, hidden_size)`, *optional*): `encode_x(x)`, precomputed.
            return_dict (`bool`): return a [`ScalarDiffusionSurrogateOutput`] (else a tuple).

        Returns:
            the predicted noise, shape `(batch, 1)`.
        """
        if sample.ndim != 2 or sample.shape[1] != 1:
            raise ValueError(f"`sample` must have shape (batch, 1), got {tuple(sample.shape)}.")
        if x_features is None:
            if x is None:
                raise ValueError("pass `x` (the designs) or `x_features`.")
            if x.ndim != 2 or x.shape[1] != self.config.x_dim:
                raise ValueError(f"`x` must have shape (batch, {self.config.x_dim}), got {tuple(x.shape)}.")
            x_features = self.encode_x(x)
        batch = sample.shape[0]
        timestep = torch.as_tensor(timestep, device=sample.device)
        t = (timestep.to(sample.dtype) + 0.5) / self.config.num_train_timesteps
        t = t.reshape(-1).expand(batch) if t.numel() == 1 else t.reshape(batch)
        h = torch.cat([x_features, self.y_proj(sample), self.time_embedding(t)], dim=-1)
        eps = self.head(h)
        if not return_dict:
            return (eps,)
        return ScalarDiffusionSurrogateOutput(sample=eps)
