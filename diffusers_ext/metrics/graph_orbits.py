"""Graphlet orbit counts per node: for every node, how often it sits at each of the 15 orbits of the connected
graphlets of 2, 3 and 4 nodes (the counts ORCA's `node 4` mode gives, used by the SPECTRE orbit statistic and by
Graph-GRPO's shaped planar reward).

Graphlets are *induced* subgraphs. The orbits, numbered as in Pržulj's graphlet degree vectors (and ORCA):

| orbit | graphlet | the node is |
| --- | --- | --- |
| 0 | edge | an end (orbit 0 is the degree) |
| 1, 2 | path of 3 nodes | an end, the middle |
| 3 | triangle | any node |
| 4, 5 | path of 4 nodes | an end, an inner node |
| 6, 7 | star of 3 leaves | a leaf, the centre |
| 8 | 4-cycle | any node |
| 9, 10, 11 | triangle with a pendant (paw) | the pendant, a triangle node of degree 2, the node of degree 3 |
| 12, 13 | 4-cycle with one chord (diamond) | a node of degree 2, an end of the chord |
| 14 | 4-clique | any node |

Written from these definitions with numpy (no ORCA code): every 3- and 4-node subset is enumerated and its induced
subgraph classified by its edge count and its nodes' degrees, so the cost is `O(n^4)`: a few milliseconds at 16 nodes,
about a second at 64. Subsets are processed in chunks, so memory stays bounded.
"""

import itertools
from functools import lru_cache

import numpy as np


NUM_ORBITS = 15
_CHUNK = 200_000

# The orbit of a node inside one 3-node subset, by the subset's edge count and the node's degree within it (-1: the
# subset is not a connected graphlet, or the node is not in it).
_ORBIT3 = np.full((4, 3), -1, dtype=np.int64)
_ORBIT3[2, 1], _ORBIT3[2, 2] = 1, 2  # path: ends, middle
_ORBIT3[3, 2] = 3  # triangle

# The orbit of a node inside one 4-node subset, by the subset's graphlet and the node's degree within it.
_STAR, _PATH, _CYCLE, _PAW, _DIAMOND, _CLIQUE, _NONE = range(7)
_ORBIT4 = np.full((7, 4), -1, dtype=np.int64)
_ORBIT4[_PATH, 1], _ORBIT4[_PATH, 2] = 4, 5
_ORBIT4[_STAR, 1], _ORBIT4[_STAR, 3] = 6, 7
_ORBIT4[_CYCLE, 2] = 8
_ORBIT4[_PAW, 1], _ORBIT4[_PAW, 2], _ORBIT4[_PAW, 3] = 9, 10, 11
_ORBIT4[_DIAMOND, 2], _ORBIT4[_DIAMOND, 3] = 12, 13
_ORBIT4[_CLIQUE, 3] = 14


def _nx():
    try:
        import networkx
    except ImportError as error:  # pragma: no cover
        raise ImportError("graph orbit counts need networkx: `pip install diffusers-ext[graphs]`.") from error
    return networkx


@lru_cache(maxsize=8)
def _subsets(num_nodes: int, size: int) -> tuple[np.ndarray, ...]:
    """All `size`-subsets of `range(num_nodes)` as int arrays of shape `(chunk, size)`, at most `_CHUNK` rows each."""
    combos = itertools.combinations(range(num_nodes), size)
    chunks = []
    while chunk := list(itertools.islice(combos, _CHUNK)):
        chunks.append(np.asarray(chunk, dtype=np.int64))
    return tuple(chunks)


def _graphlet4(edges: np.ndarray, max_degree: np.ndarray, min_degree: np.ndarray) -> np.ndarray:
    """The graphlet of each 4-node subset from its edge count and its nodes' largest and smallest degree."""
    kind = np.full(edges.shape, _NONE, dtype=np.int64)
    kind[(edges == 3) & (max_degree == 3)] = _STAR
    kind[(edges == 3) & (max_degree == 2) & (min_degree == 1)] = _PATH  # (0, 2, 2, 2) is a triangle and a lone node
    kind[(edges == 4) & (max_degree == 2)] = _CYCLE
    kind[(edges == 4) & (max_degree == 3)] = _PAW
    kind[edges == 5] = _DIAMOND
    kind[edges == 6] = _CLIQUE
    return kind


def orbit_counts(graph) -> np.ndarray:
    """Per-node counts of the 15 orbits of the connected graphlets of 2 to 4 nodes (induced; see the module doc).

    Args:
        graph (`networkx.Graph`): an undirected graph; self-loops are ignored, node order is `graph.nodes()`.

    Returns:
        `np.ndarray` of shape `(num_nodes, 15)` and dtype int64: row `i` holds node `i`'s orbit counts (column 0 is
        its degree).
    """
    nx = _nx()
    if not isinstance(graph, nx.Graph) or graph.is_directed():
        raise TypeError(f"`graph` must be an undirected networkx.Graph, got {type(graph).__name__}.")
    n = graph.number_of_nodes()
    adjacency = nx.to_numpy_array(graph, nodelist=list(graph.nodes()), dtype=np.int64, weight=None) > 0
    np.fill_diagonal(adjacency, False)
    counts = np.zeros((n, NUM_ORBITS), dtype=np.int64)
    counts[:, 0] = adjacency.sum(1)
    for size in (3, 4):
        if n < size:
            continue
        for nodes in _subsets(n, size):
            degree = adjacency[nodes[:, :, None], nodes[:, None, :]].sum(2)  # (subsets, size): degrees inside
            edges = degree.sum(1) // 2
            if size == 3:
                orbit = _ORBIT3[edges[:, None], degree]
            else:
                kind = _graphlet4(edges, degree.max(1), degree.min(1))
                orbit = _ORBIT4[kind[:, None], degree]
            keep = orbit >= 0
            np.add.at(counts, (nodes[keep], orbit[keep]), 1)
    return counts
