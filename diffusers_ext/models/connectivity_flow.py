"""ConnectivityFlowModel: the two velocity networks of a connectivity distribution of a low-rank RNN.

A rank-`R` lrRNN neuron has identifiable input-side loadings `(m, d)` (`R` numbers, plus a bias if the network has
one) and output-side loadings `n` (`R` numbers). The distribution of a neuron's loadings is `p(m, d) p(n | m, d)`,
each factor a continuous normalising flow trained by flow matching: the *input* head is the velocity of
`p(m, d)`, the *output* head the velocity of `p(n | m, d)`, conditioned on the input-side loadings.

Both heads work in a normalised space (`loadings / scale`, the scales in the config) and follow diffusers' flow
matching convention (`FlowMatchEulerDiscreteScheduler`): at noise level `sigma = timestep / 1000` the sample is
`(1 - sigma) x + sigma noise` and the velocity is `noise - x`.
"""

from dataclasses import dataclass

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from diffusers.models.embeddings import get_timestep_embedding
from diffusers.utils import BaseOutput
from torch import nn

from ..utils import check_positive_int, public


@public
@dataclass
class ConnectivityFlowModelOutput(BaseOutput):
    """Output of [`ConnectivityFlowModel`].

    Args:
        sample (`torch.Tensor` of the sample's shape): the predicted velocity `noise - x`.
    """

    sample: torch.Tensor


class _VelocityMLP(nn.Module):
    """`v(x, sigma[, condition])`: an MLP on `[x, condition, embed(timestep)]` with SiLU activations."""

    def __init__(self, dim: int, condition_dim: int, hidden_size: int, num_layers: int, time_embedding_dim: int):
        super().__init__()
        self.time_embedding_dim = time_embedding_dim
        layers, width = [], dim + condition_dim + time_embedding_dim
        for _ in range(num_layers):
            layers += [nn.Linear(width, hidden_size), nn.SiLU()]
            width = hidden_size
        layers.append(nn.Linear(width, dim))
        self.net = nn.Sequential(*layers)

    def forward(self, sample, timestep, condition=None):
        flat = timestep.reshape(-1).to(torch.float32)
        embedding = get_timestep_embedding(flat, self.time_embedding_dim, flip_sin_to_cos=True, downscale_freq_shift=0)
        embedding = embedding.reshape(*timestep.shape, -1).to(sample.dtype)
        inputs = [sample, embedding] if condition is None else [sample, condition.to(sample.dtype), embedding]
        return self.net(torch.cat(inputs, dim=-1))


@public
class ConnectivityFlowModel(ModelMixin, ConfigMixin):
    """The input-side and output-side velocity networks of a low-rank RNN's connectivity distribution.

    Args:
        rank (`int`, defaults to 2): the lrRNN's rank `R` (size of `m` and of `n`).
        bias (`bool`, defaults to `False`): whether neurons have a bias `d` (then the input side is `(m, d)`).
        hidden_size (`int`, defaults to 128): width of both MLPs.
        num_layers (`int`, defaults to 3): hidden layers of each MLP.
        time_embedding_dim (`int`, defaults to 32): sinusoidal embedding size of the timestep.
        input_scale (`float`, defaults to 1.0): the input-side loadings are modelled as `(m, d) / input_scale`.
        output_scale (`float`, defaults to 1.0): the output-side loadings are modelled as `n / output_scale`.
        alpha (`float`, defaults to 0.1): the leak `dt / tau` of the lrRNN the loadings belong to (used to simulate).
        num_train_timesteps (`int`, defaults to 1000): the timestep of noise level `sigma` is
            `sigma * num_train_timesteps` (the scheduler's `num_train_timesteps`).
    """

    @register_to_config
    def __init__(
        self,
        rank: int = 2,
        bias: bool = False,
        hidden_size: int = 128,
        num_layers: int = 3,
        time_embedding_dim: int = 32,
        input_scale: float = 1.0,
        output_scale: float = 1.0,
        alpha: float = 0.1,
        num_train_timesteps: int = 1000,
    ):
        super().__init__()
        for name, value in (
            ("rank", rank),
            ("hidden_size", hidden_size),
            ("num_layers", num_layers),
            ("num_train_timesteps", num_train_timesteps),
        ):
            check_positive_int(name, value)
        if not isinstance(time_embedding_dim, int) or time_embedding_dim < 2 or time_embedding_dim % 2:
            raise ValueError(f"`time_embedding_dim` must be an even int >= 2, got {time_embedding_dim!r}.")
        for name, value in (("input_scale", input_scale), ("output_scale", output_scale)):
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"`{name}` must be a positive number, got {value!r}.")
        if not isinstance(alpha, (int, float)) or not 0 < alpha <= 1:
            raise ValueError(f"`alpha` must lie in (0, 1], got {alpha!r}.")
        self.input_velocity = _VelocityMLP(self.input_dim, 0, hidden_size, num_layers, time_embedding_dim)
        self.output_velocity = _VelocityMLP(rank, self.input_dim, hidden_size, num_layers, time_embedding_dim)

    @property
    def input_dim(self) -> int:
        """Size of a neuron's input-side loadings: `rank` (+1 with a bias)."""
        return self.config.rank + int(bool(self.config.bias))

    @property
    def output_dim(self) -> int:
        """Size of a neuron's output-side loadings: `rank`."""
        return self.config.rank

    def _timestep(self, timestep, sample: torch.Tensor) -> torch.Tensor:
        timestep = torch.as_tensor(timestep, device=sample.device)
        batch_shape = sample.shape[:-1]
        if timestep.ndim == 0:
            return timestep.expand(batch_shape)
        if timestep.shape == batch_shape:
            return timestep
        if timestep.ndim == 1 and len(timestep) == batch_shape[0]:
            return timestep.reshape(-1, *([1] * (len(batch_shape) - 1))).expand(batch_shape)
        raise ValueError(
            f"`timestep` must be a scalar, of shape ({batch_shape[0]},) or of shape {tuple(batch_shape)}, got "
            f"{tuple(timestep.shape)}."
        )

    def forward(
        self,
        sample: torch.Tensor,
        timestep: torch.Tensor | float,
        condition: torch.Tensor | None = None,
        return_dict: bool = True,
    ) -> ConnectivityFlowModelOutput | tuple:
        """The velocity of the input-side flow (no `condition`) or of the output-side flow (given `condition`).

        Args:
            sample (`torch.Tensor` of shape `(..., input_dim)` or `(..., rank)`): noisy normalised input-side
                loadings (no `condition`), or noisy normalised output-side loadings (with `condition`).
            timestep (`torch.Tensor` or `float`): `sigma * num_train_timesteps`; a scalar, one per leading row, or
                one per sample (`sample.shape[:-1]`).
            condition (`torch.Tensor` of shape `(..., input_dim)`, *optional*): the normalised input-side loadings the
                output-side flow is conditioned on.
            return_dict (`bool`, defaults to `True`): return a [`ConnectivityFlowModelOutput`] or a tuple.
        """
        if not isinstance(sample, torch.Tensor) or sample.ndim < 2:
            raise ValueError(f"`sample` must be a tensor of shape (..., dim), got {getattr(sample, 'shape', sample)}.")
        if condition is None:
            if sample.shape[-1] != self.input_dim:
                raise ValueError(
                    f"`sample` of the input-side flow must end in {self.input_dim}, got {tuple(sample.shape)}."
                )
            velocity = self.input_velocity(sample, self._timestep(timestep, sample))
        else:
            if sample.shape[-1] != self.output_dim:
                raise ValueError(
                    f"`sample` of the output-side flow must end in {self.output_dim}, got {tuple(sample.shape)}."
                )
            if condition.shape != (*sample.shape[:-1], self.input_dim):
                raise ValueError(
                    f"`condition` must have shape {(*sample.shape[:-1], self.input_dim)}, got {tuple(condition.shape)}."
                )
            velocity = self.output_velocity(sample, self._timestep(timestep, sample), condition)
        return ConnectivityFlowModelOutput(sample=velocity) if return_dict else (velocity,)
