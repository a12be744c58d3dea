"""BrainNetworkFlowModel: a conditional velocity model over the Euclidean vectors a matrix codec makes of
connectivity matrices ([`CorrelationMatrixCodec`], [`SPDMatrixCodec`]), in diffusers' flow-matching convention.

The path is `x_sigma = (1 - sigma) x + sigma eps` (`FlowMatchEulerDiscreteScheduler`, timestep
`sigma * num_train_timesteps`) and the model predicts the velocity `eps - x` from `x_sigma`, the timestep and the
subject's covariates (age, sex, a time index, ...). The body is a residual MLP: each block is modulated (scale and
shift, as adaLN in DiT) by an embedding of the timestep plus an embedding of the covariates.
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
class BrainNetworkFlowOutput(BaseOutput):
    """Output of [`BrainNetworkFlowModel`].

    Args:
        sample (`torch.Tensor` of shape `(batch, num_features)`): the predicted velocity `noise - x`.
    """

    sample: torch.Tensor


class _ModulatedBlock(nn.Module):
    def __init__(self, hidden_size: int, dropout: float):
        super().__init__()
        self.norm = nn.LayerNorm(hidden_size, elementwise_affine=False)
        self.modulation = nn.Linear(hidden_size, 3 * hidden_size)
        self.mlp = nn.Sequential(
            nn.Linear(hidden_size, 2 * hidden_size),
            nn.SiLU(),
            nn.Dropout(dropout),
            nn.Linear(2 * hidden_size, hidden_size),
        )
        nn.init.zeros_(self.modulation.weight)
        nn.init.zeros_(self.modulation.bias)

    def forward(self, hidden: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        shift, scale, gate = self.modulation(condition).chunk(3, dim=-1)
        return hidden + (1 + gate) * self.mlp(self.norm(hidden) * (1 + scale) + shift)


@public
class BrainNetworkFlowModel(ModelMixin, ConfigMixin):
    r"""
    The conditional velocity `v(x_sigma, sigma, c)` of flow matching over encoded connectivity matrices.

    Parameters:
        num_features (`int`): the length `k` of an encoded matrix (`codec.num_features`; 4950 for 100 regions).
        num_covariates (`int`, defaults to 2): the covariates per subject (e.g. age and sex); 0 for unconditional.
        hidden_size (`int`, defaults to 512): the MLP width.
        num_layers (`int`, defaults to 4): modulated residual blocks.
        dropout (`float`, defaults to 0.0): dropout inside each block.
        num_train_timesteps (`int`, defaults to 1000): the scheduler's timestep scale (`timestep = sigma * this`).
    """

    @register_to_config
    def __init__(
        self,
        num_features: int,
        num_covariates: int = 2,
        hidden_size: int = 512,
        num_layers: int = 4,
        dropout: float = 0.0,
        num_train_timesteps: int = 1000,
    ):
        super().__init__()
        check_positive_int("num_features", num_features)
        check_positive_int("num_covariates", num_covariates, minimum=0)
        check_positive_int("hidden_size", hidden_size)
        check_positive_int("num_layers", num_layers)
        check_positive_int("num_train_timesteps", num_train_timesteps)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"`dropout` must lie in [0, 1), got {dropout!r}.")
        self.input = nn.Linear(num_features, hidden_size)
        self.time_embedding = nn.Sequential(
            nn.Linear(hidden_size, hidden_size), nn.SiLU(), nn.Linear(hidden_size, hidden_size)
        )
        self.covariate_embedding = (
            nn.Sequential(nn.Linear(num_covariates, hidden_size), nn.SiLU(), nn.Linear(hidden_size, hidden_size))
            if num_covariates
            else None
        )
        self.blocks = nn.ModuleList(_ModulatedBlock(hidden_size, dropout) for _ in range(num_layers))
        self.output_norm = nn.LayerNorm(hidden_size)
        self.output = nn.Linear(hidden_size, num_features)
        nn.init.zeros_(self.output.weight)
        nn.init.zeros_(self.output.bias)

    def forward(
        self,
        sample: torch.Tensor,
        timestep: torch.Tensor | float,
        covariates: torch.Tensor | None = None,
        return_dict: bool = True,
    ) -> BrainNetworkFlowOutput | tuple:
        """
        Args:
            sample (`torch.Tensor` of shape `(batch, num_features)`): `x_sigma`.
            timestep (`torch.Tensor` of shape `(batch,)` or a number): `sigma * num_train_timesteps`.
            covariates (`torch.Tensor` of shape `(batch, num_covariates)`): required when `num_covariates > 0`.
            return_dict (`bool`, defaults to `True`): a [`BrainNetworkFlowOutput`] or a tuple.
        """
        batch, features = sample.shape[0], self.config.num_features
        if sample.ndim != 2 or sample.shape[1] != features:
            raise ValueError(f"`sample` must have shape (batch, {features}), got {tuple(sample.shape)}.")
        timestep = torch.as_tensor(timestep, device=sample.device, dtype=torch.float32).reshape(-1).expand(batch)
        condition = self.time_embedding(
            get_timestep_embedding(timestep, self.config.hidden_size, flip_sin_to_cos=True, downscale_freq_shift=0).to(
                sample.dtype
            )
        )
        if self.covariate_embedding is not None:
            expected = (batch, self.config.num_covariates)
            if covariates is None or tuple(covariates.shape) != expected:
                got = None if covariates is None else tuple(covariates.shape)
                raise ValueError(f"`covariates` must have shape {expected}, got {got}.")
            condition = condition + self.covariate_embedding(covariates.to(sample.dtype))
        condition = nn.functional.silu(condition)
        hidden = self.input(sample)
        for block in self.blocks:
            hidden = block(hidden, condition)
        velocity = self.output(self.output_norm(hidden))
        if not return_dict:
            return (velocity,)
        return BrainNetworkFlowOutput(sample=velocity)
