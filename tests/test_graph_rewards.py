"""Graph-GRPO's shaped planar reward (`PlanarShapedReward`): its known values (a graph against its own statistics,
a hand-computed pair), zero for invalid graphs, lower for graphs unlike the reference, and errors on bad input."""

import math

import networkx as nx
import numpy as np
import pytest

from diffusers_ext.data.graphs import spectre_splits, tree_graphs
from diffusers_ext.rewards.graphs import PlanarShapedReward, jensen_shannon


def test_jensen_shannon_is_zero_on_equal_and_log_two_on_disjoint_histograms():
    assert jensen_shannon(np.array([0.2, 0.8]), np.array([0.2, 0.8])) == pytest.approx(0.0, abs=1e-12)
    assert jensen_shannon(np.array([1.0, 0.0]), np.array([0.0, 0.0, 1.0])) == pytest.approx(math.log(2), abs=1e-9)


def test_a_graph_against_its_own_statistics_scores_one():
    graph = spectre_splits("planar", 12, seed=0)["train"][0]
    parts = {k: v.tolist() for k, v in PlanarShapedReward([graph]).components([graph]).items()}
    assert sorted(parts) == ["clustering", "degree", "orbit", "reward", "valid"]
    for name, values in parts.items():  # one key at a time: pytest.approx takes no dict of lists
        assert values == pytest.approx([1.0], abs=1e-9), name


def test_hand_computed_reward_of_a_path_against_a_four_cycle():
    # degree pmfs: path [0, 1/2, 1/2], cycle [0, 0, 1]; both have clustering 0 everywhere (equal histograms);
    # orbit vectors (sum over nodes / 4): path (1.5, 1, 0.5, 0, 0.5, 0.5, 0...), cycle (2, 2, 1, 0, 0, 0, 0, 0, 1, 0...)
    js = 0.5 * (0.5 * math.log(2) + 0.5 * math.log(2 / 3) + math.log(4 / 3))
    orbit_distance = (0.5 + 1 + 0.5 + 0.5 + 0.5 + 1) / 15
    expected = (1 + 0.2 * (math.exp(-5 * js) + 1 + math.exp(-orbit_distance))) / 1.6
    reward = PlanarShapedReward([nx.cycle_graph(4)])
    assert reward([nx.path_graph(4)], label=[3]) == pytest.approx([expected], abs=1e-9)


def test_invalid_graphs_score_zero_and_valid_ones_at_least_one_over_one_point_six():
    splits = spectre_splits("planar", 12, seed=0)
    reward = PlanarShapedReward(splits["train"])
    disconnected = nx.Graph([(0, 1), (2, 3)])
    parts = reward.components([nx.complete_graph(5), disconnected, nx.empty_graph(3), *splits["test"][:5]])
    for key in ("valid", "degree", "clustering", "orbit", "reward"):
        assert parts[key][:3].tolist() == [0.0, 0.0, 0.0], key
    assert np.all((parts["reward"][3:] >= 1 / 1.6) & (parts["reward"][3:] <= 1.0))
    assert reward.__name__ == "planar_shaped_reward"


def test_trees_score_lower_than_held_out_planar_graphs():
    splits = spectre_splits("planar", 16, seed=0)
    reward = PlanarShapedReward(splits["train"])
    planar = reward.components(splits["test"])
    trees = reward.components(tree_graphs(16, 20, seed=1))  # valid (connected, planar) but sparse
    assert trees["valid"].mean() == planar["valid"].mean() == 1.0
    for key in ("degree", "clustering", "orbit", "reward"):
        assert trees[key].mean() < planar[key].mean() - 0.2, key
    # held-out graphs of the same generator are close to the training statistics
    assert planar["degree"].mean() > 0.7 and planar["reward"].mean() > 0.85


def test_bad_arguments_name_themselves():
    graphs = [nx.cycle_graph(4)]
    with pytest.raises(ValueError, match="`reference_graphs` must be a non-empty list"):
        PlanarShapedReward([])
    with pytest.raises(TypeError, match="`reference_graphs` must be a list of networkx graphs, got Graph"):
        PlanarShapedReward(nx.cycle_graph(4))
    with pytest.raises(ValueError, match=r"`reference_graphs` must have at least one node each; graphs \[1\]"):
        PlanarShapedReward([nx.cycle_graph(4), nx.Graph()])
    with pytest.raises(ValueError, match="`weight` must be a finite number >= 0, got -0.1"):
        PlanarShapedReward(graphs, weight=-0.1)
    with pytest.raises(ValueError, match="`orbit_scale` must be a finite number >= 0, got nan"):
        PlanarShapedReward(graphs, orbit_scale=float("nan"))
    with pytest.raises(ValueError, match="`clustering_bins` must be an int >= 1, got 0"):
        PlanarShapedReward(graphs, clustering_bins=0)
    with pytest.raises(TypeError, match="`graphs` must be a list of networkx graphs"):
        PlanarShapedReward(graphs)("not graphs")
