"""A small bidirectional transformer that predicts `p(x1 | x_t, t)` for discrete flow matching."""

import math
from dataclasses import dataclass

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from diffusers.utils import BaseOutput
from torch import nn

from ..utils import public


@public
@dataclass
class DiscreteFlowModelOutput(BaseOutput):
    """
    Output of [`DiscreteFlowTransformerModel`].

    Args:
        logits (`torch.Tensor` of shape `(batch_size, sequence_length, vocab_size)`): unnormalised scores of the
            data token at every position.
    """

    logits: torch.Tensor


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal features of times `t` in [0, 1] (shape `(B,)`) -> `(B, dim)`."""
    half = dim // 2
    freqs = torch.exp(-math.log(1000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / max(half, 1))
    angles = 1000.0 * t.float()[:, None] * freqs[None]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


@public
class DiscreteFlowTransformerModel(ModelMixin, ConfigMixin):
    r"""
    A pre-norm bidirectional transformer encoder over token ids, conditioned on the flow time.

    Parameters:
        vocab_size (`int`, defaults to 2): number of data tokens `V` (the output vocabulary).
        num_embeddings (`int`, *optional*): input vocabulary (data plus mask tokens); defaults to `vocab_size`.
            Take it from the scheduler's `num_embeddings`.
        sequence_length (`int`, defaults to 16): the (fixed) sequence length `L`.
        hidden_size (`int`, defaults to 64): model width.
        num_layers (`int`, defaults to 2): transformer layers.
        num_heads (`int`, defaults to 4): attention heads.
        mlp_ratio (`float`, defaults to 4.0): feed-forward width over `hidden_size`.
        dropout (`float`, defaults to 0.0): dropout in the transformer layers.
    """

    @register_to_config
    def __init__(
        self,
        vocab_size: int = 2,
        num_embeddings: int | None = None,
        sequence_length: int = 16,
        hidden_size: int = 64,
        num_layers: int = 2,
        num_heads: int = 4,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
    ):
        super().__init__()
        num_embeddings = num_embeddings or vocab_size
        if num_embeddings < vocab_size:
            raise ValueError(f"`num_embeddings` ({num_embeddings}) must be >= `vocab_size` ({vocab_size}).")
        if hidden_size % num_heads:
            raise ValueError(f"`hidden_size` ({hidden_size}) must be divisible by `num_heads` ({num_heads}).")
        self.token_embedding = nn.Embedding(num_embeddings, hidden_size)
        self.position_embedding = nn.Parameter(torch.randn(sequence_length, hidden_size) * 0.02)
        self.time_mlp = nn.Sequential(
            nn.Linear(hidden_size, hidden_size), nn.SiLU(), nn.Linear(hidden_size, hidden_size)
        )
        layer = nn.TransformerEncoderLayer(
            hidden_size,
            num_heads,
            int(hidden_size * mlp_ratio),
            dropout=dropout,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.norm_out = nn.LayerNorm(hidden_size)
        self.head = nn.Linear(hidden_size, vocab_size)

    def forward(
        self, input_ids: torch.LongTensor, timestep: float | torch.Tensor, return_dict: bool = True
    ) -> DiscreteFlowModelOutput | tuple:
        """
        Args:
            input_ids (`torch.LongTensor` of shape `(B, L)`): `x_t`, ids below `num_embeddings`.
            timestep (`float` or `torch.Tensor` of shape `()` or `(B,)`): flow times in [0, 1].
            return_dict (`bool`, defaults to `True`): return a [`DiscreteFlowModelOutput`] or a tuple.

        Returns:
            [`DiscreteFlowModelOutput`] with `logits` of shape `(B, L, vocab_size)`.
        """
        if input_ids.ndim != 2 or input_ids.shape[1] != self.config.sequence_length:
            raise ValueError(
                f"`input_ids` must have shape (batch, {self.config.sequence_length}), got {tuple(input_ids.shape)}."
            )
        t = torch.as_tensor(timestep, device=input_ids.device, dtype=torch.float32)
        t = t.expand(input_ids.shape[0]) if t.ndim == 0 else t
        h = self.token_embedding(input_ids) + self.position_embedding
        cond = self.time_mlp(timestep_embedding(t, self.config.hidden_size).to(h.dtype))
        h = self.encoder(h + cond[:, None, :])
        logits = self.head(self.norm_out(h))
        if not return_dict:
            return (logits,)
        return DiscreteFlowModelOutput(logits=logits)
