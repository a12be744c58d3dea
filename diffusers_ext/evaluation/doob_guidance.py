"""What measures Doob guidance on Navigation2D: the exact judge and the comparison-only baselines.

- [`judge`]: exact segment-circle collisions, map bounds, goal distance, path-length ratio to the shortest feasible
  path (grid A* + line-of-sight shortcutting), jerk.
- [`projection_guidance`]: the per-step projection baseline (each step's `x0` prediction pushed out of the discs).
- [`model_evaluations_per_candidate`]: what one candidate of each compared method costs in network evaluations
  (shared by the planner and the digits benchmarks, so their budgets are counted alike).
- [`plan_with_budget`]: a method given a budget of model evaluations per plan draws as many candidate plans as the
  budget pays for and keeps the first that satisfies the constraint (rejection sampling on top of any sampler).
"""

import torch

from ..data import navigation2d as nav
from ..pipelines.doob_guidance.guidance import NoiseLevels
from ..pipelines.pipeline_utils import PREDICTION_TYPES, prediction_to_epsilon


def judge(trajectories: torch.Tensor, goal: torch.Tensor, obstacles: torch.Tensor, shortest: float) -> dict:
    """Per-plan verdicts of `trajectories` `(B, H, 2)`: `satisfied` (no collision, in the map, last waypoint within
    0.02 of `goal`), `collided`, `goal_error`, `length_ratio` (length / `shortest`), `jerk` (lists of `B`)."""
    collided = nav.collides(trajectories, obstacles)
    goal_error = (trajectories[:, -1] - goal).norm(dim=1)
    satisfied = ~collided & (goal_error <= 0.02)
    return {
        "satisfied": satisfied.tolist(),
        "collided": collided.tolist(),
        "goal_error": goal_error.tolist(),
        "length_ratio": (nav.path_length(trajectories) / shortest).tolist(),
        "jerk": nav.jerk(trajectories).tolist(),
    }


def project_out_of_discs(x0: torch.Tensor, obstacles: torch.Tensor, margin: float) -> torch.Tensor:
    """Model-layout `(B, 2, H)` waypoints moved radially to `radius + margin` where closer to a disc's centre, then
    clamped to the map."""
    points = x0.transpose(1, 2).clone()
    for cx, cy, r in obstacles.tolist():
        centre = torch.tensor([cx, cy], dtype=points.dtype)
        offset = points - centre
        distance = offset.norm(dim=-1, keepdim=True).clamp_min(1e-6)
        inside = distance < r + margin
        points = torch.where(inside, centre + offset / distance * (r + margin), points)
    return points.clamp(-1, 1).transpose(1, 2)


def projection_guidance(pipe, obstacles: torch.Tensor, margin: float):
    """A `model_fn` for the planner's loop whose `x0` prediction is projected out of the discs at every step (the
    output is rewritten so the scheduler steps towards the projected `x0`)."""
    levels = NoiseLevels(pipe.scheduler)

    def model_fn(x, t):
        output = pipe.model_fn(x, t)
        a, b = levels.coefficients(t[0], x.shape[0], x.device)
        _, x0 = levels.split(output, x, a, b)
        x0 = project_out_of_discs(x0, obstacles, margin)
        signal, noise = a.view(-1, 1, 1).to(x), b.view(-1, 1, 1).to(x).clamp_min(1e-6)
        eps = prediction_to_epsilon(x0, x, signal, noise, "sample", PREDICTION_TYPES)
        return levels.merge(eps, x0, a, b)

    return model_fn


def model_evaluations_per_candidate(method: str, setting: dict, steps: int) -> int:
    """Network evaluations one candidate of `method` costs over `steps` sampling steps: a forward per step, plus a
    backward per step where the guidance differentiates through the network (`"dps"`, Doob's `"tweedie"` and its
    `"path_integral"` with `jacobian="model"`); one-jump rollouts need no extra forward. `setting` holds Doob's
    `"estimator"` (and `"jacobian"`); any other method (unguided, rejection, projection) costs `steps`."""
    if method == "dps":
        return 2 * steps
    if method == "doob":
        backward = setting["estimator"] == "tweedie" or (
            setting["estimator"] == "path_integral" and setting.get("jacobian", "identity") == "model"
        )
        return steps * (2 if backward else 1)
    return steps


def plan_with_budget(
    plan_once, cost: float, budget: float, satisfied, score=None
) -> tuple[torch.Tensor, torch.Tensor, list]:
    """Rejection on top of a sampler: `k = max(1, budget // cost)` calls of `plan_once(i) -> (B, ...)` candidates.

    Without `score`, each item keeps its first candidate that `satisfied((B, ...)) -> (B,)` accepts (else its first
    candidate), and the calls stop once every item has one. With `score((B, ...)) -> (B,)`, all `k` calls are made and
    each item keeps its highest-scoring candidate (the first on ties).

    Returns `(chosen (B, ...), accepted (B,) of the chosen, [per-call outputs])`.
    """
    calls = max(1, int(budget // cost))
    outputs, chosen, accepted, best = [], None, None, None
    for i in range(calls):
        plans = plan_once(i)
        outputs.append(plans)
        ok = satisfied(plans)
        if score is not None:
            values = score(plans)
            if chosen is None:
                chosen, accepted, best = plans.clone(), ok.clone(), values.clone()
            else:
                take = values > best
                chosen[take], accepted[take], best[take] = plans[take], ok[take], values[take]
            continue
        if chosen is None:
            chosen, accepted = plans.clone(), ok.clone()
        else:
            take = ~accepted & ok
            chosen[take] = plans[take]
            accepted |= ok
        if bool(accepted.all()):
            break
    return chosen, accepted, outputs
