"""4-node graphlet orbit counts per node (`diffusers_ext.metrics.graph_orbits.orbit_counts`): hand-counted small
graphs, identities that hold on any graph, permutation equivariance and bad input."""

import itertools
import math

import networkx as nx
import numpy as np
import pytest

from diffusers_ext.metrics.graph_orbits import NUM_ORBITS, orbit_counts


def rows(*entries):
    """Count rows from `{orbit: count}` dicts."""
    out = np.zeros((len(entries), NUM_ORBITS), dtype=np.int64)
    for i, entry in enumerate(entries):
        for orbit, count in entry.items():
            out[i, orbit] = count
    return out


def test_hand_counted_paths_stars_and_cycles():
    # path 0-1-2-3-4: 3-node paths (0,1,2), (1,2,3), (2,3,4); 4-node paths (0,1,2,3), (1,2,3,4)
    end, inner = {0: 1, 1: 1, 4: 1}, {0: 2, 1: 1, 2: 1, 4: 1, 5: 1}
    np.testing.assert_array_equal(
        orbit_counts(nx.path_graph(5)), rows(end, inner, {0: 2, 1: 2, 2: 1, 5: 2}, inner, end)
    )
    # star with centre 0 and four leaves: C(4, 2) = 6 paths through the centre, C(4, 3) = 4 induced 3-stars
    np.testing.assert_array_equal(orbit_counts(nx.star_graph(4)), rows({0: 4, 2: 6, 7: 4}, *[{0: 1, 1: 3, 6: 3}] * 4))
    # 5-cycle: every node ends two 3-paths and is the middle of one; the five 4-subsets are 4-paths
    np.testing.assert_array_equal(orbit_counts(nx.cycle_graph(5)), rows(*[{0: 2, 1: 2, 2: 1, 4: 2, 5: 2}] * 5))
    # 4-cycle: no triangle, one induced 4-cycle
    np.testing.assert_array_equal(orbit_counts(nx.cycle_graph(4)), rows(*[{0: 2, 1: 2, 2: 1, 8: 1}] * 4))


def test_hand_counted_cliques_paw_and_diamond():
    np.testing.assert_array_equal(orbit_counts(nx.complete_graph(4)), rows(*[{0: 3, 3: 3, 14: 1}] * 4))
    # 5-clique: C(4, 2) = 6 triangles and C(4, 3) = 4 four-cliques at every node
    np.testing.assert_array_equal(orbit_counts(nx.complete_graph(5)), rows(*[{0: 4, 3: 6, 14: 4}] * 5))
    # paw: triangle 0-1-2 with the pendant 3 on node 2
    paw = nx.Graph([(0, 1), (1, 2), (2, 0), (2, 3)])
    triangle_node = {0: 2, 1: 1, 3: 1, 10: 1}
    np.testing.assert_array_equal(
        orbit_counts(paw), rows(triangle_node, triangle_node, {0: 3, 2: 2, 3: 1, 11: 1}, {0: 1, 1: 2, 9: 1})
    )
    # diamond: 4-cycle 0-1-2-3 with the chord 0-2
    diamond = nx.Graph([(0, 1), (1, 2), (2, 3), (3, 0), (0, 2)])
    chord, side = {0: 3, 2: 1, 3: 2, 13: 1}, {0: 2, 1: 2, 3: 1, 12: 1}
    np.testing.assert_array_equal(orbit_counts(diamond), rows(chord, side, chord, side))


def test_identities_on_random_graphs():
    for seed, p in enumerate((0.15, 0.3, 0.5, 0.8)):
        graph = nx.gnp_random_graph(11, p, seed=seed)
        counts = orbit_counts(graph)
        triangles = nx.triangles(graph)
        for v in graph.nodes():
            neighbours = list(graph.neighbors(v))
            d = len(neighbours)
            assert counts[v, 0] == d
            assert counts[v, 3] == triangles[v]
            assert counts[v, 2] == math.comb(d, 2) - triangles[v]  # pairs of neighbours that are not adjacent
            independent = sum(
                not any(graph.has_edge(a, b) for a, b in itertools.combinations(trio, 2))
                for trio in itertools.combinations(neighbours, 3)
            )
            assert counts[v, 7] == independent  # centre of an induced 3-star
            cliques = sum(
                all(graph.has_edge(a, b) for a, b in itertools.combinations(trio, 2))
                for trio in itertools.combinations(neighbours, 3)
            )
            assert counts[v, 14] == cliques
        # each induced 4-cycle has four nodes at orbit 8, each 4-path two ends and two inner nodes
        assert counts[:, 8].sum() % 4 == 0 and counts[:, 4].sum() == counts[:, 5].sum()


def test_relabelling_permutes_rows_and_self_loops_are_ignored():
    graph = nx.gnp_random_graph(9, 0.4, seed=3)
    order = [int(i) for i in np.random.default_rng(0).permutation(9)]
    relabelled = nx.Graph()  # node i of it is node order[i] of `graph`; rows follow `nodes()`, here 0..8
    relabelled.add_nodes_from(range(9))
    relabelled.add_edges_from(nx.relabel_nodes(graph, {old: new for new, old in enumerate(order)}).edges())
    np.testing.assert_array_equal(orbit_counts(relabelled), orbit_counts(graph)[order])
    looped = graph.copy()
    looped.add_edge(0, 0)
    np.testing.assert_array_equal(orbit_counts(looped), orbit_counts(graph))
    assert orbit_counts(nx.empty_graph(2)).tolist() == [[0] * NUM_ORBITS] * 2


def test_bad_input_names_the_argument():
    with pytest.raises(TypeError, match="`graph` must be an undirected networkx.Graph, got DiGraph"):
        orbit_counts(nx.DiGraph([(0, 1)]))
    with pytest.raises(TypeError, match="got list"):
        orbit_counts([(0, 1)])
