"""SPECTRE-style planar and tree generators, dense conversion, V.U.N. and the graph MMDs."""

import networkx as nx
import pytest

from diffusers_ext.data.graphs import dense_to_graphs, graphs_to_dense, planar_graphs, spectre_splits, tree_graphs
from diffusers_ext.metrics.graphs import graph_mmd, is_valid_planar, is_valid_tree, mmd_ratios, vun


def test_generators_give_valid_graphs_of_the_requested_size_reproducibly():
    planar = planar_graphs(16, 5, seed=0)
    trees = tree_graphs(16, 5, seed=0)
    assert all(g.number_of_nodes() == 16 and is_valid_planar(g) for g in planar)
    # a Delaunay triangulation of n points in general position has at most 3n - 6 edges
    assert all(16 <= g.number_of_edges() <= 3 * 16 - 6 for g in planar)
    assert all(g.number_of_nodes() == 16 and is_valid_tree(g) for g in trees)
    again = planar_graphs(16, 5, seed=0)
    assert [sorted(g.edges) for g in again] == [sorted(g.edges) for g in planar]


def test_spectre_splits_have_the_benchmark_sizes():
    splits = spectre_splits("tree", num_nodes=12, seed=0)
    assert {k: len(v) for k, v in splits.items()} == {"train": 128, "val": 32, "test": 40}
    with pytest.raises(ValueError, match="kind"):
        spectre_splits("sbm")


def test_dense_round_trip():
    graphs = tree_graphs(7, 3, seed=2) + [nx.path_graph(4)]
    X, E, mask = graphs_to_dense(graphs)
    assert E.shape == (4, 7, 7) and mask.sum(1).tolist() == [7, 7, 7, 4]
    back = dense_to_graphs(X, E, mask)
    assert all(nx.is_isomorphic(a, b) for a, b in zip(graphs, back))


def test_vun_counts_validity_uniqueness_and_novelty():
    train = [nx.path_graph(6)]
    star, path, cycle = nx.star_graph(5), nx.path_graph(6), nx.cycle_graph(6)
    relabelled_star = nx.relabel_nodes(star, {i: (i + 2) % 6 for i in range(6)})
    result = vun([star, relabelled_star, path, cycle], train, "tree")
    assert result == {"valid": 0.75, "unique": 0.75, "novel": 0.75, "vun": 0.25}


def test_mmd_is_zero_on_identical_sets_and_the_ratio_of_a_fresh_sample_is_near_one():
    splits = spectre_splits("planar", num_nodes=12, seed=0)
    same = graph_mmd(splits["test"], splits["test"])
    assert all(abs(v) < 1e-12 for v in same.values())
    trees = tree_graphs(12, 40, seed=1)
    far = graph_mmd(trees, splits["test"])
    near = graph_mmd(splits["val"], splits["test"])
    assert all(far[s] > near[s] for s in far)
    ratios = mmd_ratios(trees, splits["train"], splits["test"])
    assert ratios["ratio"] > 2.0


def test_validity_rewards_score_graph_lists():
    from diffusers_ext.rewards import planar_validity_reward, tree_validity_reward

    graphs = [nx.path_graph(5), nx.cycle_graph(5), nx.complete_graph(5), nx.Graph([(0, 1), (2, 3)])]
    assert tree_validity_reward(graphs) == [1.0, 0.0, 0.0, 0.0]
    assert planar_validity_reward(graphs, label=[0, 1, 2, 3]) == [1.0, 1.0, 0.0, 0.0]
    with pytest.raises(TypeError, match="graphs"):
        tree_validity_reward("not graphs")
