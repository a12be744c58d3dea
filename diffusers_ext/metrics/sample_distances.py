"""Distances between two sets of samples of a distribution: kernel MMD and sliced Wasserstein.

Both take `(n, d)` and `(m, d)` sample sets (torch tensors or numpy arrays) and compute in float64.
"""

import torch

from ..utils import check_finite, check_positive_int


def _as_samples(name: str, samples) -> torch.Tensor:
    samples = torch.as_tensor(samples).to(torch.float64)
    if samples.ndim != 2 or samples.shape[0] < 2:
        raise ValueError(f"`{name}` must have shape (num_samples >= 2, dim), got {tuple(samples.shape)}.")
    check_finite(name, samples)
    return samples


def _pair(x, y) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = _as_samples("x", x), _as_samples("y", y)
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"`x` and `y` must have the same dim, got {x.shape[1]} and {y.shape[1]}.")
    return x, y


def median_bandwidth(samples) -> float:
    """The median heuristic: the median pairwise Euclidean distance of `samples` `(n, d)` (at most 2000 used)."""
    samples = _as_samples("samples", samples)[:2000]
    distances = torch.cdist(samples, samples)
    upper = distances[torch.triu_indices(len(samples), len(samples), offset=1).unbind()]
    return float(upper.median())


def mmd_squared(x, y, bandwidths: float | list[float]) -> float:
    """Unbiased estimate of the squared MMD between the distributions of samples `x` `(n, d)` and `y` `(m, d)`.

    The kernel is a sum of Gaussian kernels `exp(-|a - b|^2 / (2 h^2))` over `bandwidths` `h` (fix them once per
    comparison, e.g. from [`median_bandwidth`] of the reference sample, so every method is judged by one kernel).
    The estimate is unbiased, so it may be slightly negative when the distributions agree.
    """
    x, y = _pair(x, y)
    bandwidths = [bandwidths] if isinstance(bandwidths, (int, float)) else list(bandwidths)
    if not bandwidths or not all(isinstance(h, (int, float)) and h > 0 for h in bandwidths):
        raise ValueError(f"`bandwidths` must be positive numbers, got {bandwidths!r}.")

    def kernel(a, b):
        squared = torch.cdist(a, b).square()
        return sum(torch.exp(-squared / (2 * h * h)) for h in bandwidths)

    n, m = len(x), len(y)
    kxx, kyy, kxy = kernel(x, x), kernel(y, y), kernel(x, y)
    xx = (kxx.sum() - kxx.diagonal().sum()) / (n * (n - 1))
    yy = (kyy.sum() - kyy.diagonal().sum()) / (m * (m - 1))
    return float(xx + yy - 2 * kxy.mean())


def sliced_wasserstein(
    x, y, num_projections: int = 256, generator: torch.Generator | None = None, p: int = 2
) -> float:
    """Sliced `p`-Wasserstein distance: `(E_theta W_p^p(theta . x, theta . y))^(1/p)` over random unit directions.

    Each 1-D distance compares the two sets' quantiles at the same `max(n, m)` levels (exact for equal sizes).

    Args:
        x (`(n, d)`), y (`(m, d)`): the samples.
        num_projections (`int`, defaults to 256): random directions.
        generator (`torch.Generator`, *optional*): draws the directions (seed it to compare methods on the same ones).
        p (`int`, defaults to 2): the order.
    """
    x, y = _pair(x, y)
    check_positive_int("num_projections", num_projections)
    check_positive_int("p", p)
    directions = torch.randn(x.shape[1], num_projections, generator=generator, dtype=torch.float64)
    directions = directions / directions.norm(dim=0, keepdim=True)
    levels = torch.linspace(0, 1, max(len(x), len(y)), dtype=torch.float64)
    qx = torch.quantile(x @ directions, levels, dim=0)
    qy = torch.quantile(y @ directions, levels, dim=0)
    return float((qx - qy).abs().pow(p).mean().pow(1.0 / p))
