"""SpatioTemporalDenoiser: the epsilon-network of a DiffSTG-style spatio-temporal diffusion forecaster."""

from dataclasses import dataclass

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.embeddings import TimestepEmbedding, Timesteps
from diffusers.models.modeling_utils import ModelMixin
from diffusers.utils import BaseOutput
from torch import nn

from ..utils import check_positive_int, is_number, public


@public
@dataclass
class SpatioTemporalDenoiserOutput(BaseOutput):
    """Output of [`SpatioTemporalDenoiser`].

    Args:
        sample (`torch.Tensor` of shape `(batch, nodes, time)`): the predicted noise.
    """

    sample: torch.Tensor


class _Block(nn.Module):
    """Pre-norm temporal self-attention (within each node), adjacency-masked graph attention (within each step),
    and a feed-forward layer, each residual."""

    def __init__(self, hidden_size: int, num_heads: int, dropout: float):
        super().__init__()
        self.temporal_norm = nn.LayerNorm(hidden_size)
        self.temporal = nn.MultiheadAttention(hidden_size, num_heads, dropout=dropout, batch_first=True)
        self.graph_norm = nn.LayerNorm(hidden_size)
        self.graph = nn.MultiheadAttention(hidden_size, num_heads, dropout=dropout, batch_first=True)
        self.ff_norm = nn.LayerNorm(hidden_size)
        self.ff = nn.Sequential(
            nn.Linear(hidden_size, 2 * hidden_size),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(2 * hidden_size, hidden_size),
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, hidden: torch.Tensor, graph_mask: torch.Tensor) -> torch.Tensor:
        batch, nodes, time, width = hidden.shape
        x = hidden.reshape(batch * nodes, time, width)
        h = self.temporal_norm(x)
        x = x + self.dropout(self.temporal(h, h, h, need_weights=False)[0])
        x = x.reshape(batch, nodes, time, width).transpose(1, 2).reshape(batch * time, nodes, width)
        h = self.graph_norm(x)
        x = x + self.dropout(self.graph(h, h, h, attn_mask=graph_mask, need_weights=False)[0])
        x = x + self.dropout(self.ff(self.ff_norm(x)))
        return x.reshape(batch, time, nodes, width).transpose(1, 2)


@public
class SpatioTemporalDenoiser(ModelMixin, ConfigMixin):
    r"""
    A spatio-temporal transformer that predicts the noise of a `(batch, nodes, time)` window of a graph signal,
    conditioned on its observed part.

    Each point `(node, step)` is embedded from three numbers (the noisy sample, the masked history, the history mask),
    plus a learned embedding of its step in the window and the diffusion timestep's embedding. Each of `num_layers`
    blocks attends over time within each node, then over the graph's nodes within each step (a node sees itself and
    its neighbours in `adjacency` only), then applies a feed-forward layer. The graph is an input, so one model runs
    on any graph of any size.

    The model also records how the data are normalised for it (`data_mean`, `data_std`, `log_transform`), so a
    pipeline maps data in and out of its space with [`normalize`] / [`denormalize`].

    Parameters:
        window_length (`int`, defaults to 21): steps per window (history + horizon).
        hidden_size (`int`, defaults to 32): the width.
        num_heads (`int`, defaults to 4): attention heads.
        num_layers (`int`, defaults to 4): blocks.
        dropout (`float`, defaults to 0.2): dropout in attention and feed-forward layers.
        data_mean (`float`, defaults to 0.0), data_std (`float`, defaults to 1.0): the training data's statistics
            (after the optional `log1p`).
        log_transform (`bool`, defaults to `False`): model `log1p(x)` instead of `x`.
    """

    @register_to_config
    def __init__(
        self,
        window_length: int = 21,
        hidden_size: int = 32,
        num_heads: int = 4,
        num_layers: int = 4,
        dropout: float = 0.2,
        data_mean: float = 0.0,
        data_std: float = 1.0,
        log_transform: bool = False,
    ):
        super().__init__()
        check_positive_int("window_length", window_length, minimum=2)
        check_positive_int("hidden_size", hidden_size)
        check_positive_int("num_heads", num_heads)
        check_positive_int("num_layers", num_layers)
        if hidden_size % num_heads:
            raise ValueError(f"`hidden_size` ({hidden_size}) must be divisible by `num_heads` ({num_heads}).")
        if not is_number(dropout) or not 0 <= dropout < 1:
            raise ValueError(f"`dropout` must lie in [0, 1), got {dropout!r}.")
        if not is_number(data_std) or data_std <= 0:
            raise ValueError(f"`data_std` must be a positive number, got {data_std!r}.")
        self.input_proj = nn.Linear(3, hidden_size)
        self.position = nn.Parameter(torch.zeros(window_length, hidden_size))
        nn.init.normal_(self.position, std=0.02)
        self.time_proj = Timesteps(hidden_size, flip_sin_to_cos=True, downscale_freq_shift=0)
        self.time_embedding = TimestepEmbedding(hidden_size, hidden_size)
        self.blocks = nn.ModuleList([_Block(hidden_size, num_heads, dropout) for _ in range(num_layers)])
        self.norm_out = nn.LayerNorm(hidden_size)
        self.proj_out = nn.Linear(hidden_size, 1)

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        """Data units -> the model's space: `(log1p(x) - data_mean) / data_std` (without `log1p` unless set)."""
        if self.config.log_transform:
            values = torch.log1p(values.clamp(min=0))
        return (values - self.config.data_mean) / self.config.data_std

    def denormalize(self, values: torch.Tensor) -> torch.Tensor:
        """The model's space -> data units (the inverse of [`normalize`])."""
        values = values * self.config.data_std + self.config.data_mean
        return torch.expm1(values) if self.config.log_transform else values

    def forward(
        self,
        sample: torch.Tensor,
        timestep: torch.Tensor | int,
        history: torch.Tensor,
        history_mask: torch.Tensor,
        adjacency: torch.Tensor,
        return_dict: bool = True,
    ) -> SpatioTemporalDenoiserOutput | tuple:
        r"""
        Args:
            sample (`torch.Tensor` of shape `(batch, nodes, time)`): the noisy window.
            timestep (`torch.Tensor` of shape `(batch,)` or `()`, or `int`): the diffusion timestep.
            history (`torch.Tensor` of shape `(batch, nodes, time)`): the observed values (anything where the mask
                is 0; they are zeroed).
            history_mask (`torch.Tensor` of shape `(batch, nodes, time)` or `(batch, time)` or `(time,)`): 1 where
                observed (the history), 0 elsewhere (the future).
            adjacency (`torch.Tensor` of shape `(nodes, nodes)`): a node attends to `j` where `adjacency[i, j] > 0`
                (and always to itself).
            return_dict (`bool`, defaults to `True`): return a [`SpatioTemporalDenoiserOutput`] or a tuple.
        """
        if sample.ndim != 3:
            raise ValueError(f"`sample` must have shape (batch, nodes, time), got {tuple(sample.shape)}.")
        batch, nodes, time = sample.shape
        if time > self.config.window_length:
            raise ValueError(f"`sample` has {time} steps, more than `window_length` {self.config.window_length}.")
        if history.shape != sample.shape:
            raise ValueError(
                f"`history` must have the shape of `sample` {tuple(sample.shape)}, got {tuple(history.shape)}."
            )
        mask = history_mask.to(sample.dtype)
        if mask.shape != sample.shape:
            mask = mask.reshape((1, 1, time) if mask.ndim == 1 else (batch, 1, time)).expand_as(sample)
        if adjacency.shape != (nodes, nodes):
            raise ValueError(f"`adjacency` must have shape ({nodes}, {nodes}), got {tuple(adjacency.shape)}.")
        features = torch.stack([sample, history * mask, mask], -1)
        hidden = self.input_proj(features) + self.position[:time].to(sample.dtype)
        timestep = torch.as_tensor(timestep, device=sample.device)
        if timestep.ndim == 0:
            timestep = timestep.expand(batch)
        temb = self.time_embedding(self.time_proj(timestep).to(sample.dtype))
        hidden = hidden + temb[:, None, None, :]
        eye = torch.eye(nodes, dtype=torch.bool, device=sample.device)
        graph_mask = ~((adjacency.to(sample.device) > 0) | eye)  # True = may not attend
        for block in self.blocks:
            hidden = block(hidden, graph_mask)
        out = self.proj_out(self.norm_out(hidden))[..., 0]
        if not return_dict:
            return (out,)
        return SpatioTemporalDenoiserOutput(sample=out)
