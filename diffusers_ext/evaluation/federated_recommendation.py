"""What the federated-recommendation benchmark measures beyond HR@k and NDCG@k (benchmarks/federated_recommendation/).

- [`flip_training_positives`]: ambiguous feedback: a share of each client's training positives replaced by random
  items the user never interacted with (the held-out validation and test items stay as they are).
- [`top_k_kendall_tau`]: ranking stability: Kendall's tau of each user's top-k lists under two rankings of its
  catalogue (between consecutive rounds, or between two training seeds).
- [`taste_coverage`]: on [`MultiTasteWorld`], how many of each true taste's top items a user's recommendations hold,
  for the taste covered worst and on average.
"""

import dataclasses

import numpy as np

from ..data.movielens import LeaveOneOutSplit
from ..utils import check_positive_int


def flip_training_positives(split: LeaveOneOutSplit, fraction: float, seed: int = 0) -> LeaveOneOutSplit:
    """`split` with `round(fraction * n)` of each client's `n` training positives (chosen at random) replaced by
    items drawn uniformly, without replacement, from the items the user never interacted with (neither a training
    item nor its validation or test item). Each client keeps its number of training positives, every training list
    keeps distinct items, and the held-out rows (validation, test and their negatives) are unchanged: only what the
    client learns from is corrupted, never what it is judged on.

    Args:
        split ([`LeaveOneOutSplit`]): the clean split.
        fraction (`float`): the share flipped, in `[0, 1]`.
        seed (`int`, defaults to 0): draws which positives flip and onto which items.

    Returns:
        A new [`LeaveOneOutSplit`] whose `train` lists are the corrupted ones (the input is not modified).
    """
    if not isinstance(split, LeaveOneOutSplit):
        raise TypeError(f"`split` must be a LeaveOneOutSplit, got {type(split).__name__}.")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= fraction <= 1.0:
        raise ValueError(f"`fraction` must be a number in [0, 1], got {fraction!r}.")
    rng = np.random.default_rng(seed)
    train = []
    for client, items in enumerate(split.train):
        items = np.asarray(items, dtype=np.int64)
        count = int(round(fraction * len(items)))
        if count == 0:
            train.append(items.copy())
            continue
        observed = np.zeros(split.num_items, dtype=bool)
        observed[items] = True
        observed[split.validation[client, 0]] = True
        observed[split.test[client, 0]] = True
        unobserved = np.flatnonzero(~observed)
        if len(unobserved) < count:
            raise ValueError(
                f"client {client} has {len(unobserved)} unobserved items, fewer than the {count} positives to flip "
                f"at `fraction` {fraction}."
            )
        flipped = items.copy()
        flipped[rng.choice(len(items), size=count, replace=False)] = rng.choice(unobserved, size=count, replace=False)
        train.append(flipped)
    return dataclasses.replace(split, train=train)


def _kendall_tau(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall's tau of two rank vectors without ties (`(concordant - discordant) / pairs`)."""
    upper = np.triu_indices(len(x), k=1)
    sign = np.sign(x[:, None] - x[None, :])[upper] * np.sign(y[:, None] - y[None, :])[upper]
    return float(sign.mean())


def top_k_kendall_tau(
    scores_a: np.ndarray, scores_b: np.ndarray, k: int = 50, exclude: list | None = None
) -> np.ndarray:
    """Per user, Kendall's tau of the two rankings' top-`k` lists: how the other ranking orders each list's items.

    Each ranking orders the items by descending score (ties by item index). For each of the two top-`k` lists,
    Kendall's tau between its items' positions in ranking `a` and in ranking `b`; the user's value is the mean of the
    two. 1: each list keeps its order in the other ranking (an item that left the other's top-`k` still ranks after
    the items it followed); 0: the other ranking orders the list at random (two unrelated rankings); -1: reversed.
    (Taking the union of the two lists instead would score two unrelated rankings near -0.5: their disjoint lists
    look like each other's reversal.)

    Args:
        scores_a, scores_b (`np.ndarray` of shape `(users, num_items)`): the two rankings' scores.
        k (`int`, defaults to 50): the length of the compared top lists.
        exclude (`list`, *optional*): per user, items left out of both rankings (e.g. its training items, which are
            never recommended).

    Returns:
        `np.ndarray` of shape `(users,)`: each user's tau, in `[-1, 1]`.
    """
    scores_a, scores_b = np.asarray(scores_a, dtype=np.float64), np.asarray(scores_b, dtype=np.float64)
    if scores_a.ndim != 2 or scores_a.shape != scores_b.shape:
        raise ValueError(
            f"`scores_a` and `scores_b` must have the same shape (users, num_items), got {scores_a.shape} and "
            f"{scores_b.shape}."
        )
    check_positive_int("k", k)
    if k < 2:
        raise ValueError(f"`k` must be at least 2 (tau compares pairs), got {k}.")
    if exclude is not None and len(exclude) != len(scores_a):
        raise ValueError(f"`exclude` must hold one item list per user ({len(scores_a)}), got {len(exclude)}.")
    taus = np.empty(len(scores_a))
    for user in range(len(scores_a)):
        a, b = scores_a[user].copy(), scores_b[user].copy()
        if exclude is not None:
            left_out = np.asarray(exclude[user], dtype=np.int64)
            a[left_out] = -np.inf
            b[left_out] = -np.inf
        available = int(np.isfinite(a).sum())
        if k > available:
            raise ValueError(f"`k` ({k}) must not exceed user {user}'s {available} rankable items.")
        order_a, order_b = np.argsort(-a, kind="stable"), np.argsort(-b, kind="stable")
        rank_a, rank_b = np.empty_like(order_a), np.empty_like(order_b)
        rank_a[order_a] = np.arange(len(a))
        rank_b[order_b] = np.arange(len(b))
        top_a, top_b = order_a[:k], order_b[:k]
        taus[user] = 0.5 * (_kendall_tau(rank_a[top_a], rank_b[top_a]) + _kendall_tau(rank_a[top_b], rank_b[top_b]))
    return taus


def taste_coverage(scores: np.ndarray, taste_top_items: list, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per user, the share of each true taste's top items among the user's `n` best-scored items.

    Args:
        scores (`np.ndarray` of shape `(users, num_items)`): a model's scores of the whole catalogue.
        taste_top_items (`list`): per user, one array of item indices per taste (`MultiTasteWorld.top_items`).
        n (`int`): the length of the recommendation list.

    Returns:
        `(worst, mean)`, each `np.ndarray` of shape `(users,)`: the coverage of the user's least covered taste and
        the mean over its tastes. A model that averages a user's tastes into one point covers the dominant taste (or
        none) and scores a low `worst`.
    """
    scores = np.asarray(scores)
    if scores.ndim != 2 or len(taste_top_items) != len(scores):
        raise ValueError(
            f"`scores` must have shape (users, num_items) with one taste list per user ({len(taste_top_items)}), got "
            f"{scores.shape}."
        )
    check_positive_int("n", n)
    if n > scores.shape[1]:
        raise ValueError(f"`n` ({n}) must not exceed the {scores.shape[1]} scored items.")
    worst, mean = np.empty(len(scores)), np.empty(len(scores))
    for user, tastes in enumerate(taste_top_items):
        if len(tastes) == 0:
            raise ValueError(f"`taste_top_items[{user}]` is empty; each user needs at least one taste.")
        recommended = np.argsort(-scores[user], kind="stable")[:n]
        shares = [np.isin(np.asarray(top), recommended).mean() for top in tastes]
        worst[user], mean[user] = min(shares), float(np.mean(shares))
    return worst, mean
