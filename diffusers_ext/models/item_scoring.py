"""ItemScoringModel: the shared item side of distributional recommendation: an embedding and a bias per item, and
the score `u . e_i + b_i` of an item for a user embedding `u`. In federated training it is averaged across clients
(FedAvg); each client keeps its own interactions."""

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from torch import nn

from ..utils import check_positive_int, public


@public
class ItemScoringModel(ModelMixin, ConfigMixin):
    r"""
    The shared item side: an embedding and a bias per item; `scores(users)` gives `u . e_i + b_i` for every item.

    Parameters:
        num_items (`int`): the catalogue size.
        embedding_dim (`int`, defaults to 32): `d` (PFedRec's latent size).
    """

    @register_to_config
    def __init__(self, num_items: int, embedding_dim: int = 32):
        super().__init__()
        check_positive_int("num_items", num_items)
        check_positive_int("embedding_dim", embedding_dim)
        self.item_embeddings = nn.Embedding(num_items, embedding_dim)
        self.item_bias = nn.Embedding(num_items, 1)
        nn.init.normal_(self.item_embeddings.weight, std=0.1)
        nn.init.zeros_(self.item_bias.weight)

    def check_items(self, items: torch.Tensor, name: str = "items") -> torch.Tensor:
        """`items` as a long tensor, every index in `[0, num_items)`; a `ValueError` naming the first bad one."""
        items = torch.as_tensor(items)
        if items.numel() == 0:
            return items.long()
        if items.is_floating_point() or items.dtype == torch.bool:
            raise ValueError(f"`{name}` must hold integer item indices, got {items.dtype}.")
        bad = (items < 0) | (items >= self.config.num_items)
        if bad.any():
            raise ValueError(
                f"`{name}` holds item {int(items[bad][0])}, outside [0, {self.config.num_items}) (the catalogue)."
            )
        return items.long()

    def summary(self, interacted: list) -> torch.Tensor:
        """`(batch, embedding_dim)`: the mean embedding of each user's interacted items (a list of index lists or
        1-D tensors, each non-empty): the condition of [`UserEmbeddingDenoiser`]."""
        rows = []
        for index, items in enumerate(interacted):
            items = self.check_items(items, f"interacted[{index}]").reshape(-1)
            if len(items) == 0:
                raise ValueError(f"`interacted[{index}]` is empty; each user needs at least one interacted item.")
            rows.append(self.item_embeddings(items.to(self.device)).mean(0))
        return torch.stack(rows)

    def scores(self, users: torch.Tensor, items: torch.Tensor | None = None) -> torch.Tensor:
        """Logits `u . e_i + b_i`: `(..., num_items)` for every item, or `(..., m)` for `items` of shape `(..., m)`
        (e.g. one held-out item and its 99 negatives per user) with `users` of shape `(..., embedding_dim)`."""
        if items is None:
            return users @ self.item_embeddings.weight.T + self.item_bias.weight[:, 0]
        items = self.check_items(items).to(users.device)
        embeddings = self.item_embeddings(items)  # (..., m, d)
        return (embeddings @ users.unsqueeze(-1)).squeeze(-1) + self.item_bias(items)[..., 0]
