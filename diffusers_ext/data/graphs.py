"""Synthetic graph data sets of the SPECTRE benchmark (planar and tree graphs) and dense <-> networkx conversion.

The generators follow the published procedure (SPECTRE / DeFoG / Graph-GRPO) at any node count:

- planar: `n` uniform points in the unit square, their Delaunay triangulation (`scipy.spatial.Delaunay`), every
  triangle added as a 3-cycle; graphs are kept if connected (a triangulation always is);
- tree: a uniformly random labelled tree on `n` nodes (`networkx.random_labeled_tree`).

`spectre_splits` draws 200 graphs with a fixed seed and splits them 128 train / 32 validation / 40 test, the sizes of
the benchmark. The graphs are regenerated, not the published pickles: the distribution is the same, the graphs are
not. networkx is an optional dependency (`pip install diffusers-ext[graphs]`).
"""

import numpy as np
import torch


SPLIT_SIZES = {"train": 128, "val": 32, "test": 40}
KINDS = ("planar", "tree")


def require_networkx(what: str):
    """Import networkx, or raise an `ImportError` saying that `what` needs the `graphs` extra."""
    try:
        import networkx
    except ImportError as error:  # pragma: no cover - networkx is installed in the test environment
        raise ImportError(
            f"{what} needs networkx: install it with `pip install diffusers-ext[graphs]` (or `pip install networkx`)."
        ) from error
    return networkx


def _check_count(name: str, value, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"`{name}` must be an int >= {minimum}, got {value!r}.")


def planar_graphs(num_nodes: int, count: int, seed: int = 0) -> list:
    """`count` Delaunay planar graphs of `num_nodes` nodes (SPECTRE's generator), reproducible from `seed`."""
    nx = require_networkx("planar_graphs")
    from scipy.spatial import Delaunay

    _check_count("num_nodes", num_nodes, 3)
    _check_count("count", count, 1)
    rng = np.random.default_rng(seed)
    graphs = []
    while len(graphs) < count:
        points = rng.random((num_nodes, 2))
        graph = nx.Graph()
        graph.add_nodes_from(range(num_nodes))
        for a, b, c in Delaunay(points).simplices:
            graph.add_edges_from([(int(a), int(b)), (int(b), int(c)), (int(a), int(c))])
        if nx.is_connected(graph):
            graphs.append(graph)
    return graphs


def tree_graphs(num_nodes: int, count: int, seed: int = 0) -> list:
    """`count` uniformly random labelled trees of `num_nodes` nodes, reproducible from `seed`."""
    nx = require_networkx("tree_graphs")
    _check_count("num_nodes", num_nodes, 2)
    _check_count("count", count, 1)
    rng = np.random.default_rng(seed)
    make = getattr(nx, "random_labeled_tree", None) or nx.random_tree
    return [make(num_nodes, seed=int(rng.integers(2**31))) for _ in range(count)]


def spectre_splits(kind: str, num_nodes: int = 64, seed: int = 0) -> dict[str, list]:
    """The benchmark's 200 graphs of `kind` (`"planar"` or `"tree"`) at `num_nodes` nodes, split 128 / 32 / 40.

    Returns:
        `dict` with keys `"train"`, `"val"`, `"test"`, each a list of `networkx.Graph`.
    """
    if kind not in KINDS:
        raise ValueError(f"`kind` must be one of {KINDS}, got {kind!r}.")
    total = sum(SPLIT_SIZES.values())
    graphs = (planar_graphs if kind == "planar" else tree_graphs)(num_nodes, total, seed)
    order = np.random.default_rng(seed + 1).permutation(total)
    out, start = {}, 0
    for name, size in SPLIT_SIZES.items():
        out[name] = [graphs[i] for i in order[start : start + size]]
        start += size
    return out


def graphs_to_dense(graphs: list, max_num_nodes: int | None = None):
    """Pad a list of networkx graphs to dense class tensors.

    Node classes come from the node attribute `"label"` (0 if absent), edge classes from the edge attribute
    `"label"` (1 if absent; 0 is "no edge"). Nodes are taken in `graph.nodes` order.

    Returns:
        `(node_classes, edge_classes, node_mask)` of shapes `(B, N)`, `(B, N, N)`, `(B, N)`.
    """
    if not isinstance(graphs, (list, tuple)) or not graphs:
        raise ValueError(f"`graphs` must be a non-empty list of networkx graphs, got {type(graphs).__name__}.")
    n_max = max(g.number_of_nodes() for g in graphs)
    if max_num_nodes is not None:
        if max_num_nodes < n_max:
            raise ValueError(f"`max_num_nodes` is {max_num_nodes}, but a graph has {n_max} nodes.")
        n_max = max_num_nodes
    B = len(graphs)
    X = torch.zeros(B, n_max, dtype=torch.long)
    E = torch.zeros(B, n_max, n_max, dtype=torch.long)
    mask = torch.zeros(B, n_max, dtype=torch.bool)
    for b, graph in enumerate(graphs):
        index = {node: i for i, node in enumerate(graph.nodes)}
        mask[b, : len(index)] = True
        for node, i in index.items():
            X[b, i] = int(graph.nodes[node].get("label", 0))
        for u, v, data in graph.edges(data=True):
            if u != v:
                E[b, index[u], index[v]] = E[b, index[v], index[u]] = int(data.get("label", 1))
    return X, E, mask


def dense_to_graphs(node_classes: torch.LongTensor, edge_classes: torch.LongTensor, node_mask: torch.BoolTensor):
    """Dense class tensors `(B, N)`, `(B, N, N)`, `(B, N)` to a list of networkx graphs (nodes `0 .. n-1` with
    attribute `"label"`; an edge for every pair with class > 0, attribute `"label"`)."""
    nx = require_networkx("dense_to_graphs")
    X, E, mask = node_classes.cpu(), edge_classes.cpu(), node_mask.cpu().bool()
    graphs = []
    for b in range(X.shape[0]):
        n = int(mask[b].sum())
        graph = nx.Graph()
        graph.add_nodes_from((i, {"label": int(X[b, i])}) for i in range(n))
        upper = torch.triu(E[b, :n, :n], diagonal=1)
        for i, j in upper.nonzero().tolist():
            graph.add_edge(i, j, label=int(upper[i, j]))
        graphs.append(graph)
    return graphs
