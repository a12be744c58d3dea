"""The mechanistic forecast that steers EpiDiff: a per-node SIR/SI model fitted by MAP, its Laplace posterior and an
unscented-transform forecast, rolled forward on its own predictions; and the map from its uncertainty to guidance
strength.

For every node and window (one row of `history`, shape `(M, T_h)`), independently and vectorised over rows:

1. [`fit_sir_map`]: the MAP of `eta = (log R0, log T_inf)` in a box, with `beta = R0 / T_inf`, `gamma = 1 / T_inf`,
   under a negative-binomial likelihood of the observed incidence (size `dispersion`, variance `mu + mu^2 / size`)
   and a Gaussian prior centred on the box (standard deviation the box's half-width, at least 0.5). The expected
   incidence `mu_t` of the two variants, both anchored so that `mu_0 = y_0`:
   - `"si"`: the compartment `I` is the incidence itself and `S = N` stays fixed:
     `I_{t+1} = I_t + beta I_t - gamma I_t`, `mu_t = I_t`.
   - `"sir"`: `S_0 = susceptible_fraction * N`, new infections `c_t = beta S_t I_t / N`, `S_{t+1} = S_t - c_t`,
     `I_{t+1} = I_t + c_t - gamma I_t`, `mu_t = c_t`.
   The optimum is found on a grid over the box and refined by damped Newton steps (central differences).
2. [`laplace_covariance`]: the inverse of the negative log posterior's Hessian at the MAP (central differences,
   eigenvalues clipped from below so it is positive definite).
3. [`unscented_forecast`]: the `2L + 1 = 5` sigma points of the Laplace posterior (`alpha`, `beta`, `kappa = 3 - L`
   by default); each predicts the next step's incidence, rescaled by `clip(y_last / mu_last, 0.3, 3)`; the points
   farthest from the centre in `log1p` space (a `trim_fraction` of them) are replaced by the centre's forecast (a
   robust filter that keeps the weights' sum at 1); the point forecast is the weighted geometric mean (in `log1p`)
   and the variance the weighted variance plus the negative-binomial observation variance.
4. [`mechanistic_forecast`]: the `T_p`-step forecast by rolling one step at a time, each step refitted on the history
   extended by the forecast's **own** previous predictions (the fit window keeps its length and slides one step;
   never the true future: the reference code's SIR variant
   appends the observed future there, which turns its multi-step forecast into a chain of one-step forecasts on
   ground truth). The Laplace covariance is recomputed every `hessian_every` steps. Forecasts that are not finite,
   exceed `1e6` or exceed 100 times the history mean fall back to the history mean and its negative-binomial
   variance.

[`fit_sigma_bounds`] and [`uncertainty_to_sigma`] turn the variance `u` into the per-point guidance `sigma`: the
bounds are percentiles of `log u` over **training** windows only (the reference code falls back to test-window
percentiles).
"""

from dataclasses import dataclass

import numpy as np

from ...utils import check_positive_int, is_number, public


VARIANTS = ("si", "sir")
# the smallest variance reported (a series of zeros has a zero negative-binomial variance)
VARIANCE_FLOOR = 1e-6


@public
@dataclass
class MechanisticConfig:
    """Settings of the mechanistic forecast (defaults suit weekly data; the reference's daily runs used
    `r0_bounds=(0.8, 5)` and `infectious_bounds=(2, 10)`).

    Args:
        variant (`str`, defaults to `"si"`): `"si"` or `"sir"` (see the module docstring).
        population (`float`, defaults to 1e5): `N` (1e5 for rates per 100k).
        susceptible_fraction (`float`, defaults to 0.5): `S_0 / N` of the `"sir"` variant.
        r0_bounds (`tuple`, defaults to `(0.5, 4.0)`): the box of `R0`.
        infectious_bounds (`tuple`, defaults to `(1.0, 8.0)`): the box of `T_inf`, in steps.
        dispersion (`float`, defaults to 5.0): the negative-binomial size.
        grid_size (`int`, defaults to 21): grid points per parameter of the initial search.
        newton_steps (`int`, defaults to 6): damped Newton refinements after the grid.
        hessian_eps (`float`, defaults to 5e-4): the central-difference step.
        min_eigenvalue (`float`, defaults to 1e-2): the Hessian's eigenvalue floor.
        ut_alpha (`float`, defaults to 0.2), ut_beta (`float`, defaults to 2.0), ut_kappa (`float`, *optional*,
            default `3 - L`): the unscented transform's spread and weights.
        trim_fraction (`float`, defaults to 0.15): the share of sigma points replaced by the centre's forecast.
        scale_bounds (`tuple`, defaults to `(0.3, 3.0)`): the clip of the last-step rescaling `y_last / mu_last`.
        hessian_every (`int`, defaults to 4): steps of the rolling forecast between two Laplace covariances.
        fit_length (`int`, *optional*): fit on the last `fit_length` steps of the (extended) history only (a local
            growth rate); default the whole history.
    """

    variant: str = "si"
    population: float = 1e5
    susceptible_fraction: float = 0.5
    r0_bounds: tuple = (0.5, 4.0)
    infectious_bounds: tuple = (1.0, 8.0)
    dispersion: float = 5.0
    grid_size: int = 21
    newton_steps: int = 6
    hessian_eps: float = 5e-4
    min_eigenvalue: float = 1e-2
    ut_alpha: float = 0.2
    ut_beta: float = 2.0
    ut_kappa: float | None = None
    trim_fraction: float = 0.15
    scale_bounds: tuple = (0.3, 3.0)
    hessian_every: int = 4
    fit_length: int | None = None

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"`variant` must be one of {VARIANTS}, got {self.variant!r}.")
        for name in ("population", "dispersion", "hessian_eps", "min_eigenvalue", "ut_alpha"):
            value = getattr(self, name)
            if not is_number(value) or value <= 0:
                raise ValueError(f"`{name}` must be a positive number, got {value!r}.")
        if not is_number(self.susceptible_fraction) or not 0 < self.susceptible_fraction <= 1:
            raise ValueError(f"`susceptible_fraction` must lie in (0, 1], got {self.susceptible_fraction!r}.")
        for name in ("r0_bounds", "infectious_bounds", "scale_bounds"):
            low, high = getattr(self, name)
            if not (is_number(low) and is_number(high) and 0 < low < high):
                raise ValueError(f"`{name}` must be (low, high) with 0 < low < high, got {getattr(self, name)!r}.")
        check_positive_int("grid_size", self.grid_size, minimum=2)
        check_positive_int("newton_steps", self.newton_steps, minimum=0)
        check_positive_int("hessian_every", self.hessian_every)
        if self.fit_length is not None:
            check_positive_int("fit_length", self.fit_length, minimum=2)
        if not is_number(self.trim_fraction) or not 0 <= self.trim_fraction < 0.5:
            raise ValueError(f"`trim_fraction` must lie in [0, 0.5), got {self.trim_fraction!r}.")

    @property
    def box(self) -> np.ndarray:
        """`(2, 2)`: rows `(low, high)` of `log R0` and `log T_inf`."""
        return np.log(np.array([self.r0_bounds, self.infectious_bounds], dtype=np.float64))


def _check_history(history) -> np.ndarray:
    history = np.asarray(history, dtype=np.float64)
    if history.ndim != 2 or history.shape[1] < 2:
        raise ValueError(f"`history` must have shape (num_series, history_length >= 2), got {history.shape}.")
    if not np.all(np.isfinite(history)) or np.any(history < 0):
        raise ValueError("`history` must hold finite non-negative incidence.")
    return history


def expected_incidence(eta: np.ndarray, first: np.ndarray, steps: int, config: MechanisticConfig) -> np.ndarray:
    """`mu_t` for `t = 0 .. steps - 1` of each parameter row.

    Args:
        eta (`np.ndarray` of shape `(M, K, 2)`): `(log R0, log T_inf)` of `K` candidates per series.
        first (`np.ndarray` of shape `(M,)`): the anchor `mu_0` of each series (its first observation).
        steps (`int`): the length.

    Returns:
        `np.ndarray` of shape `(M, K, steps)`.
    """
    r0, duration = np.exp(eta[..., 0]), np.exp(eta[..., 1])
    beta, gamma = r0 / duration, 1.0 / duration
    anchor = np.maximum(first, 0.5)[:, None] * np.ones_like(beta)
    out = np.empty(beta.shape + (steps,))
    if config.variant == "si":
        growth = np.maximum(1.0 + beta - gamma, 1e-6)
        out[...] = anchor[..., None] * growth[..., None] ** np.arange(steps)
        return out
    n = config.population
    s = np.full_like(beta, config.susceptible_fraction * n)
    i = anchor * n / (beta * s)
    for t in range(steps):
        new = np.minimum(beta * s * i / n, s)
        out[..., t] = new
        s = s - new
        i = i + new - gamma * i
    return out


def negative_log_posterior(eta: np.ndarray, history: np.ndarray, config: MechanisticConfig) -> np.ndarray:
    """`-log p(history | eta) - log p(eta)` up to a constant, for `eta` of shape `(M, K, 2)` and `history` `(M, T)`;
    returns `(M, K)`."""
    mu = np.maximum(expected_incidence(eta, history[:, 0], history.shape[1], config), 1e-8)
    y = history[:, None, :]
    k = config.dispersion
    loglik = y * np.log(mu / (k + mu)) + k * np.log(k / (k + mu))
    box = config.box
    centre, scale = box.mean(1), np.maximum((box[:, 1] - box[:, 0]) / 2, 0.5)
    logprior = -0.5 * (((eta - centre) / scale) ** 2).sum(-1)
    return -(loglik.sum(-1) + logprior)


def _derivatives(eta: np.ndarray, history: np.ndarray, config: MechanisticConfig):
    """Central-difference gradient `(M, 2)` and Hessian `(M, 2, 2)` of the negative log posterior at `eta` `(M, 2)`."""
    e = config.hessian_eps
    offsets = np.array([[0, 0], [e, 0], [-e, 0], [0, e], [0, -e], [e, e], [e, -e], [-e, e], [-e, -e]])
    f = negative_log_posterior(eta[:, None, :] + offsets, history, config)
    grad = np.stack([(f[:, 1] - f[:, 2]) / (2 * e), (f[:, 3] - f[:, 4]) / (2 * e)], -1)
    h00 = (f[:, 1] - 2 * f[:, 0] + f[:, 2]) / e**2
    h11 = (f[:, 3] - 2 * f[:, 0] + f[:, 4]) / e**2
    h01 = (f[:, 5] - f[:, 6] - f[:, 7] + f[:, 8]) / (4 * e**2)
    hessian = np.stack([np.stack([h00, h01], -1), np.stack([h01, h11], -1)], -2)
    return grad, hessian


def _clip_eigen(hessian: np.ndarray, floor: float) -> np.ndarray:
    values, vectors = np.linalg.eigh(hessian)
    return (vectors * np.maximum(values, floor)[..., None, :]) @ np.swapaxes(vectors, -1, -2)


@public
def fit_sir_map(
    history: np.ndarray, config: MechanisticConfig | None = None, init: np.ndarray | None = None
) -> np.ndarray:
    """The MAP `eta = (log R0, log T_inf)` of every series.

    Args:
        history (`np.ndarray` of shape `(M, T)`): observed incidence, one series per row.
        config ([`MechanisticConfig`], *optional*): the model; default `MechanisticConfig()`.
        init (`np.ndarray` of shape `(M, 2)`, *optional*): a warm start; the grid search is skipped when given.

    Returns:
        `np.ndarray` of shape `(M, 2)`, inside the box.
    """
    config = config or MechanisticConfig()
    history = _check_history(history)
    box = config.box
    if init is None:
        axes = [np.linspace(low, high, config.grid_size) for low, high in box]
        grid = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 2)
        values = negative_log_posterior(np.broadcast_to(grid, (len(history),) + grid.shape), history, config)
        eta = grid[np.argmin(values, 1)]
    else:
        eta = np.clip(np.asarray(init, dtype=np.float64).reshape(len(history), 2), box[:, 0], box[:, 1])
    current = negative_log_posterior(eta[:, None], history, config)[:, 0]
    for _ in range(config.newton_steps):
        grad, hessian = _derivatives(eta, history, config)
        step = -np.linalg.solve(_clip_eigen(hessian, config.min_eigenvalue), grad[..., None])[..., 0]
        for damping in (1.0, 0.5, 0.25):
            trial = np.clip(eta + damping * step, box[:, 0], box[:, 1])
            value = negative_log_posterior(trial[:, None], history, config)[:, 0]
            better = value < current
            eta = np.where(better[:, None], trial, eta)
            current = np.where(better, value, current)
            step = np.where(better[:, None], 0.0, step)
    return eta


@public
def laplace_covariance(eta: np.ndarray, history: np.ndarray, config: MechanisticConfig | None = None) -> np.ndarray:
    """The Laplace posterior covariance `(M, 2, 2)` at `eta` `(M, 2)`: the inverse eigen-clipped Hessian."""
    config = config or MechanisticConfig()
    history = _check_history(history)
    _, hessian = _derivatives(np.asarray(eta, dtype=np.float64), history, config)
    return np.linalg.inv(_clip_eigen(hessian, config.min_eigenvalue))


def _sigma_points(eta: np.ndarray, covariance: np.ndarray, config: MechanisticConfig):
    """`(points (M, 2L+1, 2), mean weights (2L+1,), covariance weights (2L+1,))`."""
    size = eta.shape[-1]
    kappa = 3.0 - size if config.ut_kappa is None else config.ut_kappa
    lam = config.ut_alpha**2 * (size + kappa) - size
    root = np.linalg.cholesky((size + lam) * covariance + 1e-12 * np.eye(size))  # (M, L, L), columns = directions
    directions = np.swapaxes(root, -1, -2)
    points = np.concatenate([eta[:, None], eta[:, None] + directions, eta[:, None] - directions], 1)
    weights = np.full(2 * size + 1, 1.0 / (2 * (size + lam)))
    weights[0] = lam / (size + lam)
    cov_weights = weights.copy()
    cov_weights[0] += 1 - config.ut_alpha**2 + config.ut_beta
    return points, weights, cov_weights


@public
def unscented_forecast(
    eta: np.ndarray, covariance: np.ndarray, history: np.ndarray, config: MechanisticConfig | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The next step's `(mean (M,), variance (M,))` of each series from its posterior `(eta, covariance)`."""
    config = config or MechanisticConfig()
    history = _check_history(history)
    points, weights, cov_weights = _sigma_points(np.asarray(eta, dtype=np.float64), covariance, config)
    steps = history.shape[1]
    mu = expected_incidence(points, history[:, 0], steps + 1, config)  # (M, P, T + 1)
    low, high = config.scale_bounds
    scale = np.clip(history[:, -1:] / np.maximum(mu[..., steps - 1], 1e-8), low, high)
    forecast = np.maximum(mu[..., steps] * scale, 0.0)  # (M, P)
    trim = int(round(config.trim_fraction * forecast.shape[1]))
    logs = np.log1p(forecast)
    if trim:
        distance = np.abs(logs - logs[:, :1])
        distance[:, 0] = -np.inf
        far = np.argsort(-distance, axis=1)[:, :trim]
        np.put_along_axis(logs, far, logs[:, :1].repeat(trim, 1), axis=1)
    mean = np.expm1(logs @ weights).clip(min=0.0)
    spread = np.maximum((np.expm1(logs) - mean[:, None]) ** 2 @ cov_weights, 0.0)
    return mean, np.maximum(spread + mean + mean**2 / config.dispersion, VARIANCE_FLOOR)


@public
@dataclass
class MechanisticForecast:
    """Result of [`mechanistic_forecast`].

    Args:
        mean (`np.ndarray` of shape `(M, horizon)`): the point forecast.
        variance (`np.ndarray` of shape `(M, horizon)`): its variance `u`.
        parameters (`np.ndarray` of shape `(M, 2)`): the MAP `(log R0, log T_inf)` on the observed history.
        fallback (`np.ndarray` of shape `(M, horizon)`, bool): where the history-mean fallback was used.
    """

    mean: np.ndarray
    variance: np.ndarray
    parameters: np.ndarray
    fallback: np.ndarray


@public
def mechanistic_forecast(
    history: np.ndarray, horizon: int, config: MechanisticConfig | None = None
) -> MechanisticForecast:
    """The `horizon`-step mechanistic forecast of every series, rolled forward on its own predictions.

    Only `history` is read: each step's fit sees the observed history followed by the forecast's previous point
    predictions, never an observed future value.

    Args:
        history (`np.ndarray` of shape `(M, T_h)`): observed incidence up to the forecast origin (e.g. one row per
            node and window: `windows.past.reshape(-1, T_h)`).
        horizon (`int`): steps to forecast.
        config ([`MechanisticConfig`], *optional*): the model.
    """
    config = config or MechanisticConfig()
    history = _check_history(history)
    check_positive_int("horizon", horizon)
    extended = history.copy()
    means, variances, fallbacks = [], [], []
    reference = history.mean(1)
    covariance = None
    start = 0 if config.fit_length is None else max(history.shape[1] - config.fit_length, 0)
    parameters = fit_sir_map(history[:, start:], config)
    eta = parameters
    for step in range(horizon):
        window = extended[:, start + step :]
        if step:
            eta = fit_sir_map(window, config, init=eta)
        if step % config.hessian_every == 0 or covariance is None:
            covariance = laplace_covariance(eta, window, config)
        mean, variance = unscented_forecast(eta, covariance, window, config)
        bad = ~np.isfinite(mean) | ~np.isfinite(variance) | (mean > 1e6) | (mean > 100 * np.maximum(reference, 1e-8))
        mean = np.where(bad, reference, mean)
        variance = np.where(bad, np.maximum(reference + reference**2 / config.dispersion, VARIANCE_FLOOR), variance)
        means.append(mean)
        variances.append(variance)
        fallbacks.append(bad)
        extended = np.concatenate([extended, mean[:, None]], 1)
    return MechanisticForecast(
        mean=np.stack(means, 1),
        variance=np.stack(variances, 1),
        parameters=parameters,
        fallback=np.stack(fallbacks, 1),
    )


@public
def fit_sigma_bounds(train_variance: np.ndarray, percentiles: tuple[float, float] = (10.0, 90.0)) -> tuple:
    """`(low, high)`: percentiles of `log u` over the **training** windows' mechanistic variances.

    Args:
        train_variance (`np.ndarray`, any shape): `u` of training windows only (never validation or test ones).
        percentiles (`tuple`, defaults to `(10, 90)`): the two percentiles.
    """
    values = np.asarray(train_variance, dtype=np.float64).ravel()
    if values.size < 2 or not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise ValueError("`train_variance` must hold at least two finite positive variances.")
    if len(percentiles) != 2 or not 0 <= percentiles[0] < percentiles[1] <= 100:
        raise ValueError(f"`percentiles` must be (low, high) with 0 <= low < high <= 100, got {percentiles!r}.")
    low, high = np.percentile(np.log(values), percentiles)
    if not high > low:
        high = low + 1e-6
    return float(low), float(high)


@public
def uncertainty_to_sigma(
    variance, bounds: tuple, sigma_min: float = 0.15, sigma_max: float = 2.5, tau: float = 1.0
) -> np.ndarray:
    """The per-point guidance `sigma = sigma_min (sigma_max / sigma_min)^norm(log u) * tau`, with
    `norm(log u) = clip((log u - low) / (high - low), 0, 1)`: a confident point (small `u`) gets a small `sigma`, hence
    a strong pull towards the mechanistic forecast.

    Args:
        variance (array of any shape): `u`.
        bounds (`tuple`): `(low, high)` from [`fit_sigma_bounds`] on training windows.
        sigma_min (`float`), sigma_max (`float`): the range of `sigma`.
        tau (`float`, defaults to 1): a common factor.
    """
    if len(bounds) != 2 or not all(is_number(b) for b in bounds) or not bounds[1] > bounds[0]:
        raise ValueError(f"`bounds` must be (low, high) with low < high, got {bounds!r}.")
    for name, value in (("sigma_min", sigma_min), ("sigma_max", sigma_max), ("tau", tau)):
        if not is_number(value) or value <= 0:
            raise ValueError(f"`{name}` must be a positive number, got {value!r}.")
    if sigma_max < sigma_min:
        raise ValueError(f"`sigma_max` ({sigma_max}) must be >= `sigma_min` ({sigma_min}).")
    log_u = np.log(np.maximum(np.asarray(variance, dtype=np.float64), 1e-300))
    low, high = bounds
    norm = np.clip((log_u - low) / (high - low), 0.0, 1.0)
    return sigma_min * (sigma_max / sigma_min) ** norm * tau
