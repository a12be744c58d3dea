"""FairDivisionAllocator: fairness properties of each solver on random and adversarial utilities, and its options."""

import pytest
import torch

from diffusers_ext import FairDivisionAllocator
from diffusers_ext.pipelines.divide_and_denoise.fair_division import SOLVERS, anneal, fairness_report, gaussian_blur


def _random_utilities(seed: int, batch: int = 2, agents: int = 3, positions: int = 48) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(batch, agents, positions, generator=generator, dtype=torch.float64) ** 3


def _adversarial_cases() -> dict[str, torch.Tensor]:
    n = 40
    dominant = torch.zeros(1, 2, n, dtype=torch.float64)
    dominant[0, 0] = 100.0  # agent 0 values everything a lot
    dominant[0, 1, :10] = 1.0  # agent 1 values a small region a little
    identical = torch.rand(1, 3, n, generator=torch.Generator().manual_seed(1), dtype=torch.float64).repeat(1, 1, 1)
    identical = identical[:, :1].expand(1, 3, n).clone()
    contested = torch.zeros(1, 3, n, dtype=torch.float64)
    contested[0, :, 15:25] = 1.0  # all three want the same small region
    contested[0, 0, :15] = 0.2
    contested[0, 2, 25:] = 0.2
    one_blind = torch.rand(1, 3, n, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    one_blind[0, 1] = 0.0  # an agent that values nothing
    one_blind[0, :, :5] = 0.0  # positions nobody values
    return {"dominant": dominant, "identical": identical, "contested": contested, "one_blind": one_blind}


def _allocate(solver: str, utilities: torch.Tensor, **kwargs) -> torch.Tensor:
    if solver in ("proportional_response", "sinkhorn"):
        kwargs.setdefault("num_iterations", 2000)
        kwargs.setdefault("tol", 1e-10)
    return FairDivisionAllocator(solver, **kwargs)(utilities)


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("case", ["random", "dominant", "identical", "contested", "one_blind"])
def test_allocation_is_a_division(solver, case):
    utilities = _random_utilities(0) if case == "random" else _adversarial_cases()[case]
    allocation = _allocate(solver, utilities)
    assert allocation.shape == utilities.shape
    assert (allocation >= 0).all() and (allocation <= 1 + 1e-9).all()
    torch.testing.assert_close(allocation.sum(dim=1), torch.ones_like(allocation[:, 0]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("solver", ["proportional_response", "lp"])
@pytest.mark.parametrize("case", ["random", "dominant", "identical", "contested"])
def test_fair_solvers_are_proportional_and_envy_free(solver, case):
    utilities = _random_utilities(3) if case == "random" else _adversarial_cases()[case]
    report = fairness_report(utilities, _allocate(solver, utilities))
    assert report.proportionality.min() >= 1 - 1e-3, report.proportionality
    assert report.max_envy.max() <= 1e-3, report.max_envy


def test_argmax_is_utilitarian_but_unfair_on_a_dominant_agent():
    utilities = _adversarial_cases()["dominant"]
    argmax = fairness_report(utilities, _allocate("argmax", utilities))
    fair = fairness_report(utilities, _allocate("proportional_response", utilities))
    assert argmax.proportionality[0, 1] == 0  # agent 1 gets nothing it values
    assert argmax.max_envy[0] > 0.5
    assert argmax.welfare[0] >= fair.welfare[0]  # argmax maximises total utility


def test_lp_maximises_welfare_among_fair_allocations():
    utilities = _random_utilities(5, batch=3, positions=30)
    lp = fairness_report(utilities, _allocate("lp", utilities))
    nash = fairness_report(utilities, _allocate("proportional_response", utilities))
    # The Nash-welfare allocation is proportional and envy-free, hence feasible for the LP: the LP can only do better.
    assert (lp.welfare >= nash.welfare - 1e-6).all()
    argmax = fairness_report(utilities, _allocate("argmax", utilities))
    assert (lp.welfare <= argmax.welfare + 1e-6).all()


def test_proportional_response_maximises_nash_welfare():
    utilities = _random_utilities(7, batch=1, agents=2, positions=20)
    best = fairness_report(utilities, _allocate("proportional_response", utilities)).nash_welfare
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        other = torch.rand(utilities.shape, generator=generator, dtype=torch.float64)
        other = other / other.sum(dim=1, keepdim=True)
        assert fairness_report(utilities, other).nash_welfare <= best + 1e-6


def test_budgets_shift_the_equilibrium():
    utilities = torch.ones(1, 2, 30, dtype=torch.float64)  # both value everything equally
    allocation = _allocate("proportional_response", utilities, budgets=[3, 1])
    report = fairness_report(utilities, allocation, budgets=[3, 1])
    torch.testing.assert_close(report.shares[0], torch.tensor([0.75, 0.25], dtype=torch.float64), atol=1e-6, rtol=0)
    assert report.proportionality.min() >= 1 - 1e-6


@pytest.mark.parametrize("solver", ["sinkhorn", "lp"])
def test_capacities_are_met(solver):
    utilities = _random_utilities(11, batch=2, agents=3, positions=40)
    capacities = [0.5, 0.3, 0.2]
    allocation = _allocate(
        solver, utilities, capacities=capacities, **({"envy_free": False} if solver == "lp" else {})
    )
    shares = fairness_report(utilities, allocation).shares
    torch.testing.assert_close(shares, torch.tensor([capacities] * 2, dtype=torch.float64), atol=1e-5, rtol=0)


def test_sinkhorn_approaches_the_hard_transport_as_tau_shrinks():
    utilities = _random_utilities(13, batch=1, agents=2, positions=40)
    soft = _allocate("sinkhorn", utilities, tau=1.0)
    hard = _allocate("sinkhorn", utilities, tau=0.005)
    entropy = lambda x: -(x * x.clamp_min(1e-12).log()).sum()  # noqa: E731
    assert entropy(hard) < 0.3 * entropy(soft)
    assert fairness_report(utilities, hard).welfare > fairness_report(utilities, soft).welfare


@pytest.mark.parametrize("solver", ["proportional_response", "sinkhorn"])
def test_warm_start_converges_in_fewer_iterations(solver):
    utilities = _random_utilities(17, batch=1, agents=3, positions=64)
    exact = _allocate(solver, utilities)
    nearby = utilities * (
        1 + 0.01 * torch.rand(utilities.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    )
    target = _allocate(solver, nearby)
    allocator = FairDivisionAllocator(solver, num_iterations=5, tol=0)
    cold_error = (allocator(nearby) - target).abs().max()
    warm_error = (allocator(nearby, warm_start=exact) - target).abs().max()
    assert warm_error < 0.5 * cold_error


def test_spatial_smoothing_keeps_columns_normalised_and_reduces_total_variation():
    utilities = _random_utilities(19, batch=1, agents=2, positions=64).reshape(1, 2, 8, 8)
    rough = FairDivisionAllocator("argmax")(utilities)
    smooth = FairDivisionAllocator("argmax", spatial_sigma=1.0)(utilities)
    torch.testing.assert_close(smooth.sum(dim=1), torch.ones(1, 8, 8, dtype=torch.float64))

    def tv(x):
        return (x[..., 1:, :] - x[..., :-1, :]).abs().sum() + (x[..., 1:] - x[..., :-1]).abs().sum()

    assert tv(smooth) < 0.7 * tv(rough)
    blurred = gaussian_blur(torch.ones(1, 1, 5, 7), 2.0)
    torch.testing.assert_close(blurred, torch.ones(1, 1, 5, 7))


def test_late_anneal_reaches_a_hard_split():
    utilities = _random_utilities(23, batch=1, agents=3, positions=36).reshape(1, 3, 6, 6)
    allocator = FairDivisionAllocator("proportional_response", anneal_start=0.5)
    early = allocator(utilities, progress=0.3)
    torch.testing.assert_close(early, FairDivisionAllocator("proportional_response")(utilities))
    middle = allocator(utilities, progress=0.75)
    final = allocator(utilities, progress=1.0)
    assert set(final.unique().tolist()) <= {0.0, 1.0}
    assert (middle.amax(dim=1) >= early.amax(dim=1) - 1e-9).all()
    torch.testing.assert_close(anneal(early, 1.0), early)


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"solver": "greedy"}, "solver"),
        ({"tau": 0}, "tau"),
        ({"num_iterations": 0}, "num_iterations"),
        ({"tol": -1}, "tol"),
        ({"spatial_sigma": -0.5}, "spatial_sigma"),
        ({"anneal_start": 1.0}, "anneal_start"),
        ({"budgets": [1, -1]}, "budgets"),
        ({"solver": "sinkhorn", "budgets": [1, 1]}, "budgets"),
        ({"solver": "proportional_response", "capacities": [1, 1]}, "capacities"),
        ({"solver": "lp", "budgets": [2, 1]}, "envy_free"),
    ],
)
def test_bad_arguments_are_rejected(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        FairDivisionAllocator(**kwargs)


@pytest.mark.parametrize(
    "utilities, kwargs, argument",
    [
        (torch.ones(2, 3, 4).long(), {}, "utilities"),
        (-torch.ones(1, 2, 4), {}, "utilities"),
        (torch.full((1, 2, 4), float("nan")), {}, "utilities"),
        (torch.ones(4), {}, "utilities"),
        (torch.ones(1, 2, 4), {"warm_start": torch.ones(1, 2, 5)}, "warm_start"),
        (torch.ones(1, 2, 4), {"progress": 1.5}, "progress"),
    ],
)
def test_bad_call_arguments_are_rejected(utilities, kwargs, argument):
    with pytest.raises((ValueError, TypeError), match=argument):
        FairDivisionAllocator()(utilities, **kwargs)


def test_budgets_of_the_wrong_length_are_rejected_at_call_time():
    with pytest.raises(ValueError, match="budgets"):
        FairDivisionAllocator(budgets=[1, 1, 1])(torch.ones(1, 2, 4))
