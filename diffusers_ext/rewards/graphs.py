"""Verifiable graph rewards for RL on graph generators: callables `f(graphs, **columns) -> list[float]`.

`graphs` is a list of `networkx.Graph` (a [`GraphFlowPipeline`]'s `output_type="networkx"` result); extra dataset
columns arrive as keyword lists and are ignored here. `tree_validity_reward` and `planar_validity_reward` are the
validity rules of the SPECTRE benchmark; [`PlanarShapedReward`] is Graph-GRPO's planar reward, validity times the
similarity of a graph's degree, clustering and orbit statistics to those of reference (training) graphs.
"""

import math

import numpy as np

from ..metrics.graph_orbits import orbit_counts
from ..metrics.graphs import is_valid_planar, is_valid_tree
from ..utils import check_positive_int


def _check(graphs, name: str = "graphs") -> list:
    if not isinstance(graphs, (list, tuple)) or not all(hasattr(g, "number_of_nodes") for g in graphs):
        raise TypeError(f"`{name}` must be a list of networkx graphs, got {type(graphs).__name__}.")
    return list(graphs)


def tree_validity_reward(graphs, **columns) -> list[float]:
    """1.0 for every graph that is a tree (`networkx.is_tree`), else 0.0 (Graph-GRPO's tree reward)."""
    return [float(is_valid_tree(g)) for g in _check(graphs)]


def planar_validity_reward(graphs, **columns) -> list[float]:
    """1.0 for every connected planar graph, else 0.0 (the validity factor of Graph-GRPO's planar reward)."""
    return [float(is_valid_planar(g)) for g in _check(graphs)]


def _pmf(counts: np.ndarray) -> np.ndarray:
    total = counts.sum()
    return counts / total if total > 0 else counts


def _pad(vector: np.ndarray, size: int) -> np.ndarray:
    return np.pad(vector, (0, size - len(vector)))


def jensen_shannon(p: np.ndarray, q: np.ndarray, eps: float = 1e-12) -> float:
    """Jensen-Shannon divergence (natural log, so in `[0, log 2]`) of two histograms of shape `(bins,)`, padded with
    zeros to the same length; `eps` is added to every bin and both are renormalised, so empty bins are allowed."""
    size = max(len(p), len(q))
    p = _pad(np.asarray(p, dtype=np.float64), size) + eps
    q = _pad(np.asarray(q, dtype=np.float64), size) + eps
    p, q = p / p.sum(), q / q.sum()
    m = 0.5 * (p + q)
    return float(0.5 * (np.sum(p * np.log(p / m)) + np.sum(q * np.log(q / m))))


class PlanarShapedReward:
    r"""Graph-GRPO's shaped planar reward: validity times the likeness of a graph's statistics to reference graphs'.

    For a graph `G`, with `valid(G)` = connected and planar (the benchmark's validity):

        reward = valid(G) * (1 + w * (s_deg + s_clus + s_orb)) / (1 + 3 w)        (w = 0.2: 1.6 in the denominator)
        s_deg  = exp(-5 * JS(degree pmf of G, reference degree pmf))
        s_clus = exp(-5 * JS(100-bin clustering pmf of G on [0, 1], reference clustering pmf))
        s_orb  = exp(-mean_k |orbit_k(G) - reference orbit_k|)

    so a valid graph scores in `[1 / 1.6, 1]` and an invalid one 0. `JS` is the Jensen-Shannon divergence in nats
    ([`jensen_shannon`]); `orbit_k(G)` is the count of orbit `k` (the 15 orbits of the 2- to 4-node graphlets,
    [`~metrics.graph_orbits.orbit_counts`]) summed over the nodes and divided by the node count. The reference degree
    and clustering pmfs pool the histograms of all reference graphs (their summed counts, normalised); the reference
    orbit vector is the mean of the reference graphs' `orbit_k`. All three are computed once, here.

    One difference from the reference implementation (`Zhubaoheng/Graph-GRPO`, `PlanarGraphReward`): it truncates a
    graph's degree histogram to the reference's length, so degrees no reference graph has are not seen; here both
    histograms are padded to the longer one, so such degrees lower `s_deg`.

    Args:
        reference_graphs (`list[networkx.Graph]`): the graphs whose statistics are the target, e.g. the training split.
        weight (`float`, defaults to 0.2): `w` above, the weight of each similarity term.
        degree_scale (`float`, defaults to 5.0), clustering_scale (`float`, defaults to 5.0), orbit_scale (`float`,
            defaults to 1.0): the factors inside the three exponentials.
        clustering_bins (`int`, defaults to 100): bins of the clustering histograms on [0, 1].

    Example:

    ```python
    from diffusers_ext.data.graphs import spectre_splits
    from diffusers_ext.rewards.graphs import PlanarShapedReward

    reward = PlanarShapedReward(spectre_splits("planar", 16)["train"])
    reward(graphs)  # one float per graph, 0.0 for invalid graphs
    ```
    """

    __name__ = "planar_shaped_reward"

    def __init__(
        self,
        reference_graphs,
        weight: float = 0.2,
        degree_scale: float = 5.0,
        clustering_scale: float = 5.0,
        orbit_scale: float = 1.0,
        clustering_bins: int = 100,
    ):
        reference_graphs = _check(reference_graphs, "reference_graphs")
        if not reference_graphs:
            raise ValueError("`reference_graphs` must be a non-empty list of networkx graphs, got an empty list.")
        empty = [i for i, g in enumerate(reference_graphs) if g.number_of_nodes() == 0]
        if empty:
            raise ValueError(f"`reference_graphs` must have at least one node each; graphs {empty[:5]} have none.")
        for name, value in (
            ("weight", weight),
            ("degree_scale", degree_scale),
            ("clustering_scale", clustering_scale),
            ("orbit_scale", orbit_scale),
        ):
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"`{name}` must be a finite number >= 0, got {value!r}.")
        check_positive_int("clustering_bins", clustering_bins, expected="an int >= 1")
        self.weight = float(weight)
        self.degree_scale = float(degree_scale)
        self.clustering_scale = float(clustering_scale)
        self.orbit_scale = float(orbit_scale)
        self.clustering_bins = clustering_bins

        degree = [self.degree_histogram(g) for g in reference_graphs]
        size = max(len(h) for h in degree)
        self.reference_degree = _pmf(np.sum([_pad(h, size) for h in degree], axis=0))
        self.reference_clustering = _pmf(np.sum([self.clustering_histogram(g) for g in reference_graphs], axis=0))
        self.reference_orbits = np.mean([self.orbit_vector(g) for g in reference_graphs], axis=0)

    @staticmethod
    def degree_histogram(graph) -> np.ndarray:
        """Node counts per degree, `(max_degree + 1,)` float64 (`networkx.degree_histogram`)."""
        import networkx as nx

        return np.asarray(nx.degree_histogram(graph), dtype=np.float64)

    def clustering_histogram(self, graph) -> np.ndarray:
        """Node counts per clustering-coefficient bin, `(clustering_bins,)` float64 over [0, 1]."""
        import networkx as nx

        values = list(nx.clustering(graph).values())
        counts, _ = np.histogram(values, bins=self.clustering_bins, range=(0.0, 1.0))
        return counts.astype(np.float64)

    @staticmethod
    def orbit_vector(graph) -> np.ndarray:
        """Orbit counts summed over the nodes and divided by the node count, `(15,)` float64."""
        return orbit_counts(graph).sum(0) / graph.number_of_nodes()

    def components(self, graphs) -> dict[str, np.ndarray]:
        """The reward's parts for each graph, each of shape `(len(graphs),)`: `"valid"` (0 or 1), `"degree"`,
        `"clustering"`, `"orbit"` (the similarities `s_deg`, `s_clus`, `s_orb` in (0, 1]; 0 for invalid graphs, which
        are not measured) and `"reward"`."""
        graphs = _check(graphs)
        parts = {key: np.zeros(len(graphs)) for key in ("valid", "degree", "clustering", "orbit", "reward")}
        for i, graph in enumerate(graphs):
            if not is_valid_planar(graph):
                continue
            degree_js = jensen_shannon(_pmf(self.degree_histogram(graph)), self.reference_degree)
            clustering_js = jensen_shannon(_pmf(self.clustering_histogram(graph)), self.reference_clustering)
            orbit_distance = float(np.mean(np.abs(self.orbit_vector(graph) - self.reference_orbits)))
            parts["valid"][i] = 1.0
            parts["degree"][i] = math.exp(-self.degree_scale * degree_js)
            parts["clustering"][i] = math.exp(-self.clustering_scale * clustering_js)
            parts["orbit"][i] = math.exp(-self.orbit_scale * orbit_distance)
        similarity = parts["degree"] + parts["clustering"] + parts["orbit"]
        parts["reward"] = parts["valid"] * (1.0 + self.weight * similarity) / (1.0 + 3.0 * self.weight)
        return parts

    def __call__(self, graphs, **columns) -> list[float]:
        """One reward per graph of `graphs` (a list of networkx graphs); dataset columns are ignored."""
        return self.components(graphs)["reward"].tolist()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(weight={self.weight}, degree_scale={self.degree_scale}, "
            f"clustering_scale={self.clustering_scale}, orbit_scale={self.orbit_scale}, "
            f"clustering_bins={self.clustering_bins}, reference degrees 0..{len(self.reference_degree) - 1})"
        )
