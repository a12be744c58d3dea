"""Judging low-rank RNN connectivity against a known ground truth: attractors of the latent dynamics and sample
distances between loading distributions.

The attractor summaries run the deterministic latent dynamics of one network ([`LowRankRNN`]) from fixed initial
states and describe what they settle on:

- [`stable_fixed_points`]: end points of long runs, refined by Newton steps, kept if stable, merged if close;
- [`limit_cycle_summary`]: radius, radial spread, period and the fraction of runs still moving after a transient;
- [`ring_summary`]: radius, radial spread and angular coverage of runs started inside and outside the ring.

[`reproduces_attractor`] compares a resampled network's summary with the ground truth's within stated tolerances.
"""

import math

import torch
from scipy.optimize import linear_sum_assignment

from ..data.lrrnn import LowRankRNN, initial_state_grid, ring_initial_states
from ..metrics.sample_distances import mmd_squared, sliced_wasserstein


# Tolerances of [`reproduces_attractor`] (stated in the benchmark's report).
TOLERANCES = {
    "fixed_point_relative_distance": 0.2,  # each fixed point within 20% of its norm of the ground truth's
    "radius_relative_error": 0.15,  # cycle / ring radius within 15%
    "period_relative_error": 0.15,  # cycle period within 15%
    "max_radial_cv": 0.1,  # radial std / mean radius of the settled states
    "min_moving_fraction": 0.9,  # runs still moving on the cycle (not stuck at a fixed point)
    "min_ring_coverage": 0.75,  # fraction of 12 angular bins holding a settled state of the ring
}


def _jacobian(rnn: LowRankRNN, states: torch.Tensor) -> torch.Tensor:
    """Jacobians `(K, R, R)` of the continuous flow `-z + (1/N) n^T tanh(m z + d)` at `states` `(K, R)`."""
    currents = states @ rnn.input_loadings.T
    if rnn.bias is not None:
        currents = currents + rnn.bias
    gains = 1 - torch.tanh(currents).square()  # (K, N)
    jac = torch.einsum("nr,kn,ns->krs", rnn.output_loadings, gains, rnn.input_loadings) / rnn.num_neurons
    return jac - torch.eye(rnn.rank, dtype=states.dtype)


def stable_fixed_points(
    rnn: LowRankRNN,
    initial_states: torch.Tensor | None = None,
    num_steps: int = 400,
    newton_steps: int = 8,
    speed_tol: float = 1e-6,
    merge_tol: float = 0.05,
) -> torch.Tensor:
    """The stable fixed points the dynamics reach from `initial_states` (default: a 10 x 10 grid of `[-3, 3]^2`).

    Returns `(P, R)` float64 fixed points, sorted by angle: end points of `num_steps` steps refined by Newton steps
    on the flow, kept where the flow's speed is below `speed_tol` and every eigenvalue of its Jacobian has a negative
    real part, merged when closer than `merge_tol`.
    """
    rnn = LowRankRNN(rnn.input_loadings.double(), rnn.output_loadings.double(), rnn.alpha, rnn.bias)
    if initial_states is None:
        initial_states = initial_state_grid(10, 3.0, rnn.rank)
    states = rnn.simulate(initial_states, num_steps)[:, -1]
    for _ in range(newton_steps):
        step = torch.linalg.solve(_jacobian(rnn, states), rnn.velocity(states).unsqueeze(-1)).squeeze(-1)
        states = states - step
    speed = rnn.velocity(states).norm(dim=-1)
    stable = torch.linalg.eigvals(_jacobian(rnn, states)).real.max(dim=-1).values < 0
    kept = states[(speed < speed_tol) & stable & torch.isfinite(states).all(-1)]
    points = []
    for point in kept:
        if all((point - other).norm() > merge_tol for other in points):
            points.append(point)
    if not points:
        return torch.zeros(0, rnn.rank, dtype=torch.float64)
    points = torch.stack(points)
    return points[torch.argsort(torch.atan2(points[:, 1], points[:, 0]))]


def _angles(trajectories: torch.Tensor) -> torch.Tensor:
    return torch.atan2(trajectories[..., 1], trajectories[..., 0])


def limit_cycle_summary(
    rnn: LowRankRNN, initial_states: torch.Tensor | None = None, num_steps: int = 800, window: int = 400
) -> dict:
    """Radius, radial spread, period and moving fraction of the runs' last `window` steps (rank 2).

    `initial_states` default: a 6 x 6 grid of `[-2.4, 2.4]^2`. `radius` is the mean distance from the origin,
    `radial_cv` its std (over runs and steps) over the mean, `period` the window's steps per full turn (median over
    runs; `inf` if they do not turn), `moving_fraction` the fraction of runs whose last-step speed exceeds 1e-3.
    """
    rnn = LowRankRNN(rnn.input_loadings.double(), rnn.output_loadings.double(), rnn.alpha, rnn.bias)
    if initial_states is None:
        initial_states = initial_state_grid(6, 2.4, 2)
    late = rnn.simulate(initial_states, num_steps)[:, -window:]
    radii = late.norm(dim=-1)
    turns_per_step = torch.diff(_angles(late), dim=1)
    turns_per_step = (turns_per_step + math.pi) % (2 * math.pi) - math.pi
    turns = turns_per_step.sum(1).abs() / (2 * math.pi)
    period = float((window / turns.clamp(min=1e-12)).median())
    speed = rnn.velocity(late[:, -1]).norm(dim=-1)
    return {
        "radius": float(radii.mean()),
        "radial_cv": float(radii.std() / radii.mean().clamp(min=1e-12)),
        "period": period if math.isfinite(period) and period < 1e9 else float("inf"),
        "moving_fraction": float((speed > 1e-3).double().mean()),
    }


def ring_summary(rnn: LowRankRNN, num_steps: int = 60, num_bins: int = 12) -> dict:
    """Radius, radial spread and angular coverage of runs from 24 states on circles of radius 0.3 and 3 (rank 2).

    `coverage` is the fraction of `num_bins` equal angular bins holding at least one settled state (a ring keeps
    the runs' angles spread; a few discrete attractors would gather them). `num_steps` lets the radius settle (the
    radial relaxation is fast) while the slow drift along a finite network's ring has not yet gathered the runs.
    """
    rnn = LowRankRNN(rnn.input_loadings.double(), rnn.output_loadings.double(), rnn.alpha, rnn.bias)
    starts = torch.cat([ring_initial_states(0.3), ring_initial_states(3.0)])
    settled = rnn.simulate(starts, num_steps)[:, -1]
    radii = settled.norm(dim=-1)
    bins = ((_angles(settled) + math.pi) / (2 * math.pi) * num_bins).long().clamp(max=num_bins - 1)
    return {
        "radius": float(radii.mean()),
        "radial_cv": float(radii.std() / radii.mean().clamp(min=1e-12)),
        "coverage": len(set(bins.tolist())) / num_bins,
    }


def attractor_summary(kind: str, rnn: LowRankRNN) -> dict:
    """The summary of `kind` (`"fixed_points"`, `"limit_cycle"`, `"ring"`) of one network (JSON-serialisable)."""
    if kind == "fixed_points":
        return {"fixed_points": stable_fixed_points(rnn).tolist()}
    if kind == "limit_cycle":
        return limit_cycle_summary(rnn)
    if kind == "ring":
        return ring_summary(rnn)
    raise ValueError(f"`kind` must be 'fixed_points', 'limit_cycle' or 'ring', got {kind!r}.")


def _relative_error(value: float, reference: float) -> float:
    return abs(value - reference) / abs(reference) if reference else float("inf")


def reproduces_attractor(kind: str, summary: dict, reference: dict, tolerances: dict | None = None) -> bool:
    """Whether a network's attractor `summary` matches the ground truth's `reference` (both from
    [`attractor_summary`]) within `tolerances` (default `TOLERANCES`).

    - fixed points: the same count, and an assignment pairing each with a reference point within
      `fixed_point_relative_distance` of that point's norm;
    - limit cycle: radius and period within their relative errors, radial CV below its bound, and at least
      `min_moving_fraction` of runs still moving;
    - ring: radius within its relative error, radial CV below its bound, coverage at least `min_ring_coverage`.
    """
    tol = {**TOLERANCES, **(tolerances or {})}
    if kind == "fixed_points":
        found = torch.tensor(summary["fixed_points"], dtype=torch.float64).reshape(-1, 2)
        expected = torch.tensor(reference["fixed_points"], dtype=torch.float64).reshape(-1, 2)
        if len(found) != len(expected) or not len(expected):
            return False
        cost = torch.cdist(expected, found)
        rows, cols = linear_sum_assignment(cost.numpy())
        allowed = tol["fixed_point_relative_distance"] * expected.norm(dim=-1)
        return bool((cost[rows, cols] <= allowed[rows]).all())
    if kind == "limit_cycle":
        return (
            _relative_error(summary["radius"], reference["radius"]) <= tol["radius_relative_error"]
            and _relative_error(summary["period"], reference["period"]) <= tol["period_relative_error"]
            and summary["radial_cv"] <= tol["max_radial_cv"]
            and summary["moving_fraction"] >= tol["min_moving_fraction"]
        )
    if kind == "ring":
        return (
            _relative_error(summary["radius"], reference["radius"]) <= tol["radius_relative_error"]
            and summary["radial_cv"] <= tol["max_radial_cv"]
            and summary["coverage"] >= tol["min_ring_coverage"]
        )
    raise ValueError(f"`kind` must be 'fixed_points', 'limit_cycle' or 'ring', got {kind!r}.")


# Multiples of the median distance at which [`loading_distances`] judges (each alone and summed).
BANDWIDTH_FACTORS = (0.25, 0.5, 1.0, 2.0)


def loading_distances(samples: torch.Tensor, reference: torch.Tensor, bandwidth: float, seed: int = 0) -> dict:
    """Distances between neurons' loadings `samples` `(n, D)` and ground-truth draws `reference` `(m, D)`.

    Returns `{"mmd2", "mmd2_by_bandwidth", "sliced_w2"}`: the unbiased MMD^2 with the sum of Gaussian kernels of
    bandwidths `bandwidth * BANDWIDTH_FACTORS`; the MMD^2 with each of those kernels alone (keyed by its factor, e.g.
    `"0.25"`), since a method can win on the summed kernel while losing at one scale; and the sliced 2-Wasserstein
    distance over 256 directions drawn with `seed`."""
    bandwidths = [factor * bandwidth for factor in BANDWIDTH_FACTORS]
    generator = torch.Generator("cpu").manual_seed(seed)
    return {
        "mmd2": mmd_squared(samples, reference, bandwidths),
        "mmd2_by_bandwidth": {
            f"{factor:g}": mmd_squared(samples, reference, factor * bandwidth) for factor in BANDWIDTH_FACTORS
        },
        "sliced_w2": sliced_wasserstein(samples, reference, 256, generator),
    }
