"""[`KnnSupport`]: the kNN statistics of SPADE's support term (mean neighbour score and k-th neighbour distance)."""

import numpy as np
import torch

from ...utils import check_positive_int, public


@public
class KnnSupport:
    r"""
    k-nearest-neighbour support statistics of a training set (Euclidean, scikit-learn's `NearestNeighbors`).

    `query(x)` returns, for each design, `ybar_k` (the mean score of its `k` nearest training points) and `r_k` (the
    distance to the `k`-th). A training point's own statistics (it is its own nearest neighbour, at distance 0) are
    cached at construction: `query(x, indices=i)` reads them instead of searching.

    Args:
        x (`np.ndarray` or `torch.Tensor` of shape `(N, D)`): the training designs (in the units the queries use).
        y (`np.ndarray` or `torch.Tensor` of shape `(N,)`): their scores.
        k (`int`, defaults to 10): the number of neighbours (at most `N`).
        cache (`bool`, defaults to True): precompute the training points' own statistics.
    """

    def __init__(self, x, y, k: int = 10, cache: bool = True):
        from sklearn.neighbors import NearestNeighbors

        x = _numpy(x, "x")
        y = _numpy(y, "y").reshape(-1)
        if x.ndim != 2:
            raise ValueError(f"`x` must have shape (N, D), got {x.shape}.")
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"`y` must have {x.shape[0]} entries (one per row of `x`), got {y.shape[0]}.")
        check_positive_int("k", k)
        if k > x.shape[0]:
            raise ValueError(f"`k` must be <= the number of training points ({x.shape[0]}), got {k}.")
        self.k = k
        self.y = y.astype(np.float32)
        self.index = NearestNeighbors(n_neighbors=k).fit(x.astype(np.float32))
        self.cached_mean = self.cached_radius = None
        if cache:
            self.cached_mean, self.cached_radius = self._search(x)

    def _search(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        distances, neighbours = self.index.kneighbors(x.astype(np.float32), n_neighbors=self.k)
        return self.y[neighbours].mean(1), distances[:, -1].astype(np.float32)

    def query(self, x, indices=None) -> tuple[torch.Tensor, torch.Tensor]:
        r"""
        Args:
            x (`torch.Tensor` or `np.ndarray` of shape `(M, D)`): query designs.
            indices (`torch.Tensor` of shape `(M,)`, *optional*): their rows in the training set, to read the cache.

        Returns:
            `(ybar_k, r_k)`, two float32 tensors of shape `(M,)` on `x`'s device (CPU for arrays).
        """
        device = x.device if isinstance(x, torch.Tensor) else torch.device("cpu")
        if indices is not None and self.cached_mean is not None:
            rows = _numpy(indices, "indices").astype(np.int64)
            mean, radius = self.cached_mean[rows], self.cached_radius[rows]
        else:
            mean, radius = self._search(_numpy(x, "x"))
        return torch.from_numpy(np.ascontiguousarray(mean)).to(device), torch.from_numpy(
            np.ascontiguousarray(radius)
        ).to(device)

    def log_radius(self, x) -> torch.Tensor:
        """`log(r_k + 1e-8)` of each query design, `(M,)`."""
        return torch.log(self.query(x)[1] + 1e-8)


def _numpy(value, name: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value
    raise TypeError(f"`{name}` must be a torch.Tensor or np.ndarray, got {type(value).__name__}.")
