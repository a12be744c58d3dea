"""Probabilistic forecast scores of EpiDiff's benchmark: MAE, RMSE, CRPS (quantile form), MIS and coverage.

Every function takes forecast draws `samples` of shape `(N, S, ...)` (`N` windows, `S` draws) and outcomes `target`
of shape `(N, ...)`, and scores each window, so a benchmark can put a standard error over windows on every
difference between two methods.
"""

import numpy as np


QUANTILE_LEVELS = tuple(round(0.05 * k, 2) for k in range(1, 20))


def _check(samples: np.ndarray, target: np.ndarray, observed=None):
    samples, target = np.asarray(samples, dtype=np.float64), np.asarray(target, dtype=np.float64)
    if samples.ndim < 2 or samples.shape[:1] + samples.shape[2:] != target.shape:
        raise ValueError(
            f"`samples` must have shape (N, S, ...) matching `target` {target.shape}, got {samples.shape}."
        )
    if observed is None:
        observed = np.ones(target.shape, dtype=bool)
    else:
        observed = np.asarray(observed)
        if observed.shape != target.shape or observed.dtype != bool:
            raise ValueError(
                f"`observed` must be a bool array of the target's shape {target.shape}, got "
                f"{observed.dtype} of shape {observed.shape}."
            )
    return samples, target, observed


def quantile_loss(samples: np.ndarray, target: np.ndarray, levels=QUANTILE_LEVELS, observed=None) -> np.ndarray:
    """Per window, `2 * sum over observed points and levels of rho_q(y - q)` divided by the number of levels, with
    `rho_q(u) = u (q - 1[u < 0])` and `q` the draws' empirical quantile: shape `(N,)`. `observed` (bool, the
    target's shape; default all) marks the points that count."""
    samples, target, observed = _check(samples, target, observed)
    quantiles = np.quantile(samples, levels, axis=1)  # (L, N, ...)
    diff = target[None] - quantiles
    levels = np.asarray(levels).reshape((-1,) + (1,) * target.ndim)
    loss = 2 * diff * (levels - (diff < 0))
    return (loss.mean(0) * observed).reshape(len(target), -1).sum(1)


def window_scores(samples: np.ndarray, target: np.ndarray, alpha: float = 0.05, observed=None) -> dict:
    """Per-window `{"abs_error", "sq_error", "quantile_loss", "abs_target", "interval_score", "covered_90",
    "points"}`, each of shape `(N,)`: sums over the window's observed points, except the means `covered_90` and
    `interval_score` (over its observed points) and `points`, their count.

    The point forecast is the draws' mean. The interval score at `alpha` is `U - L + (2 / alpha)((L - y)+ + (y - U)+)`
    of the central `1 - alpha` interval; `covered_90` is the share of points inside the central 90 % interval.
    `observed` (bool, the target's shape; default all) marks the targets that were observed: a filled-in target is
    not scored."""
    samples, target, observed = _check(samples, target, observed)
    n = len(target)
    mean = samples.mean(1)
    low, high = np.quantile(samples, [alpha / 2, 1 - alpha / 2], axis=1)
    low90, high90 = np.quantile(samples, [0.05, 0.95], axis=1)
    interval = high - low + (2 / alpha) * (np.maximum(low - target, 0) + np.maximum(target - high, 0))
    flat = lambda x: x.reshape(n, -1)  # noqa: E731
    mask = flat(observed)
    points = mask.sum(1)
    per_point = lambda x: flat(x * observed).sum(1) / np.maximum(points, 1)  # noqa: E731
    return {
        "abs_error": flat(np.abs(mean - target) * observed).sum(1),
        "sq_error": flat((mean - target) ** 2 * observed).sum(1),
        "quantile_loss": quantile_loss(samples, target, observed=observed),
        "abs_target": flat(np.abs(target) * observed).sum(1),
        "interval_score": per_point(interval),
        "covered_90": per_point((target >= low90) & (target <= high90)),
        "points": points,
    }


def summarize_scores(scores: dict, points_per_window: int | None = None) -> dict:
    """`{"mae", "rmse", "crps", "mis", "coverage_90"}` from [`window_scores`] (CRPS normalised by `sum |y|`), over
    the observed points: MAE and RMSE divide by their count (`scores["points"]`; `points_per_window` per window
    for scores recorded without it), MIS and coverage weight each window by its observed points."""
    if "points" in scores:
        points = np.asarray(scores["points"], dtype=np.float64)
    else:
        points = np.full(len(scores["abs_error"]), float(points_per_window))
    count = max(float(points.sum()), 1.0)
    return {
        "mae": float(np.sum(scores["abs_error"]) / count),
        "rmse": float(np.sqrt(np.sum(scores["sq_error"]) / count)),
        "crps": float(np.sum(scores["quantile_loss"]) / max(float(np.sum(scores["abs_target"])), 1e-12)),
        "mis": float(np.sum(np.asarray(scores["interval_score"]) * points) / count),
        "coverage_90": float(np.sum(np.asarray(scores["covered_90"]) * points) / count),
    }


def gamma_draws(mean: np.ndarray, variance: np.ndarray, num_samples: int, seed: int = 0) -> np.ndarray:
    """`num_samples` draws of a gamma distribution with the given mean and variance (a mechanistic forecast's
    predictive distribution): shape `(N, num_samples, ...)` for `mean` of shape `(N, ...)`."""
    mean, variance = np.maximum(np.asarray(mean, dtype=np.float64), 1e-8), np.asarray(variance, dtype=np.float64)
    shape = mean**2 / np.maximum(variance, 1e-12)
    rng = np.random.default_rng(seed)
    draws = rng.gamma(shape[:, None], (mean / shape)[:, None], size=(mean.shape[0], num_samples) + mean.shape[1:])
    return draws
