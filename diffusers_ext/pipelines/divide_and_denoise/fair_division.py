r"""Fair division of the positions of a sample among several agents (diffusion models).

Agents are the `K` models, goods are the `N` positions of the (latent) sample, and `utilities[k, j] >= 0` says how
much agent `k` wants position `j`. An *allocation* `X` has `X[k, j] >= 0` and every column summing to 1 (each
position is fully shared out, possibly fractionally). Agent `k`'s utility for the bundle `X_l` is
`U_k(X_l) = sum_j utilities[k, j] * X[l, j]`.

Solvers (all vectorised over a leading batch dimension except `"lp"`):

- `"proportional_response"`: the Eisenberg–Gale / Nash-welfare allocation (competitive equilibrium from budgets
  `B_k`) by proportional-response dynamics (Zhang 2011): `b[k, j] <- B_k * u[k, j] x[k, j] / U_k`, prices
  `p_j = sum_k b[k, j]`, `x[k, j] = b[k, j] / p_j`. At the fixed point each agent gets at least its budget share of
  its own total utility (proportional) and, with equal budgets, envies nobody (envy-free); the iterates converge
  to it (at a rate of about `1 / iterations` in Nash welfare).
- `"sinkhorn"`: entropic optimal transport, `max <u, X> + tau H(X)` with columns summing to 1 and row `k` summing to
  `capacities[k] * N` (each agent's share of the area), in the log domain.
- `"lp"`: the exact linear programme (scipy HiGHS) maximising total utility subject to proportionality
  (`U_k(X_k) >= B_k * sum_j u[k, j]`), optionally envy-freeness (equal budgets) and capacities. A reference for small
  problems.
- `"argmax"`: each position goes to the agent that values it most (ties split evenly): the utilitarian optimum, with
  no fairness guarantee. The unfair baseline.

[`FairDivisionAllocator`] wraps them with the options a sampler needs: warm starts across steps, spatial smoothing of
the allocation maps and an optional late anneal to a hard split. [`fairness_report`] measures the properties.
"""

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ...utils import check_positive_int, is_number, public


SOLVERS = ("proportional_response", "sinkhorn", "lp", "argmax")

_TINY = 1e-30


def _check_utilities(utilities) -> torch.Tensor:
    if not isinstance(utilities, torch.Tensor):
        raise TypeError(f"`utilities` must be a torch.Tensor, got {type(utilities).__name__}.")
    if utilities.ndim < 2:
        raise ValueError(
            f"`utilities` must have shape (..., num_agents, num_positions...), got shape {tuple(utilities.shape)}."
        )
    if not utilities.is_floating_point():
        raise TypeError(f"`utilities` must be a floating tensor, got dtype {utilities.dtype}.")
    if utilities.shape[-1] == 0 or utilities.shape[-2] == 0:
        raise ValueError(f"`utilities` has an empty dimension: shape {tuple(utilities.shape)}.")
    if not torch.isfinite(utilities).all():
        raise ValueError("`utilities` must be finite.")
    if (utilities < 0).any():
        raise ValueError(f"`utilities` must be >= 0, got a minimum of {utilities.min().item():.4g}.")
    return utilities


def _check_shares(name: str, shares, num_agents: int, dtype, device) -> torch.Tensor | None:
    """`None`, or a `(num_agents,)` tensor of positive shares summing to 1 (given values are normalised)."""
    if shares is None:
        return None
    values = torch.as_tensor(shares, dtype=torch.float64)
    if values.ndim != 1 or values.numel() != num_agents:
        raise ValueError(f"`{name}` must have one entry per agent ({num_agents}), got {shares!r}.")
    if not torch.isfinite(values).all() or (values <= 0).any():
        raise ValueError(f"`{name}` must be positive and finite, got {shares!r}.")
    return (values / values.sum()).to(dtype=dtype, device=device)


def _uniform_where_nobody_cares(allocation: torch.Tensor, column_total: torch.Tensor) -> torch.Tensor:
    """Positions that no agent values (all utilities 0) are split evenly."""
    empty = column_total <= 0
    if empty.any():
        allocation = torch.where(empty, torch.full_like(allocation, 1.0 / allocation.shape[1]), allocation)
    return allocation


def argmax_allocation(utilities: torch.Tensor) -> torch.Tensor:
    """Give each position to the agent(s) valuing it most; ties are split evenly. Shape `(B, K, N)` in and out."""
    best = utilities.amax(dim=1, keepdim=True)
    winners = (utilities >= best).to(utilities.dtype)
    return winners / winners.sum(dim=1, keepdim=True)


def proportional_response(
    utilities: torch.Tensor,
    budgets: torch.Tensor | None = None,
    num_iterations: int = 100,
    tol: float = 1e-7,
    warm_start: torch.Tensor | None = None,
) -> torch.Tensor:
    """Nash-welfare (Eisenberg–Gale) allocation by proportional-response dynamics. Shape `(B, K, N)` in and out.

    Args:
        utilities: `(B, K, N)` non-negative utilities.
        budgets: `(K,)` budget shares summing to 1; equal budgets when `None`.
        num_iterations: maximum number of proportional-response rounds.
        tol: stop when no entry of the allocation moves by more than `tol` in one round.
        warm_start: `(B, K, N)` allocation to start from (e.g. the previous sampling step's); bids start at
            `B_k * u x / U_k` of it. Entries that are exactly 0 stay 0 under the dynamics, so the warm start is mixed
            with 1% of the uniform split to keep every position reachable.
    """
    batch, num_agents, num_positions = utilities.shape
    if budgets is None:
        budgets = torch.full((num_agents,), 1.0 / num_agents, dtype=utilities.dtype, device=utilities.device)
    budgets = budgets.view(1, num_agents, 1)
    column_total = utilities.sum(dim=1, keepdim=True)
    # An agent that values nothing bids its budget evenly (it is indifferent; this keeps prices positive).
    agent_total = utilities.sum(dim=2, keepdim=True)
    util = torch.where(agent_total > 0, utilities, torch.ones_like(utilities))

    if warm_start is not None:
        x = 0.99 * warm_start + 0.01 / num_agents
    else:
        x = torch.full_like(util, 1.0 / num_agents)
    # Each batch item stops on its own once it has converged, so a batch gives exactly its items' single results.
    active = torch.ones(batch, 1, 1, dtype=torch.bool, device=utilities.device)
    for _ in range(num_iterations):
        gains = util * x
        value = gains.sum(dim=2, keepdim=True)
        bids = budgets * gains / value.clamp_min(_TINY)
        prices = bids.sum(dim=1, keepdim=True)
        new_x = bids / prices.clamp_min(_TINY)
        # A position nobody bids on (every bidder values it 0) is split evenly; it is worth nothing to anyone.
        new_x = torch.where(prices > 0, new_x, torch.full_like(new_x, 1.0 / num_agents))
        delta = (new_x - x).abs().amax(dim=(1, 2), keepdim=True)
        x = torch.where(active, new_x, x)
        active = active & (delta > tol)
        if not active.any():
            break
    return _uniform_where_nobody_cares(x, column_total)


def sinkhorn(
    utilities: torch.Tensor,
    capacities: torch.Tensor | None = None,
    tau: float = 0.05,
    num_iterations: int = 200,
    tol: float = 1e-6,
    warm_start: torch.Tensor | None = None,
) -> torch.Tensor:
    """Entropic-OT allocation `max <u, X> + tau H(X)`, columns summing to 1, rows to `capacities * N`.

    Utilities are divided by their maximum (per batch item) first, so `tau` is relative to the largest utility.

    Args:
        utilities: `(B, K, N)` non-negative utilities.
        capacities: `(K,)` area shares summing to 1; equal shares when `None`.
        tau: entropy weight (smaller: closer to the hard, utility-maximising transport plan).
        num_iterations: maximum number of Sinkhorn rounds (one row and one column scaling each).
        tol: stop when the row sums are within `tol * N` of their targets.
        warm_start: `(B, K, N)` allocation from the previous step; its log row scaling seeds the dual variables.
    """
    batch, num_agents, num_positions = utilities.shape
    if capacities is None:
        capacities = torch.full((num_agents,), 1.0 / num_agents, dtype=utilities.dtype, device=utilities.device)
    scale = utilities.flatten(1).amax(dim=1).clamp_min(_TINY).view(batch, 1, 1)
    log_kernel = utilities / scale / tau
    log_rows = torch.log(capacities * num_positions).view(1, num_agents, 1)
    f = torch.zeros(batch, num_agents, 1, dtype=utilities.dtype, device=utilities.device)
    if warm_start is not None:
        # X = softmax_k(log_kernel + f) gives f_k - f_l = log(X_k / X_l) - (log_kernel_k - log_kernel_l) at every
        # position; the average over positions of log X - log_kernel recovers the previous potentials.
        f = (torch.log(warm_start.clamp_min(1e-12)) - log_kernel).mean(dim=2, keepdim=True)
    active = torch.ones(batch, 1, 1, dtype=torch.bool, device=utilities.device)  # per-item stopping, as above
    for _ in range(num_iterations):
        log_x = log_kernel + f
        log_x = log_x - torch.logsumexp(log_x, dim=1, keepdim=True)  # columns sum to 1
        row_error = torch.logsumexp(log_x, dim=2, keepdim=True) - log_rows
        active = active & ((row_error.exp() - 1).abs().amax(dim=1, keepdim=True) > tol)
        if not active.any():
            break
        f = torch.where(active, f - row_error, f)  # rows hit their capacities
    log_x = log_kernel + f
    return torch.softmax(log_x, dim=1)


def lp_allocation(
    utilities: torch.Tensor,
    budgets: torch.Tensor | None = None,
    capacities: torch.Tensor | None = None,
    envy_free: bool = True,
) -> torch.Tensor:
    """Exact max-total-utility allocation under fairness constraints (scipy HiGHS), one LP per batch item.

    Constraints: columns sum to 1; proportionality `U_k(X_k) >= B_k * sum_j u[k, j]`; with `envy_free` (requires
    equal budgets) `U_k(X_k) >= U_k(X_l)` for all `k != l`; with `capacities`, row `k` sums to
    `capacities[k] * N`. Intended for small problems (`K * N` up to a few thousand variables).
    """
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix, vstack

    batch, num_agents, num_positions = utilities.shape
    if budgets is None:
        budgets = torch.full((num_agents,), 1.0 / num_agents, dtype=torch.float64)
    budgets_np = budgets.detach().cpu().double().numpy()
    n_vars = num_agents * num_positions  # variable index: k * N + j
    cols = np.arange(n_vars)
    # Equalities: every position's column sums to 1 (and capacities, when given).
    eq_rows = np.tile(np.arange(num_positions), num_agents)
    a_eq = coo_matrix((np.ones(n_vars), (eq_rows, cols)), shape=(num_positions, n_vars))
    b_eq = np.ones(num_positions)
    if capacities is not None:
        cap = capacities.detach().cpu().double().numpy() * num_positions
        a_cap = coo_matrix(
            (np.ones(n_vars), (np.repeat(np.arange(num_agents), num_positions), cols)), shape=(num_agents, n_vars)
        )
        a_eq = vstack([a_eq, a_cap])
        b_eq = np.concatenate([b_eq, cap])
    out = []
    for b in range(batch):
        u = utilities[b].detach().cpu().double().numpy()
        ub_blocks, b_ub = [], []
        for k in range(num_agents):
            # -U_k(X_k) <= -B_k * total_k
            row = np.zeros(n_vars)
            row[k * num_positions : (k + 1) * num_positions] = -u[k]
            ub_blocks.append(row)
            b_ub.append(-budgets_np[k] * u[k].sum())
            if envy_free:
                for other in range(num_agents):
                    if other == k:
                        continue
                    row = np.zeros(n_vars)
                    row[k * num_positions : (k + 1) * num_positions] = -u[k]
                    row[other * num_positions : (other + 1) * num_positions] = u[k]
                    ub_blocks.append(row)
                    b_ub.append(0.0)
        result = linprog(
            -u.reshape(-1),
            A_ub=np.stack(ub_blocks),
            b_ub=np.asarray(b_ub),
            A_eq=a_eq.tocsr(),
            b_eq=b_eq,
            bounds=(0, 1),
            method="highs",
        )
        if not result.success:
            raise ValueError(f"the fair-division LP is infeasible or failed for batch item {b}: {result.message}")
        out.append(torch.from_numpy(result.x.reshape(num_agents, num_positions)))
    return torch.stack(out).to(dtype=utilities.dtype, device=utilities.device)


def gaussian_blur(maps: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of `(B, K, H, W)` maps with reflect padding (radius `ceil(3 sigma)`)."""
    if sigma <= 0:
        return maps
    radius = max(1, int(np.ceil(3 * sigma)))
    offsets = torch.arange(-radius, radius + 1, dtype=maps.dtype, device=maps.device)
    kernel = torch.exp(-(offsets**2) / (2 * sigma**2))

    def taps(pad: int) -> torch.Tensor:  # the kernel cut to the padding a small side allows, renormalised
        cut = kernel[radius - pad : radius + pad + 1]
        return cut / cut.sum()

    batch, channels, height, width = maps.shape
    flat = maps.reshape(batch * channels, 1, height, width)
    pad_h, pad_w = min(radius, height - 1), min(radius, width - 1)
    if pad_w > 0:
        flat = F.pad(flat, (pad_w, pad_w, 0, 0), mode="reflect")
        flat = F.conv2d(flat, taps(pad_w).view(1, 1, 1, -1))
    if pad_h > 0:
        flat = F.pad(flat, (0, 0, pad_h, pad_h), mode="reflect")
        flat = F.conv2d(flat, taps(pad_h).view(1, 1, -1, 1))
    return flat.reshape(batch, channels, height, width)


@dataclass
class FairnessReport:
    """Fairness measures of an allocation (each a `(B,)` tensor, or `(B, K)` per agent).

    Attributes:
        welfare: total utility `sum_k U_k(X_k)`.
        nash_welfare: `sum_k B_k log U_k(X_k)` (the Eisenberg–Gale objective).
        proportionality: per agent, `U_k(X_k) / (B_k * sum_j u[k, j])`; `>= 1` means proportional.
        max_envy: `max_{k != l} (U_k(X_l) - U_k(X_k)) / sum_j u[k, j]`; `<= 0` means envy-free (`-inf` for one agent).
        shares: per agent, the share of positions it holds, `sum_j X[k, j] / N`.
        column_error: `max_j |sum_k X[k, j] - 1|`.
    """

    welfare: torch.Tensor
    nash_welfare: torch.Tensor
    proportionality: torch.Tensor
    max_envy: torch.Tensor
    shares: torch.Tensor
    column_error: torch.Tensor


def fairness_report(utilities: torch.Tensor, allocation: torch.Tensor, budgets=None) -> FairnessReport:
    """Measure an allocation `(B, K, ...)` against utilities of the same shape (trailing dims are positions)."""
    u = utilities.reshape(utilities.shape[0], utilities.shape[1], -1).double()
    x = allocation.reshape(u.shape).double()
    num_agents = u.shape[1]
    shares = _check_shares("budgets", budgets, num_agents, torch.float64, u.device)
    if shares is None:
        shares = torch.full((num_agents,), 1.0 / num_agents, dtype=torch.float64, device=u.device)
    cross = torch.einsum("bkn,bln->bkl", u, x)  # cross[b, k, l] = U_k(X_l)
    own = torch.diagonal(cross, dim1=1, dim2=2)
    total = u.sum(dim=2).clamp_min(_TINY)
    envy = (cross - own.unsqueeze(2)) / total.unsqueeze(2)
    envy = envy.masked_fill(torch.eye(num_agents, dtype=torch.bool, device=u.device), -float("inf"))
    return FairnessReport(
        welfare=own.sum(dim=1),
        nash_welfare=(shares * torch.log(own.clamp_min(_TINY))).sum(dim=1),
        proportionality=own / (shares * total),
        max_envy=envy.flatten(1).amax(dim=1),
        shares=x.mean(dim=2),
        column_error=(x.sum(dim=1) - 1).abs().amax(dim=1),
    )


@public
class FairDivisionAllocator:
    r"""
    Divide the positions of a sample among `K` agents (models) by a fair-division solver, step after step.

    Call it with utilities of shape `(batch, K, H, W)` (or `(batch, K, N)`); it returns an allocation of the same shape
    whose entries are in [0, 1] and sum to 1 over the agent dimension.

    Args:
        solver (`str`, defaults to `"proportional_response"`): one of `"proportional_response"` (Nash welfare /
            competitive equilibrium: proportional and, with equal budgets, envy-free), `"sinkhorn"` (entropic OT with
            per-agent `capacities`), `"lp"` (exact max-utility LP under proportionality and envy-freeness; small
            problems only) and `"argmax"` (per-position argmax, the unfair baseline).
        budgets (`list[float]`, *optional*): per-agent budget shares for `"proportional_response"` and `"lp"`
            (normalised to sum to 1); equal when omitted.
        capacities (`list[float]`, *optional*): per-agent area shares for `"sinkhorn"` (required area) and `"lp"`
            (optional); equal for `"sinkhorn"` when omitted.
        tau (`float`, defaults to 0.05): Sinkhorn entropy weight, relative to the largest utility.
        num_iterations (`int`, defaults to 100): iterations of the iterative solvers.
        tol (`float`, defaults to 1e-6): early-stopping tolerance of the iterative solvers.
        envy_free (`bool`, defaults to `True`): add envy-freeness constraints to `"lp"` (needs equal budgets).
        spatial_sigma (`float`, defaults to 0.0): standard deviation, in positions, of a Gaussian blur of the
            allocation maps after solving (columns are renormalised). Needs `(batch, K, H, W)` input.
        anneal_start (`float`, *optional*): sampling progress in [0, 1] after which the allocation is sharpened
            towards the hard argmax split: `X ** (1 / T)` renormalised with `T` going linearly from 1 at `anneal_start`
            to 0 (a hard split) at progress 1.
    """

    def __init__(
        self,
        solver: str = "proportional_response",
        budgets=None,
        capacities=None,
        tau: float = 0.05,
        num_iterations: int = 100,
        tol: float = 1e-6,
        envy_free: bool = True,
        spatial_sigma: float = 0.0,
        anneal_start: float | None = None,
    ):
        if solver not in SOLVERS:
            raise ValueError(f"`solver` must be one of {SOLVERS}, got {solver!r}.")
        if not is_number(tau) or not tau > 0:
            raise ValueError(f"`tau` must be a positive number, got {tau!r}.")
        check_positive_int("num_iterations", num_iterations)
        if not is_number(tol) or tol < 0:
            raise ValueError(f"`tol` must be a number >= 0, got {tol!r}.")
        if not is_number(spatial_sigma) or spatial_sigma < 0:
            raise ValueError(f"`spatial_sigma` must be a number >= 0, got {spatial_sigma!r}.")
        if anneal_start is not None and (not is_number(anneal_start) or not 0 <= anneal_start < 1):
            raise ValueError(f"`anneal_start` must be None or a number in [0, 1), got {anneal_start!r}.")
        for name, value in (("budgets", budgets), ("capacities", capacities)):
            if value is not None:
                array = np.asarray(value, dtype=np.float64)
                if array.ndim != 1 or array.size < 1 or not np.isfinite(array).all() or (array <= 0).any():
                    raise ValueError(f"`{name}` must be a 1-D sequence of positive numbers, got {value!r}.")
        if budgets is not None and solver in ("sinkhorn", "argmax"):
            raise ValueError(f"`budgets` apply to 'proportional_response' and 'lp', not to solver {solver!r}.")
        if capacities is not None and solver in ("proportional_response", "argmax"):
            raise ValueError(f"`capacities` apply to 'sinkhorn' and 'lp', not to solver {solver!r}.")
        if solver == "lp" and envy_free and budgets is not None and len(set(np.round(budgets, 12))) > 1:
            raise ValueError("`envy_free=True` needs equal `budgets` for solver 'lp'; pass envy_free=False.")
        self.solver = solver
        self.budgets = None if budgets is None else list(map(float, budgets))
        self.capacities = None if capacities is None else list(map(float, capacities))
        self.tau = float(tau)
        self.num_iterations = num_iterations
        self.tol = float(tol)
        self.envy_free = bool(envy_free)
        self.spatial_sigma = float(spatial_sigma)
        self.anneal_start = None if anneal_start is None else float(anneal_start)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"

    def __call__(
        self, utilities: torch.Tensor, warm_start: torch.Tensor | None = None, progress: float | None = None
    ) -> torch.Tensor:
        """Allocate.

        Args:
            utilities (`torch.Tensor` of shape `(batch, K, H, W)` or `(batch, K, N)`): non-negative utilities.
            warm_start (`torch.Tensor` of the same shape, *optional*): the previous allocation, to start the iterative
                solvers from (ignored by `"lp"` and `"argmax"`).
            progress (`float`, *optional*): sampling progress in [0, 1] (0 at the first step, 1 at the last), for the
                late anneal. Without it no anneal is applied.

        Returns:
            `torch.Tensor` of the shape of `utilities`: the allocation, summing to 1 over dim 1.
        """
        utilities = _check_utilities(utilities)
        if utilities.ndim not in (3, 4):
            raise ValueError(
                f"`utilities` must have shape (batch, K, H, W) or (batch, K, N), got {tuple(utilities.shape)}."
            )
        if self.spatial_sigma > 0 and utilities.ndim != 4:
            raise ValueError("`spatial_sigma` > 0 needs `utilities` of shape (batch, K, H, W).")
        num_agents = utilities.shape[1]
        if warm_start is not None and tuple(warm_start.shape) != tuple(utilities.shape):
            raise ValueError(
                f"`warm_start` has shape {tuple(warm_start.shape)}; expected the utilities' {tuple(utilities.shape)}."
            )
        if progress is not None and not 0 <= progress <= 1:
            raise ValueError(f"`progress` must lie in [0, 1], got {progress!r}.")
        dtype = utilities.dtype if utilities.dtype in (torch.float32, torch.float64) else torch.float32
        budgets = _check_shares("budgets", self.budgets, num_agents, dtype, utilities.device)
        capacities = _check_shares("capacities", self.capacities, num_agents, dtype, utilities.device)

        shape = utilities.shape
        flat = utilities.to(dtype).reshape(shape[0], num_agents, -1)
        warm = None if warm_start is None else warm_start.to(dtype).reshape(flat.shape)
        if self.solver == "proportional_response":
            allocation = proportional_response(flat, budgets, self.num_iterations, self.tol, warm)
        elif self.solver == "sinkhorn":
            allocation = sinkhorn(flat, capacities, self.tau, self.num_iterations, self.tol, warm)
        elif self.solver == "lp":
            allocation = lp_allocation(flat, budgets, capacities, self.envy_free)
        else:
            allocation = argmax_allocation(flat)
        allocation = allocation.reshape(shape)

        if self.spatial_sigma > 0:
            allocation = gaussian_blur(allocation, self.spatial_sigma)
            allocation = allocation / allocation.sum(dim=1, keepdim=True).clamp_min(_TINY)
        if self.anneal_start is not None and progress is not None and progress > self.anneal_start:
            allocation = anneal(allocation, (1 - progress) / (1 - self.anneal_start))
        return allocation.to(utilities.dtype)


def anneal(allocation: torch.Tensor, temperature: float) -> torch.Tensor:
    """Sharpen an allocation `(B, K, ...)`: `X ** (1 / temperature)` renormalised; temperature 0 gives the hard split."""
    if temperature >= 1:
        return allocation
    if temperature <= 0:
        return argmax_allocation(allocation.reshape(allocation.shape[0], allocation.shape[1], -1)).reshape(
            allocation.shape
        )
    log_x = torch.log(allocation.clamp_min(_TINY)) / temperature
    return torch.softmax(log_x, dim=1)
