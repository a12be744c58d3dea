"""UserEmbeddingDenoiser: a diffusion model over user embeddings, conditioned on a summary of the user's
interactions, for recommendation that treats a user as a distribution rather than a point: the pipeline draws
several embeddings per user and aggregates their item scores ([`DistributionalRecommendationPipeline`])."""

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
class UserEmbeddingDenoiserOutput(BaseOutput):
    """Output of [`UserEmbeddingDenoiser`].

    Args:
        sample (`torch.Tensor` of shape `(batch, embedding_dim)`): the predicted noise (epsilon prediction).
    """

    sample: torch.Tensor


@public
class UserEmbeddingDenoiser(ModelMixin, ConfigMixin):
    r"""
    A conditional denoiser over user embeddings (epsilon prediction, diffusers' DDPM/DDIM conventions): an MLP on the
    noisy embedding, the timestep embedding and the user's interaction summary.

    Parameters:
        embedding_dim (`int`, defaults to 32): `d`, the user and item embedding size.
        hidden_size (`int`, defaults to 128): the MLP width.
        num_layers (`int`, defaults to 3): residual blocks.
    """

    @register_to_config
    def __init__(self, embedding_dim: int = 32, hidden_size: int = 128, num_layers: int = 3):
        super().__init__()
        check_positive_int("embedding_dim", embedding_dim)
        check_positive_int("hidden_size", hidden_size)
        check_positive_int("num_layers", num_layers)
        self.input = nn.Linear(2 * embedding_dim, hidden_size)
        self.time_embedding = nn.Sequential(
            nn.Linear(hidden_size, hidden_size), nn.SiLU(), nn.Linear(hidden_size, hidden_size)
        )
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.LayerNorm(hidden_size),
                nn.Linear(hidden_size, hidden_size),
                nn.SiLU(),
                nn.Linear(hidden_size, hidden_size),
            )
            for _ in range(num_layers)
        )
        self.output = nn.Linear(hidden_size, embedding_dim)

    def forward(
        self, sample: torch.Tensor, timestep: torch.Tensor | int, summary: torch.Tensor, return_dict: bool = True
    ) -> UserEmbeddingDenoiserOutput | tuple:
        """
        Args:
            sample (`torch.Tensor` of shape `(batch, embedding_dim)`): the noisy user embedding.
            timestep (`torch.Tensor` of shape `(batch,)` or an int): the diffusion timestep.
            summary (`torch.Tensor` of shape `(batch, embedding_dim)`): the user's interaction summary.
            return_dict (`bool`, defaults to `True`): a [`UserEmbeddingDenoiserOutput`] or a tuple.
        """
        d = self.config.embedding_dim
        if sample.ndim != 2 or sample.shape[1] != d or tuple(summary.shape) != tuple(sample.shape):
            raise ValueError(
                f"`sample` and `summary` must both have shape (batch, {d}), got {tuple(sample.shape)} and "
                f"{tuple(summary.shape)}."
            )
        timestep = torch.as_tensor(timestep, device=sample.device).reshape(-1).expand(len(sample)).float()
        hidden = self.input(torch.cat([sample, summary.to(sample.dtype)], dim=-1))
        condition = self.time_embedding(
            get_timestep_embedding(timestep, self.config.hidden_size, flip_sin_to_cos=True, downscale_freq_shift=0).to(
                sample.dtype
            )
        )
        for block in self.blocks:
            hidden = hidden + block(hidden + condition)
        noise = self.output(hidden)
        if not return_dict:
            return (noise,)
        return UserEmbeddingDenoiserOutput(sample=noise)
