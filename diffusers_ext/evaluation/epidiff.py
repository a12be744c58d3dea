"""Probabilistic forecast scores of EpiDiff's benchmark: MAE, RMSE, CRPS (quantile form), MIS and coverage.

Every function takes forecast draws `samples` of shape `(N, S, ...)` (`N` windows, `S` draws) and outcomes `target`
of shape `(N, ...)`, and scores each window, so a benchmark can put a standard error over windows on every
difference between two methods.
"""

import numpy as np


QUANTILE_LEVELS = tuple(round(0.05 * k, 2) for k in range(1, 20))


def _check(samples: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    samples, target = np.asarray(samples, dtype=np.float64), np.asarray(target, dtype=np.float64)
    if samples.ndim < 2 or samples.shape[:1] + samples.shape[2:] != target.shape:
        raise ValueError(
            f"`samples` must have shape (N, S, ...) matching `target` {target.shape}, got {samples.shape}."
        )
    return samples, target


def quantile_loss(samples: np.ndarray, target: np.ndarray, levels=QUANTILE_LEVELS) -> np.ndarray:
    """Per window, `2 * sum over points and levels of rho_q(y - q)` divided by the number of levels, with
    `rho_q(u) = u (q - 1[u < 0])` and `q` the draws' empirical quantile: shape `(N,)`."""
    samples, target = _check(samples, target)
    quantiles = np.quantile(samples, levels, axis=1)  # (L, N, ...)
    diff = target[None] - quantiles
    levels = np.asarray(levels).reshape((-1,) + (1,) * target.ndim)
    loss = 2 * diff * (levels - (diff < 0))
    return loss.mean(0).reshape(len(target), -1).sum(1)


def window_scores(samples: np.ndarray, target: np.ndarray, alpha: float = 0.05) -> dict:
    """Per-window `{"abs_error", "sq_error", "quantile_loss", "abs_target", "interval_score", "covered_90"}`,
    each of shape `(N,)` (sums over the window's points, except the means `covered_90` and `interval_score`).

    The point forecast is the draws' mean. The interval score at `alpha` is `U - L + (2 / alpha)((L - y)+ + (y - U)+)`
    of the central `1 - alpha` interval; `covered_90` is the share of points inside the central 90 % interval."""
    samples, target = _check(samples, target)
    n = len(target)
    mean = samples.mean(1)
    low, high = np.quantile(samples, [alpha / 2, 1 - alpha / 2], axis=1)
    low90, high90 = np.quantile(samples, [0.05, 0.95], axis=1)
    interval = high - low + (2 / alpha) * (np.maximum(low - target, 0) + np.maximum(target - high, 0))
    flat = lambda x: x.reshape(n, -1)  # noqa: E731
    return {
        "abs_error": flat(np.abs(mean - target)).sum(1),
        "sq_error": flat((mean - target) ** 2).sum(1),
        "quantile_loss": quantile_loss(samples, target),
        "abs_target": flat(np.abs(target)).sum(1),
        "interval_score": flat(interval).mean(1),
        "covered_90": flat((target >= low90) & (target <= high90)).mean(1),
    }


def summarize_scores(scores: dict, points_per_window: int) -> dict:
    """`{"mae", "rmse", "crps", "mis", "coverage_90"}` from [`window_scores`] (CRPS normalised by `sum |y|`)."""
    count = len(scores["abs_error"]) * points_per_window
    return {
        "mae": float(np.sum(scores["abs_error"]) / count),
        "rmse": float(np.sqrt(np.sum(scores["sq_error"]) / count)),
        "crps": float(np.sum(scores["quantile_loss"]) / max(float(np.sum(scores["abs_target"])), 1e-12)),
        "mis": float(np.mean(scores["interval_score"])),
        "coverage_90": float(np.mean(scores["covered_90"])),
    }


def gamma_draws(mean: np.ndarray, variance: np.ndarray, num_samples: int, seed: int = 0) -> np.ndarray:
    """`num_samples` draws of a gamma distribution with the given mean and variance (a mechanistic forecast's
    predictive distribution): shape `(N, num_samples, ...)` for `mean` of shape `(N, ...)`."""
    mean, variance = np.maximum(np.asarray(mean, dtype=np.float64), 1e-8), np.asarray(variance, dtype=np.float64)
    shape = mean**2 / np.maximum(variance, 1e-12)
    rng = np.random.default_rng(seed)
    draws = rng.gamma(shape[:, None], (mean / shape)[:, None], size=(mean.shape[0], num_samples) + mean.shape[1:])
    return draws
