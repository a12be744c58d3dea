"""GraphDiscreteFlowScheduler: the analytic rate is DeFoG's R* in expectation, step probabilities, log-probs,
gradients, per-graph generators, the time grid, the path, save/load and bad input."""

import math

import pytest
import torch

from diffusers_ext import GraphDiscreteFlowScheduler, GraphDiscreteFlowSchedulerOutput
from diffusers_ext.schedulers.scheduling_graph_discrete_flow import analytic_rate, defog_rate, distort_time


P0 = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)


def _graph(B=3, N=5, S_X=2, S_E=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randint(0, S_X, (B, N), generator=g)
    E = torch.randint(0, S_E, (B, N, N), generator=g).triu(1)
    E = E + E.transpose(1, 2)
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[-1, N - 2 :] = False
    X, E = X * mask, E * (mask.unsqueeze(1) & mask.unsqueeze(2))
    node_logits = torch.randn(B, N, S_X, generator=g, dtype=torch.float64)
    edge_logits = torch.randn(B, N, N, S_E, generator=g, dtype=torch.float64)
    return X, E, mask, node_logits, (edge_logits + edge_logits.transpose(1, 2)) / 2


@pytest.mark.parametrize("t", [0.0, 0.3, 0.9, 0.999])
def test_analytic_rate_is_the_expectation_of_defog_rstar(t):
    g = torch.Generator().manual_seed(1)
    probs = torch.randn(64, 3, generator=g, dtype=torch.float64).softmax(-1)
    state = torch.randint(0, 3, (64,), generator=g)
    expected = sum(
        probs[:, j : j + 1] * defog_rate(torch.full_like(state, j), state, torch.tensor(t, dtype=torch.float64), P0)
        for j in range(3)
    )
    actual = analytic_rate(probs, state, torch.tensor(t, dtype=torch.float64), P0)
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)
    # and in float32, to float precision
    actual32 = analytic_rate(probs.float(), state, torch.tensor(t), P0.float())
    torch.testing.assert_close(actual32.double(), expected, rtol=1e-5, atol=1e-5 / (1 - t))


def test_monte_carlo_defog_rate_averages_to_the_analytic_rate():
    scheduler = GraphDiscreteFlowScheduler(
        num_node_classes=3, num_edge_classes=3, node_marginals=P0.tolist(), edge_marginals=P0.tolist(), rate="defog"
    )
    analytic = GraphDiscreteFlowScheduler(
        num_node_classes=3, num_edge_classes=3, node_marginals=P0.tolist(), edge_marginals=P0.tolist()
    )
    X, E, mask, node_logits, edge_logits = _graph(B=1, N=3, S_X=3, S_E=3)
    X, E, mask = X.expand(4000, -1), E.expand(4000, -1, -1), torch.ones(4000, 3, dtype=torch.bool)
    node_probs = node_logits.softmax(-1).expand(4000, -1, -1)
    edge_probs = edge_logits.softmax(-1).expand(4000, -1, -1, -1)
    g = torch.Generator().manual_seed(0)
    mc_X, mc_E = scheduler.rate_matrix(node_probs, edge_probs, X, E, 0.4, mask, generator=g)
    ex_X, ex_E = analytic.rate_matrix(node_probs, edge_probs, X, E, 0.4, mask)
    # each entry is a mean of 4000 bounded draws (rates <= 2 / (3 * 0.6 * 0.2))
    assert (mc_X.mean(0) - ex_X[0]).abs().max() < 0.2
    assert (mc_E.mean(0) - ex_E[0]).abs().max() < 0.2


def test_transition_probs_are_distributions_and_euler_steps_of_the_rate():
    scheduler = GraphDiscreteFlowScheduler(num_node_classes=2, num_edge_classes=3, edge_marginals=[0.6, 0.3, 0.1])
    X, E, mask, node_logits, edge_logits = _graph()
    P_X, P_E = scheduler.transition_probs(node_logits, edge_logits, X, E, 0.2, 0.25, mask)
    torch.testing.assert_close(P_X.sum(-1), torch.ones_like(P_X[..., 0]))
    torch.testing.assert_close(P_E.sum(-1), torch.ones_like(P_E[..., 0]))
    R_X, R_E = scheduler.rate_matrix(node_logits.softmax(-1), edge_logits.softmax(-1), X, E, 0.2, mask)
    off = 1 - torch.nn.functional.one_hot(E, 3).double()
    real = (mask.unsqueeze(1) & mask.unsqueeze(2)).unsqueeze(-1)
    torch.testing.assert_close(P_E * off * real, R_E * 0.05 * off * real)
    # padding puts all mass on class 0
    assert torch.equal(P_X[-1, -1], torch.tensor([1.0, 0.0], dtype=torch.float64))


def test_step_probabilities_renormalise_when_moves_exceed_one():
    # a rare current class (p0 = 0.01) and a confident prediction: rate(0 -> 1) = 1 / (3 * 0.5 * 0.01) = 66.7,
    # times dt = 0.1 is far above 1, so the stay probability clamps at 0 and the row is renormalised
    scheduler = GraphDiscreteFlowScheduler(num_node_classes=1, num_edge_classes=3, edge_marginals=[0.01, 0.01, 0.98])
    X, E = torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, 2, dtype=torch.long)
    edge_logits = torch.tensor([-30.0, 30.0, -30.0], dtype=torch.float64).expand(1, 2, 2, 3)
    _, P_E = scheduler.transition_probs(torch.zeros(1, 2, 1, dtype=torch.float64), edge_logits, X, E, 0.5, 0.6)
    torch.testing.assert_close(P_E[0, 0, 1], torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64))


def test_log_prob_counts_each_edge_once_and_matches_the_reference_half_sum():
    scheduler = GraphDiscreteFlowScheduler(num_node_classes=2, num_edge_classes=3, edge_marginals=[0.6, 0.3, 0.1])
    X, E, mask, node_logits, edge_logits = _graph()
    P_X, P_E = scheduler.transition_probs(node_logits, edge_logits, X, E, 0.5, 0.6, mask)
    X2, E2 = scheduler.sample_transition(P_X, P_E, mask, torch.Generator().manual_seed(3))
    ours = scheduler.step_log_prob(P_X, P_E, X2, E2, mask)
    log_X = P_X.log().gather(-1, X2.unsqueeze(-1)).squeeze(-1)
    log_E = P_E.log().gather(-1, E2.unsqueeze(-1)).squeeze(-1)
    pair = (mask.unsqueeze(1) & mask.unsqueeze(2)).double() * (1 - torch.eye(5, dtype=torch.float64))
    reference = (log_X * mask).sum(-1) + 0.5 * (log_E * pair).sum((-2, -1))
    torch.testing.assert_close(ours, reference)
    assert torch.equal(E2, E2.transpose(1, 2)) and bool((E2.diagonal(dim1=1, dim2=2) == 0).all())


def test_transition_probs_are_differentiable_in_the_logits():
    scheduler = GraphDiscreteFlowScheduler(num_node_classes=2, num_edge_classes=3, edge_marginals=[0.6, 0.3, 0.1])
    X, E, mask, node_logits, edge_logits = _graph()
    node_logits.requires_grad_(True)
    edge_logits.requires_grad_(True)
    P_X, P_E = scheduler.transition_probs(node_logits, edge_logits, X, E, 0.3, 0.35, mask)
    X2, E2 = scheduler.sample_transition(P_X, P_E, mask, torch.Generator().manual_seed(0))
    scheduler.step_log_prob(P_X, P_E, X2, E2, mask).sum().backward()
    assert edge_logits.grad.abs().sum() > 0 and node_logits.grad.abs().sum() > 0
    assert torch.isfinite(edge_logits.grad).all()


def test_step_follows_per_graph_generators_and_returns_a_base_output():
    scheduler = GraphDiscreteFlowScheduler(num_node_classes=2, num_edge_classes=3, edge_marginals=[0.6, 0.3, 0.1])
    scheduler.set_timesteps(4)
    X, E, mask, node_logits, edge_logits = _graph(B=2)
    mask[:] = True
    t = scheduler.timesteps[2]
    batch = scheduler.step(node_logits, edge_logits, t, X, E, mask, [torch.Generator().manual_seed(s) for s in (5, 6)])
    assert isinstance(batch, GraphDiscreteFlowSchedulerOutput)
    for b, seed in enumerate((5, 6)):
        single = scheduler.step(
            node_logits[b : b + 1],
            edge_logits[b : b + 1],
            t,
            X[b : b + 1],
            E[b : b + 1],
            mask[b : b + 1],
            [torch.Generator().manual_seed(seed)],
            return_dict=False,
        )
        assert torch.equal(single[0][0], batch.prev_node_classes[b])
        assert torch.equal(single[1][0], batch.prev_edge_classes[b])
        torch.testing.assert_close(single[2][0], batch.log_prob[b])


def test_time_grid_is_defogs_distorted_grid():
    scheduler = GraphDiscreteFlowScheduler()
    scheduler.set_timesteps(50)
    grid = torch.arange(51, dtype=torch.float64) / 51
    torch.testing.assert_close(scheduler.time_grid, (2 * grid - grid**2).float())
    assert len(scheduler.timesteps) == 50 == len(scheduler)
    assert math.isclose(float(scheduler.time_grid[-1]), 1 - (1 / 51) ** 2, rel_tol=1e-6)
    t = torch.linspace(0, 1, 11)
    torch.testing.assert_close(distort_time(t, "polyinc"), t**2)


def test_noise_and_add_noise_follow_the_marginals_and_the_linear_path():
    scheduler = GraphDiscreteFlowScheduler(
        num_node_classes=2, num_edge_classes=2, node_marginals=[0.7, 0.3], edge_marginals=[0.8, 0.2]
    )
    mask = torch.ones(400, 8, dtype=torch.bool)
    X0, E0 = scheduler.sample_noise(mask, torch.Generator().manual_seed(0))
    assert abs(float(X0.float().mean()) - 0.3) < 0.02
    upper = torch.ones(8, 8, dtype=torch.bool).triu(1).expand(400, -1, -1)
    assert abs(float(E0[upper].float().mean()) - 0.2) < 0.02
    X1, E1 = torch.ones(400, 8, dtype=torch.long), (1 - torch.eye(8, dtype=torch.long)).expand(400, -1, -1)
    Xt, Et = scheduler.add_noise(X1, E1, torch.full((400,), 0.6), mask, torch.Generator().manual_seed(1))
    # P(class 1) = t + (1 - t) p0(1)
    assert abs(float(Xt.float().mean()) - (0.6 + 0.4 * 0.3)) < 0.02
    assert abs(float(Et[upper].float().mean()) - (0.6 + 0.4 * 0.2)) < 0.02
    assert torch.equal(Et, Et.transpose(1, 2))
    p_X, p_E = GraphDiscreteFlowScheduler.marginals_from_dense(X0, E0, mask, 2, 2)
    assert abs(p_X[1] - 0.3) < 0.02 and abs(p_E[1] - 0.2) < 0.02


def test_save_load_round_trip_and_dynamic_prior(tmp_path):
    scheduler = GraphDiscreteFlowScheduler(
        num_edge_classes=2,
        edge_marginals=[0.75, 0.25],
        rate="defog",
        eta=2.0,
        omega=0.05,
        node_count_probs=[0.0, 0.5, 0.5],
    )
    scheduler.update_marginals(edge_marginals=[0.6, 0.4])
    scheduler.save_pretrained(tmp_path)
    loaded = GraphDiscreteFlowScheduler.from_pretrained(tmp_path)
    strip = lambda c: {k: v for k, v in dict(c).items() if not k.startswith("_")}  # noqa: E731
    assert strip(loaded.config) == strip(scheduler.config)
    torch.testing.assert_close(loaded.edge_marginals, torch.tensor([0.6, 0.4]))
    torch.testing.assert_close(loaded.node_count_probs, torch.tensor([0.0, 0.5, 0.5]))


@pytest.mark.parametrize(
    "kwargs,argument",
    [
        ({"num_edge_classes": 1}, "num_edge_classes"),
        ({"edge_marginals": [0.5, 0.6]}, "edge_marginals"),
        ({"edge_marginals": [1.0, 0.0]}, "edge_marginals"),
        ({"node_marginals": [0.5, 0.5]}, "node_marginals"),
        ({"time_distortion": "beta"}, "time_distortion"),
        ({"rate": "mc"}, "rate"),
        ({"eta": 1.0}, "eta"),
        ({"node_count_probs": [1.0]}, "node_count_probs"),
    ],
)
def test_bad_config_names_the_argument(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        GraphDiscreteFlowScheduler(**kwargs)


def test_bad_step_input_names_the_argument():
    scheduler = GraphDiscreteFlowScheduler()
    with pytest.raises(ValueError, match="set_timesteps"):
        scheduler.step(
            torch.zeros(1, 2, 1),
            torch.zeros(1, 2, 2, 2),
            0.0,
            torch.zeros(1, 2, dtype=torch.long),
            torch.zeros(1, 2, 2, dtype=torch.long),
        )
    scheduler.set_timesteps(3)
    with pytest.raises(ValueError, match="edge_classes"):
        scheduler.step(
            torch.zeros(1, 2, 1),
            torch.zeros(1, 2, 2, 2),
            0.0,
            torch.zeros(1, 2, dtype=torch.long),
            torch.full((1, 2, 2), 5, dtype=torch.long),
        )
    with pytest.raises(ValueError, match="edge_logits"):
        scheduler.step(
            torch.zeros(1, 2, 1),
            torch.zeros(1, 2, 2, 3),
            0.0,
            torch.zeros(1, 2, dtype=torch.long),
            torch.zeros(1, 2, 2, dtype=torch.long),
        )
    with pytest.raises(ValueError, match="num_inference_steps"):
        scheduler.set_timesteps(0)
