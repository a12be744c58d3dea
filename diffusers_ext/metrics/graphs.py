"""Graph generation metrics of the SPECTRE benchmark: validity, uniqueness and novelty (V.U.N., by networkx
isomorphism) and the degree / clustering / spectral MMDs with their ratio to the train-vs-test MMD.

Written from the published definitions (numpy and networkx; no GPL code):

- V.U.N.: a generated graph counts if it is valid, not isomorphic to an earlier unique generated graph, and not
  isomorphic to any training graph; V.U.N. = count / #generated.
- MMD^2 = E k(x, x') + E k(y, y') - 2 E k(x, y) (absolute value) over per-graph histograms normalised to pmfs, with
  the Gaussian-TV kernel `k = exp(-TV^2 / (2 sigma^2))`, `TV = 0.5 ||p - q||_1`: degree histogram (sigma 1),
  100-bin clustering histogram on [0, 1] (sigma 0.1), 200-bin histogram of normalised-Laplacian eigenvalues on
  [-1e-5, 2] (sigma 1).
- ratio = MMD(generated, test) / MMD(train, test), averaged over the statistics.

The 4-node orbit and wavelet statistics of the benchmark are not implemented here.
"""

from collections.abc import Callable

import numpy as np


STATISTICS = ("degree", "clustering", "spectral")
_SIGMA = {"degree": 1.0, "clustering": 0.1, "spectral": 1.0}


def _nx():
    try:
        import networkx
    except ImportError as error:  # pragma: no cover
        raise ImportError("graph metrics need networkx: `pip install diffusers-ext[graphs]`.") from error
    return networkx


def is_valid_tree(graph) -> bool:
    """Tree validity of the benchmark: `networkx.is_tree`."""
    nx = _nx()
    return graph.number_of_nodes() > 0 and nx.is_tree(graph)


def is_valid_planar(graph) -> bool:
    """Planar validity of the benchmark: connected and planar."""
    nx = _nx()
    return graph.number_of_nodes() > 0 and nx.is_connected(graph) and nx.check_planarity(graph)[0]


VALIDITY = {"tree": is_valid_tree, "planar": is_valid_planar}


def vun(generated: list, train: list, validity: Callable | str) -> dict[str, float]:
    """Validity, uniqueness, novelty and V.U.N. fractions of `generated` against `train`.

    Args:
        generated (`list[networkx.Graph]`): the samples, in order.
        train (`list[networkx.Graph]`): the training graphs.
        validity (`Callable` or `str`): a predicate on a graph, or `"tree"` / `"planar"`.

    Returns:
        `dict` with `"valid"`, `"unique"`, `"novel"` (fractions of all generated graphs; unique = not isomorphic to
        an earlier generated graph, novel = not isomorphic to a training graph) and `"vun"` (valid, unique and novel).
    """
    nx = _nx()
    if isinstance(validity, str):
        if validity not in VALIDITY:
            raise ValueError(f"`validity` must be a callable or one of {tuple(VALIDITY)}, got {validity!r}.")
        validity = VALIDITY[validity]
    if not generated:
        raise ValueError("`generated` must be a non-empty list of graphs.")
    unique_graphs: list = []
    counts = {"valid": 0, "unique": 0, "novel": 0, "vun": 0}
    for graph in generated:
        valid = bool(validity(graph))
        unique = not any(nx.faster_could_be_isomorphic(graph, u) and nx.is_isomorphic(graph, u) for u in unique_graphs)
        if unique:
            unique_graphs.append(graph)
        novel = not any(nx.faster_could_be_isomorphic(graph, t) and nx.is_isomorphic(graph, t) for t in train)
        counts["valid"] += valid
        counts["unique"] += unique
        counts["novel"] += novel
        counts["vun"] += valid and unique and novel
    return {k: v / len(generated) for k, v in counts.items()}


def _histograms(graphs: list, statistic: str) -> list[np.ndarray]:
    nx = _nx()
    out = []
    for graph in graphs:
        if statistic == "degree":
            hist = np.asarray(nx.degree_histogram(graph), dtype=np.float64)
        elif statistic == "clustering":
            values = list(nx.clustering(graph).values())
            hist, _ = np.histogram(values, bins=100, range=(0.0, 1.0))
            hist = hist.astype(np.float64)
        elif statistic == "spectral":
            if graph.number_of_nodes() == 0:
                hist = np.zeros(200)
            else:
                laplacian = nx.normalized_laplacian_matrix(graph).toarray()
                eigenvalues = np.linalg.eigvalsh(laplacian)
                # The benchmark's range, kept unclipped so values stay comparable with published MMDs. An eigenvalue
                # of exactly 2 (any bipartite graph, e.g. a tree) sits on the upper edge: `eigvalsh` may return it a
                # rounding error above 2, and the histogram then drops it, as the published evaluation code does.
                hist, _ = np.histogram(eigenvalues, bins=200, range=(-1e-5, 2.0))
                hist = hist.astype(np.float64)
        else:
            raise ValueError(f"`statistic` must be one of {STATISTICS}, got {statistic!r}.")
        total = hist.sum()
        out.append(hist / total if total > 0 else hist)
    return out


def _gaussian_tv_mmd(x: list[np.ndarray], y: list[np.ndarray], sigma: float) -> float:
    size = max(max(len(h) for h in x), max(len(h) for h in y))
    X = np.stack([np.pad(h, (0, size - len(h))) for h in x])
    Y = np.stack([np.pad(h, (0, size - len(h))) for h in y])

    def mean_kernel(A, B):
        tv = 0.5 * np.abs(A[:, None, :] - B[None, :, :]).sum(-1)
        return float(np.exp(-(tv**2) / (2 * sigma**2)).mean())

    return abs(mean_kernel(X, X) + mean_kernel(Y, Y) - 2 * mean_kernel(X, Y))


def graph_mmd(generated: list, reference: list, statistics=STATISTICS) -> dict[str, float]:
    """Squared MMDs between two lists of graphs, one per statistic among `STATISTICS`."""
    if not generated or not reference:
        raise ValueError("`generated` and `reference` must be non-empty lists of graphs.")
    unknown = [s for s in statistics if s not in STATISTICS]
    if unknown:
        raise ValueError(f"`statistics` must be among {STATISTICS}, got {unknown}.")
    return {s: _gaussian_tv_mmd(_histograms(generated, s), _histograms(reference, s), _SIGMA[s]) for s in statistics}


def mmd_ratios(generated: list, train: list, test: list, statistics=STATISTICS) -> dict[str, float]:
    """`MMD(generated, test) / MMD(train, test)` per statistic, and their mean under `"ratio"`."""
    ours = graph_mmd(generated, test, statistics)
    base = graph_mmd(train, test, statistics)
    ratios = {s: ours[s] / base[s] if base[s] > 0 else float("inf") for s in statistics}
    ratios["ratio"] = float(np.mean([ratios[s] for s in statistics]))
    return ratios
