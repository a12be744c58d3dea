"""A graph transformer over node and edge classes with random-walk (RRWP) features, for discrete graph flows.

The layers follow the DiGress/DeFoG design in spirit (node and edge streams, edge features modulating attention
scores through FiLM, the edge stream updated from the scores, a global time embedding modulating both), written
small: no cycle or spectral features.
"""

import math
from dataclasses import dataclass

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from diffusers.loaders.peft import PeftAdapterMixin
from diffusers.utils import BaseOutput
from torch import nn

from ..utils import check_positive_int, public


@public
@dataclass
class GraphTransformerOutput(BaseOutput):
    """
    Output of [`GraphTransformerModel`].

    Args:
        node_logits (`torch.Tensor` of shape `(B, N, num_node_classes)`): logits of the clean node classes.
        edge_logits (`torch.Tensor` of shape `(B, N, N, num_edge_classes)`): symmetric logits of the clean edges.
    """

    node_logits: torch.Tensor
    edge_logits: torch.Tensor


def random_walk_features(adjacency: torch.Tensor, node_mask: torch.BoolTensor, steps: int):
    """RRWP features of a batch of graphs: the powers `M^1 .. M^steps` of the random-walk matrix `M = D^-1 A`.

    Args:
        adjacency (`torch.Tensor` of shape `(B, N, N)`): 0/1 adjacency (float).
        node_mask (`torch.BoolTensor` of shape `(B, N)`): real nodes.
        steps (`int`): number of powers.

    Returns:
        `(node_features, edge_features)` of shapes `(B, N, steps)` (return probabilities, the diagonals) and
        `(B, N, N, steps)`.
    """
    pair = (node_mask.unsqueeze(1) & node_mask.unsqueeze(2)).to(adjacency)
    A = adjacency * pair
    degree = A.sum(-1, keepdim=True)
    M = A / degree.clamp_min(1.0)
    powers, P = [], M
    for _ in range(steps):
        powers.append(P)
        P = P @ M
    edge = torch.stack(powers, -1)
    node = torch.diagonal(edge, dim1=1, dim2=2).transpose(1, 2)
    return node, edge


class _GraphTransformerLayer(nn.Module):
    def __init__(self, node_dim: int, edge_dim: int, time_dim: int, num_heads: int, ff_mult: int, dropout: float):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, node_dim // num_heads
        self.qkv = nn.Linear(node_dim, 3 * node_dim)
        self.edge_mul = nn.Linear(edge_dim, node_dim)
        self.edge_add = nn.Linear(edge_dim, node_dim)
        self.edge_out = nn.Linear(node_dim, edge_dim)
        self.node_out = nn.Linear(node_dim, node_dim)
        self.time_film = nn.Linear(time_dim, 4 * node_dim + 2 * edge_dim)
        self.norm_x1, self.norm_x2 = nn.LayerNorm(node_dim), nn.LayerNorm(node_dim)
        self.norm_e1, self.norm_e2 = nn.LayerNorm(edge_dim), nn.LayerNorm(edge_dim)
        self.ff_x = nn.Sequential(
            nn.Linear(node_dim, ff_mult * node_dim), nn.GELU(), nn.Linear(ff_mult * node_dim, node_dim)
        )
        self.ff_e = nn.Sequential(
            nn.Linear(edge_dim, ff_mult * edge_dim), nn.GELU(), nn.Linear(ff_mult * edge_dim, edge_dim)
        )
        self.dropout = nn.Dropout(dropout)
        self.node_dim, self.edge_dim = node_dim, edge_dim

    def forward(self, x, e, y, node_mask):
        B, N, _ = x.shape
        d = self.node_dim
        film = self.time_film(y)
        xs1, xb1, xs2, xb2 = film[:, : 4 * d].chunk(4, -1)
        es, eb = film[:, 4 * d :].chunk(2, -1)
        q, k, v = self.qkv(x).chunk(3, -1)
        q = q.view(B, N, self.num_heads, self.head_dim)
        k = k.view(B, N, self.num_heads, self.head_dim)
        v = v.view(B, N, self.num_heads, self.head_dim)
        scores = q.unsqueeze(2) * k.unsqueeze(1) / math.sqrt(self.head_dim)  # (B, N, N, H, Dh)
        scores = scores.reshape(B, N, N, d)
        scores = scores * (1 + self.edge_mul(e)) + self.edge_add(e)
        # the edge stream reads the modulated scores (symmetrised), FiLM-ed by time
        new_e = self.edge_out(scores)
        new_e = (new_e + new_e.transpose(1, 2)) / 2
        new_e = new_e * (1 + es[:, None, None]) + eb[:, None, None]
        e = self.norm_e1(e + self.dropout(new_e))
        e = self.norm_e2(e + self.dropout(self.ff_e(e)))
        logits = scores.view(B, N, N, self.num_heads, self.head_dim).sum(-1)  # (B, N, N, H)
        key_mask = node_mask[:, None, :, None]
        logits = logits.masked_fill(~key_mask, float("-inf"))
        attn = logits.softmax(2).nan_to_num(0.0)
        attended = torch.einsum("bijh,bjhd->bihd", attn, v).reshape(B, N, d)
        attended = attended * (1 + xs1[:, None]) + xb1[:, None]
        x = self.norm_x1(x + self.dropout(self.node_out(attended)))
        x = self.norm_x2(x + self.dropout(self.ff_x(x) * (1 + xs2[:, None]) + xb2[:, None]))
        pair = (node_mask.unsqueeze(1) & node_mask.unsqueeze(2)).unsqueeze(-1)
        return x * node_mask.unsqueeze(-1), e * pair


@public
class GraphTransformerModel(ModelMixin, ConfigMixin, PeftAdapterMixin):
    r"""
    A graph transformer predicting the clean node and edge classes of a noisy graph, `p̂(G_1 | G_t, t)`.

    Inputs are class tensors; the model one-hot encodes them, adds random-walk (RRWP) features of the noisy
    adjacency (edges are the pairs with a class > 0) and a sinusoidal embedding of `t`, and runs `num_layers` layers
    with a node and an edge stream. Edge logits are symmetric.

    Parameters:
        num_node_classes (`int`, defaults to 1): node classes `S_X`.
        num_edge_classes (`int`, defaults to 2): edge classes `S_E` (class 0 = no edge).
        node_dim (`int`, defaults to 64): node stream width (a multiple of `num_heads`).
        edge_dim (`int`, defaults to 16): edge stream width.
        time_dim (`int`, defaults to 32): time embedding width.
        num_layers (`int`, defaults to 4): transformer layers.
        num_heads (`int`, defaults to 4): attention heads.
        num_random_walk_steps (`int`, defaults to 8): RRWP powers.
        ff_mult (`int`, defaults to 2): feed-forward expansion.
        dropout (`float`, defaults to 0.0): dropout.
    """

    @register_to_config
    def __init__(
        self,
        num_node_classes: int = 1,
        num_edge_classes: int = 2,
        node_dim: int = 64,
        edge_dim: int = 16,
        time_dim: int = 32,
        num_layers: int = 4,
        num_heads: int = 4,
        num_random_walk_steps: int = 8,
        ff_mult: int = 2,
        dropout: float = 0.0,
    ):
        super().__init__()
        for name, value in (
            ("num_node_classes", num_node_classes),
            ("node_dim", node_dim),
            ("edge_dim", edge_dim),
            ("time_dim", time_dim),
            ("num_layers", num_layers),
            ("num_heads", num_heads),
            ("num_random_walk_steps", num_random_walk_steps),
            ("ff_mult", ff_mult),
        ):
            check_positive_int(name, value)
        check_positive_int("num_edge_classes", num_edge_classes, minimum=2)
        if node_dim % num_heads:
            raise ValueError(f"`node_dim` ({node_dim}) must be a multiple of `num_heads` ({num_heads}).")
        if time_dim % 2:
            raise ValueError(f"`time_dim` must be even, got {time_dim}.")
        K = num_random_walk_steps
        self.node_in = nn.Linear(num_node_classes + K, node_dim)
        self.edge_in = nn.Linear(num_edge_classes + K, edge_dim)
        self.time_mlp = nn.Sequential(nn.Linear(time_dim, time_dim), nn.GELU(), nn.Linear(time_dim, time_dim))
        self.layers = nn.ModuleList(
            _GraphTransformerLayer(node_dim, edge_dim, time_dim, num_heads, ff_mult, dropout)
            for _ in range(num_layers)
        )
        self.node_head = nn.Sequential(nn.Linear(node_dim, node_dim), nn.GELU(), nn.Linear(node_dim, num_node_classes))
        self.edge_head = nn.Sequential(nn.Linear(edge_dim, edge_dim), nn.GELU(), nn.Linear(edge_dim, num_edge_classes))

    @classmethod
    def tiny(cls, num_node_classes: int = 1, num_edge_classes: int = 2) -> "GraphTransformerModel":
        """A tiny configuration for tests and CPU experiments (about 10k parameters)."""
        return cls(
            num_node_classes,
            num_edge_classes,
            node_dim=16,
            edge_dim=8,
            time_dim=8,
            num_layers=2,
            num_heads=2,
            num_random_walk_steps=4,
        )

    def _time_embedding(self, t: torch.Tensor) -> torch.Tensor:
        half = self.config.time_dim // 2
        freqs = torch.exp(-math.log(1000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
        angles = t.float().unsqueeze(-1) * 1000.0 * freqs
        return torch.cat([angles.sin(), angles.cos()], -1)

    def forward(
        self,
        node_classes: torch.LongTensor,
        edge_classes: torch.LongTensor,
        timestep: torch.Tensor | float,
        node_mask: torch.BoolTensor | None = None,
        return_dict: bool = True,
    ) -> GraphTransformerOutput | tuple:
        """
        Args:
            node_classes (`torch.LongTensor` of shape `(B, N)`): noisy node classes.
            edge_classes (`torch.LongTensor` of shape `(B, N, N)`): noisy symmetric edge classes.
            timestep (`torch.Tensor` of shape `(B,)` or a number): the flow time in `[0, 1]`.
            node_mask (`torch.BoolTensor` of shape `(B, N)`, *optional*): real nodes (all if not given).
            return_dict (`bool`, defaults to `True`): return a [`GraphTransformerOutput`] or a tuple.
        """
        if node_classes.ndim != 2 or tuple(edge_classes.shape) != (*node_classes.shape, node_classes.shape[1]):
            raise ValueError(
                f"`node_classes` must be (B, N) and `edge_classes` (B, N, N), got {tuple(node_classes.shape)} and "
                f"{tuple(edge_classes.shape)}."
            )
        B, N = node_classes.shape
        if node_mask is None:
            node_mask = torch.ones(B, N, dtype=torch.bool, device=node_classes.device)
        node_mask = node_mask.bool()
        dtype = self.node_in.weight.dtype
        t = torch.as_tensor(timestep, device=node_classes.device, dtype=torch.float32)
        t = t.expand(B) if t.ndim == 0 else t.reshape(B)
        X = nn.functional.one_hot(node_classes, self.config.num_node_classes).to(dtype)
        E = nn.functional.one_hot(edge_classes, self.config.num_edge_classes).to(dtype)
        rw_node, rw_edge = random_walk_features(
            (edge_classes > 0).float(), node_mask, self.config.num_random_walk_steps
        )
        x = self.node_in(torch.cat([X, rw_node.to(dtype)], -1))
        e = self.edge_in(torch.cat([E, rw_edge.to(dtype)], -1))
        e = (e + e.transpose(1, 2)) / 2
        y = self.time_mlp(self._time_embedding(t).to(dtype))
        for layer in self.layers:
            x, e = layer(x, e, y, node_mask)
        node_logits = self.node_head(x)
        edge_logits = self.edge_head(e)
        edge_logits = (edge_logits + edge_logits.transpose(1, 2)) / 2
        if not return_dict:
            return (node_logits, edge_logits)
        return GraphTransformerOutput(node_logits=node_logits, edge_logits=edge_logits)
