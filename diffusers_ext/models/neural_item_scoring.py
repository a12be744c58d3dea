"""NeuralItemScoringModel: the shared item side of neural collaborative filtering (NeuMF, as FedNCF federates it): a
user embedding `u` meets each item's embedding `e_i` in a generalised matrix factorisation branch (`u * e_i`) and an
MLP branch (`MLP([u, e_i])`), a linear layer fuses the two, plus the item's bias. The item embeddings, the MLP and
the fusion are shared (averaged across clients); the user embedding stays on its client."""

import torch
from diffusers.configuration_utils import register_to_config
from torch import nn

from ..utils import check_positive_int, public
from .item_scoring import ItemScoringModel


@public
class NeuralItemScoringModel(ItemScoringModel):
    r"""
    NeuMF's scoring of items for user embeddings, with the interface of [`ItemScoringModel`] (`scores`, `summary`,
    `check_items`), so the federated trainer runs it as FedNCF's shared model.

    Parameters:
        num_items (`int`): the catalogue size.
        embedding_dim (`int`, defaults to 32): `d`, of users and items.
        hidden_size (`int`, defaults to 64): the width of the MLP branch (two layers, ReLU).
    """

    @register_to_config
    def __init__(self, num_items: int, embedding_dim: int = 32, hidden_size: int = 64):
        super().__init__(num_items, embedding_dim)
        check_positive_int("hidden_size", hidden_size)
        self.mlp = nn.Sequential(
            nn.Linear(2 * embedding_dim, hidden_size), nn.ReLU(), nn.Linear(hidden_size, embedding_dim), nn.ReLU()
        )
        self.fuse = nn.Linear(2 * embedding_dim, 1, bias=False)

    def scores(self, users: torch.Tensor, items: torch.Tensor | None = None) -> torch.Tensor:
        """Logits `fuse([u * e_i, MLP([u, e_i])]) + b_i`: `(..., num_items)` for every item, or `(..., m)` for
        `items` of shape `(..., m)` with `users` of shape `(..., embedding_dim)`."""
        if items is None:
            embeddings = self.item_embeddings.weight.expand(*users.shape[:-1], -1, -1)  # (..., N, d)
            bias = self.item_bias.weight[:, 0]
        else:
            items = self.check_items(items).to(users.device)
            embeddings = self.item_embeddings(items)  # (..., m, d)
            bias = self.item_bias(items)[..., 0]
        users = users.unsqueeze(-2).expand_as(embeddings)
        mlp = self.mlp(torch.cat([users, embeddings], dim=-1))
        return self.fuse(torch.cat([users * embeddings, mlp], dim=-1))[..., 0] + bias
