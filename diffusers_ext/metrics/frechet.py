"""Fréchet distance between two feature sets modelled as Gaussians (the distance behind FID-style scores)."""

import numpy as np
import torch

from ..utils import check_finite
from ._validation import check_ndim, to_tensors


def _check_features(features: torch.Tensor, name: str) -> None:
    check_ndim(features, name, 2, "feature matrix (num_samples, feature_dim)")
    num_samples, feature_dim = features.shape
    if num_samples < 2:
        raise ValueError(
            f"`{name}` has shape {tuple(features.shape)}: {num_samples} sample(s); expected at least 2 samples to "
            "estimate a covariance."
        )
    if feature_dim < 1:
        raise ValueError(f"`{name}` has shape {tuple(features.shape)}; expected feature_dim >= 1.")
    check_finite(name, features)


def _statistics(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = features.to(torch.float64)
    mean = x.mean(dim=0)
    centered = x - mean
    covariance = centered.T @ centered / (x.shape[0] - 1)
    return mean, (covariance + covariance.T) / 2  # exactly symmetric despite the summation order of the matmul


def feature_statistics(features: torch.Tensor | np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    r"""
    The mean and unbiased covariance of a feature set, the Gaussian that Fréchet distances compare.

    Args:
        features (`torch.Tensor` or `np.ndarray` of shape `(num_samples, feature_dim)`): one feature vector per
            sample; at least 2 samples, all finite.

    Returns:
        `tuple(torch.Tensor, torch.Tensor)`: the mean of shape `(feature_dim,)` and the covariance
        `sum_i (x_i - mean)(x_i - mean)^T / (num_samples - 1)` of shape `(feature_dim, feature_dim)`, both float64 on
        the features' device.
    """
    (features,) = to_tensors(features=features)
    _check_features(features, "features")
    return _statistics(features)


def _tolerance(dtype: torch.dtype, dim: int) -> float:
    """Relative size of round-off that a `dim`-dimensional symmetric matrix of `dtype` may carry."""
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else torch.finfo(torch.float64).eps
    return 100.0 * dim * eps


def _check_statistics(mu: torch.Tensor, sigma: torch.Tensor, mu_name: str, sigma_name: str) -> None:
    check_ndim(mu, mu_name, 1, "mean vector (feature_dim,)")
    dim = mu.shape[0]
    if dim < 1:
        raise ValueError(f"`{mu_name}` has shape {tuple(mu.shape)}; expected feature_dim >= 1.")
    if tuple(sigma.shape) != (dim, dim):
        raise ValueError(
            f"`{sigma_name}` has shape {tuple(sigma.shape)} but `{mu_name}` has shape {tuple(mu.shape)}; expected a "
            f"covariance of shape ({dim}, {dim})."
        )
    check_finite(mu_name, mu)
    check_finite(sigma_name, sigma)
    scale = sigma.abs().max().item()
    asymmetry = (sigma - sigma.T).abs().max().item()
    if asymmetry > _tolerance(sigma.dtype, dim) * scale:
        raise ValueError(
            f"`{sigma_name}` is not symmetric (largest |sigma - sigma^T| is {asymmetry:.3g}, largest |entry| is "
            f"{scale:.3g}); expected a covariance matrix."
        )


def _psd_square_root(sigma: torch.Tensor, original_dtype: torch.dtype, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Return `(sqrt(sigma), eigenvalues)` of a symmetric float64 matrix, rejecting clearly indefinite input.

    Eigenvalues that are negative only by round-off are set to 0 (projection onto the positive semi-definite cone).
    """
    eigenvalues, eigenvectors = torch.linalg.eigh(sigma)
    largest = eigenvalues.abs().max().item()
    smallest = eigenvalues.min().item()
    if smallest < -_tolerance(original_dtype, sigma.shape[0]) * largest:
        raise ValueError(
            f"`{name}` is not positive semi-definite (smallest eigenvalue {smallest:.3g}, largest |eigenvalue| "
            f"{largest:.3g}); expected a covariance matrix."
        )
    eigenvalues = eigenvalues.clamp(min=0)
    return (eigenvectors * eigenvalues.sqrt()) @ eigenvectors.T, eigenvalues


def frechet_distance_from_statistics(
    mu1: torch.Tensor | np.ndarray,
    sigma1: torch.Tensor | np.ndarray,
    mu2: torch.Tensor | np.ndarray,
    sigma2: torch.Tensor | np.ndarray,
) -> float:
    r"""
    Fréchet (2-Wasserstein) distance between the Gaussians `N(mu1, sigma1)` and `N(mu2, sigma2)`:

        d = ||mu1 - mu2||^2 + tr(sigma1) + tr(sigma2) - 2 tr((sigma1 sigma2)^(1/2)).

    The trace of the matrix square root is computed stably in float64, without complex arithmetic:
    `tr((sigma1 sigma2)^(1/2)) = tr((S1 sigma2 S1)^(1/2))` with `S1 = sigma1^(1/2)`, and this equals the sum of the
    singular values of `S2 S1` (`S2 = sigma2^(1/2)`), whose small values SVD resolves to working precision. The
    symmetric square roots come from `torch.linalg.eigh`. Singular (rank-deficient) covariances, as from fewer
    samples than feature dimensions, are fine. A result below 0 by round-off only is returned as 0.

    Args:
        mu1 (`torch.Tensor` or `np.ndarray` of shape `(feature_dim,)`): mean of the first set.
        sigma1 (`torch.Tensor` or `np.ndarray` of shape `(feature_dim, feature_dim)`): its covariance (symmetric
            positive semi-definite up to round-off).
        mu2, sigma2: the same for the second set.

    Returns:
        `float`: the distance, >= 0.

    Raises:
        `ValueError`: on shape mismatches, non-finite values, or a sigma that is not symmetric or clearly not
            positive semi-definite.
    """
    mu1, sigma1, mu2, sigma2 = to_tensors(mu1=mu1, sigma1=sigma1, mu2=mu2, sigma2=sigma2)
    dtypes = {name: sigma.dtype for name, sigma in (("sigma1", sigma1), ("sigma2", sigma2))}
    _check_statistics(mu1, sigma1, "mu1", "sigma1")
    _check_statistics(mu2, sigma2, "mu2", "sigma2")
    if mu1.shape != mu2.shape:
        raise ValueError(
            f"`mu1` has shape {tuple(mu1.shape)} but `mu2` has shape {tuple(mu2.shape)}; expected the same "
            "feature_dim for both sets."
        )

    mu1, sigma1, mu2, sigma2 = (t.to(torch.float64) for t in (mu1, sigma1, mu2, sigma2))
    sqrt1, eigenvalues1 = _psd_square_root((sigma1 + sigma1.T) / 2, dtypes["sigma1"], "sigma1")
    sqrt2, eigenvalues2 = _psd_square_root((sigma2 + sigma2.T) / 2, dtypes["sigma2"], "sigma2")

    trace_sqrt = torch.linalg.svdvals(sqrt2 @ sqrt1).sum()
    trace1, trace2 = eigenvalues1.sum(), eigenvalues2.sum()
    diff = mu1 - mu2
    mean_term = diff @ diff
    distance = (mean_term + trace1 + trace2 - 2 * trace_sqrt).item()

    scale = (mean_term + trace1 + trace2).item()
    if distance < -(torch.finfo(torch.float64).eps ** 0.5) * scale:
        raise RuntimeError(
            f"The Fréchet distance came out at {distance:.6g}, negative beyond round-off (scale {scale:.3g}); the "
            "covariances are numerically degenerate."
        )
    return max(distance, 0.0)


def frechet_distance(features_a: torch.Tensor | np.ndarray, features_b: torch.Tensor | np.ndarray) -> float:
    r"""
    Fréchet distance between two feature sets, each summarised by its mean and unbiased covariance
    ([`feature_statistics`]); with Inception features this is FID, with any other extractor an FID-style score in
    that extractor's feature space.

    Args:
        features_a (`torch.Tensor` or `np.ndarray` of shape `(num_samples_a, feature_dim)`): the first set, at least
            2 samples.
        features_b (`torch.Tensor` or `np.ndarray` of shape `(num_samples_b, feature_dim)`): the second set, at least
            2 samples; the set sizes may differ.

    Returns:
        `float`: the distance, >= 0; 0 for identical sets and symmetric in its arguments.
    """
    features_a, features_b = to_tensors(features_a=features_a, features_b=features_b)
    _check_features(features_a, "features_a")
    _check_features(features_b, "features_b")
    if features_a.shape[1] != features_b.shape[1]:
        raise ValueError(
            f"`features_a` has shape {tuple(features_a.shape)} but `features_b` has shape "
            f"{tuple(features_b.shape)}; expected the same feature_dim for both sets."
        )
    mu_a, sigma_a = _statistics(features_a)
    mu_b, sigma_b = _statistics(features_b)
    return frechet_distance_from_statistics(mu_a, sigma_a, mu_b, sigma_b)
