"""GraphDiscreteFlowScheduler's analytic rate vs Graph-GRPO's reference implementation (fixture made by
`regenerate_graph_grpo.py` at the commit it records), and the rate's step probabilities vs the reference's
`compute_step_probs_grpo` recipe (off-diagonal `R dt`, diagonal `max(1 - sum, 0)`)."""

import torch
from parity_utils import assert_relative_close, load_fixture
from regenerate_graph_grpo import build_inputs

from diffusers_ext import GraphDiscreteFlowScheduler


def _scheduler(fixture):
    return GraphDiscreteFlowScheduler(
        num_node_classes=3,
        num_edge_classes=3,
        node_marginals=fixture["node_marginals"],
        edge_marginals=fixture["edge_marginals"],
    )


def test_analytic_rate_matches_the_reference():
    fixture = load_fixture("graph_grpo")
    assert len(fixture["commit"]) == 40
    inputs = build_inputs()
    scheduler = _scheduler(fixture)
    R_X, R_E = scheduler.rate_matrix(
        inputs["node_probs"], inputs["edge_probs"], inputs["X"], inputs["E"], inputs["t"], inputs["node_mask"]
    )
    # the reference divides by (1 - t + 1e-6): a relative offset below 1e-6 / (1 - 0.8) = 5e-6
    assert_relative_close(R_X, fixture["rate_X"], "node rates", tolerance=1e-5)
    assert_relative_close(R_E, fixture["rate_E"], "edge rates", tolerance=1e-5)


def test_step_probabilities_follow_the_reference_recipe_on_its_rates():
    fixture = load_fixture("graph_grpo")
    inputs = build_inputs()
    scheduler = _scheduler(fixture)
    dt = torch.tensor([0.05, 0.05, 0.05], dtype=torch.float64)
    R_E = torch.tensor(fixture["rate_E"], dtype=torch.float64)
    stay = torch.nn.functional.one_hot(inputs["E"], 3).double()
    off = R_E * dt.view(-1, 1, 1, 1) * (1 - stay)
    expected = off + (1 - off.sum(-1, keepdim=True)).clamp(min=0) * stay
    logits = inputs["edge_probs"].log()
    _, P_E = scheduler.transition_probs(
        inputs["node_probs"].log(),
        logits,
        inputs["X"],
        inputs["E"],
        inputs["t"],
        inputs["t"] + dt,
        inputs["node_mask"],
    )
    pair = (inputs["node_mask"].unsqueeze(1) & inputs["node_mask"].unsqueeze(2)).unsqueeze(-1)
    assert_relative_close(P_E * pair, expected * pair, "edge step probabilities", tolerance=1e-5)
