"""SPADE's evolutionary search and acquisition functions (shared by the pipeline and the benchmark's baselines)."""

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ...utils import check_positive_int, public


ACQUISITIONS = ("lcb", "ei", "mvr")


def acquisition(
    samples: torch.Tensor, kind: str = "lcb", beta: float = 0.1, y_best: float = 0.0, xi: float = 0.0, lam: float = 0.1
) -> torch.Tensor:
    r"""
    An acquisition value per design from Monte-Carlo samples `(S, N)`: `"lcb"` `mu - beta sigma`, `"ei"` the Gaussian
    expected improvement over `y_best + xi`, `"mvr"` `mu - lam sigma^2` (`sigma` the population std, at least 1e-8).
    Returns `(N,)`.
    """
    if kind not in ACQUISITIONS:
        raise ValueError(f"`acquisition` must be one of {ACQUISITIONS}, got {kind!r}.")
    mean, std = samples.mean(0), samples.std(0, unbiased=False).clamp_min(1e-8)
    if kind == "lcb":
        return mean - beta * std
    if kind == "mvr":
        return mean - lam * std**2
    normal = torch.distributions.Normal(0.0, 1.0)
    gap = mean - y_best - xi
    z = gap / std
    return gap * normal.cdf(z) + std * normal.log_prob(z).exp()


@public
@dataclass
class EAConfig:
    r"""
    SPADE's evolutionary search: seed with the top `population_size` data points plus `N(0, init_noise)`; each
    generation keeps `elite_size` elites, fills `crossover_rate` of the other slots with blend crossovers
    `a p1 + (1 - a) p2` (`a ~ U(0, 1)`) and the rest with Gaussian mutations of an elite (std from `mutation_std`,
    times `mutation_decay` per generation, floored at `mutation_std_min`); children are clipped to the bounds.
    """

    population_size: int = 128
    elite_size: int = 64
    num_generations: int = 100
    crossover_rate: float = 0.3
    mutation_std: float = 0.12
    mutation_std_min: float = 0.02
    mutation_decay: float = 0.98
    init_noise: float = 0.05

    def __post_init__(self):
        for name in ("population_size", "elite_size", "num_generations"):
            check_positive_int(name, getattr(self, name))
        if self.elite_size > self.population_size:
            raise ValueError(
                f"`elite_size` ({self.elite_size}) must be <= `population_size` ({self.population_size})."
            )
        if not 0.0 <= self.crossover_rate <= 1.0:
            raise ValueError(f"`crossover_rate` must be in [0, 1], got {self.crossover_rate}.")


def evolutionary_search(
    score: Callable[[np.ndarray], np.ndarray],
    x: np.ndarray,
    y: np.ndarray,
    bounds: np.ndarray,
    config: EAConfig,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""
    Maximise `score` (designs `(P, D)` -> `(P,)`) with the EA of [`EAConfig`] in the box `bounds` `(2, D)`.

    Returns `(population, population_scores, best_x)`: the final population `(P, D)` and its scores, and the
    best-scored design seen.
    """
    size = min(config.population_size, x.shape[0])
    elites_n = min(config.elite_size, size)
    low, high = bounds[0], bounds[1]
    population = x[np.argsort(-y.reshape(-1), kind="stable")[:size]].astype(np.float64)
    population = np.clip(population + rng.normal(0.0, config.init_noise, population.shape), low, high)
    std = config.mutation_std
    best_x, best = population[0].copy(), -np.inf
    for _ in range(config.num_generations):
        scores = score(population)
        order = np.argsort(-scores, kind="stable")[:elites_n]
        elites = population[order]
        if scores[order[0]] > best:
            best, best_x = float(scores[order[0]]), elites[0].copy()
        num_cross = int((size - elites_n) * config.crossover_rate)
        first = elites[rng.integers(0, elites_n, num_cross)]
        second = elites[rng.integers(0, elites_n, num_cross)]
        alpha = rng.uniform(0.0, 1.0, (num_cross, 1))
        crosses = alpha * first + (1.0 - alpha) * second
        num_mut = size - elites_n - num_cross
        mutants = elites[rng.integers(0, elites_n, num_mut)] + rng.normal(0.0, std, (num_mut, x.shape[1]))
        population = np.clip(np.concatenate([elites, crosses, mutants]), low, high)
        std = max(std * config.mutation_decay, config.mutation_std_min)
    scores = score(population)
    if scores.max() > best:
        best_x = population[scores.argmax()].copy()
    return population, scores, best_x
