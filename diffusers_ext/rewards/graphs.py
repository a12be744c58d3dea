"""Verifiable graph rewards for RL on graph generators: plain callables `f(graphs, **columns) -> list[float]`.

`graphs` is a list of `networkx.Graph` (a [`GraphFlowPipeline`]'s `output_type="networkx"` result); extra dataset
columns arrive as keyword lists and are ignored here. These are the validity rules of the SPECTRE benchmark. The
shaped planar reward of Graph-GRPO (validity times degree, clustering and orbit similarity terms) is not
implemented: it needs 4-node orbit counts.
"""

from ..metrics.graphs import is_valid_planar, is_valid_tree


def _check(graphs) -> list:
    if not isinstance(graphs, (list, tuple)) or not all(hasattr(g, "number_of_nodes") for g in graphs):
        raise TypeError(f"`graphs` must be a list of networkx graphs, got {type(graphs).__name__}.")
    return list(graphs)


def tree_validity_reward(graphs, **columns) -> list[float]:
    """1.0 for every graph that is a tree (`networkx.is_tree`), else 0.0 (Graph-GRPO's tree reward)."""
    return [float(is_valid_tree(g)) for g in _check(graphs)]


def planar_validity_reward(graphs, **columns) -> list[float]:
    """1.0 for every connected planar graph, else 0.0 (the validity factor of Graph-GRPO's planar reward)."""
    return [float(is_valid_planar(g)) for g in _check(graphs)]
