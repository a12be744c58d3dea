"""Implicit-feedback recommendation data: MovieLens-100K read from the `recbole` wheel, users' own CSVs, the
leave-one-out split of federated recommendation, and a multi-taste world with a known truth.

- [`load_movielens_100k`]: the 100,000 ratings of 943 users on 1,682 movies (with timestamps) that the `recbole`
  1.2.1 wheel ships (`recbole/dataset_example/ml-100k/ml-100k.inter`). The package is never imported (its pins are
  heavy): the file is located through its installed metadata (`pip install --no-deps recbole==1.2.1`), or given with
  `path`. MovieLens' terms do not allow redistribution; nothing is copied into this repository.
- [`load_interactions_csv`]: a user's own interactions, a CSV with `user`, `item` and `timestamp` columns (and an
  optional `rating`).
- [`leave_one_out_split`]: the protocol of PFedRec (IJCAI 2023) and the federated-recommendation work after it: one
  client per user, ratings binarised to implicit feedback, each user's latest interaction (by timestamp) the test item,
  the second latest the validation item, the rest training, and 99 sampled unobserved items as the negatives of each
  held-out item (scored with HR@10 and NDCG@10).
- [`MultiTasteWorld`]: users who each mix 2-3 taste vectors in a low-rank item space, their feedback drawn from the
  mixture, so a single user embedding is misspecified by construction and the judge knows every taste's top items.
"""

import csv
import importlib.metadata
import os
from dataclasses import dataclass

import numpy as np

from ..utils import check_positive_int


RECBOLE = "recbole"
ML100K_FILE = ("dataset_example", "ml-100k", "ml-100k.inter")
INSTALL_HINT = (
    "install its wheel without its dependencies: `pip install --no-deps recbole==1.2.1`, or pass `path=` an "
    "ml-100k.inter file"
)
MIN_INTERACTIONS = 3  # one training, one validation and one test item


@dataclass
class Interactions:
    """Implicit feedback: one row per (user, item) interaction, users and items as contiguous indices.

    Args:
        users (`np.ndarray` of shape `(N,)`, int64): user index in `[0, num_users)`.
        items (`np.ndarray` of shape `(N,)`, int64): item index in `[0, num_items)`.
        timestamps (`np.ndarray` of shape `(N,)`, float64): when each interaction happened (orders a user's history).
        num_users (`int`), num_items (`int`): the index ranges.
        user_ids (`list`), item_ids (`list`): the source's raw ids, by index.
    """

    users: np.ndarray
    items: np.ndarray
    timestamps: np.ndarray
    num_users: int
    num_items: int
    user_ids: list
    item_ids: list


def is_recbole_available() -> bool:
    """Whether the `recbole` wheel is installed (checked through its metadata; nothing is imported)."""
    try:
        importlib.metadata.distribution(RECBOLE)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def movielens_100k_path() -> str:
    """The installed `recbole` wheel's `ml-100k.inter`; an `ImportError` if it is absent."""
    try:
        distribution = importlib.metadata.distribution(RECBOLE)
    except importlib.metadata.PackageNotFoundError as error:
        raise ImportError(
            f"MovieLens-100K ships in the `recbole` wheel, which is not installed; {INSTALL_HINT}."
        ) from error
    path = os.path.join(str(distribution.locate_file(RECBOLE)), *ML100K_FILE)
    if not os.path.isfile(path):
        raise ImportError(f"`recbole` is installed but has no {path}; {INSTALL_HINT}.")
    return path


def _indexed(users: list, items: list, timestamps: list) -> Interactions:
    user_ids, user_index = np.unique(np.asarray(users, dtype=object).astype(str), return_inverse=True)
    item_ids, item_index = np.unique(np.asarray(items, dtype=object).astype(str), return_inverse=True)
    return Interactions(
        users=user_index.astype(np.int64),
        items=item_index.astype(np.int64),
        timestamps=np.asarray(timestamps, dtype=np.float64),
        num_users=len(user_ids),
        num_items=len(item_ids),
        user_ids=user_ids.tolist(),
        item_ids=item_ids.tolist(),
    )


def load_movielens_100k(path: str | None = None) -> Interactions:
    """MovieLens-100K as implicit feedback: every rating is an interaction (PFedRec's binarisation), 943 users,
    1,682 items, 100,000 interactions with their timestamps."""
    path = movielens_100k_path() if path is None else path
    users, items, timestamps = [], [], []
    with open(path, encoding="utf-8") as f:
        header = f.readline().rstrip("\n").split("\t")
        columns = {name.split(":")[0]: i for i, name in enumerate(header)}
        for need in ("user_id", "item_id", "timestamp"):
            if need not in columns:
                raise ValueError(f"{path!r} has no {need!r} column (header {header}).")
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if len(fields) != len(header):
                continue
            users.append(fields[columns["user_id"]])
            items.append(fields[columns["item_id"]])
            timestamps.append(float(fields[columns["timestamp"]]))
    return _indexed(users, items, timestamps)


def load_interactions_csv(path: str) -> Interactions:
    """A user's own interactions: a CSV whose header names `user`, `item` and `timestamp` (any other column, e.g.
    `rating`, is ignored: every row is an interaction). A missing column, an empty file or a timestamp that is not a
    number is a `ValueError` naming the file, the row and the column."""
    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        raise ValueError(f"the interactions CSV {path!r} is not a file.")
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise ValueError(f"{path!r} is empty; expected a header with user, item and timestamp columns.")
    header = [name.strip().lower() for name in rows[0]]
    missing = [name for name in ("user", "item", "timestamp") if name not in header]
    if missing:
        raise ValueError(
            f"{path!r} lacks the column(s) {missing}: its header is {rows[0]}; expected user, item, timestamp."
        )
    index = {name: header.index(name) for name in ("user", "item", "timestamp")}
    users, items, timestamps = [], [], []
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != len(header):
            raise ValueError(f"{path!r} row {line} has {len(row)} fields, the header {len(header)}.")
        try:
            timestamps.append(float(row[index["timestamp"]]))
        except ValueError:
            raise ValueError(
                f"{path!r} row {line}, column 'timestamp': {row[index['timestamp']]!r} is not a number."
            ) from None
        users.append(row[index["user"]].strip())
        items.append(row[index["item"]].strip())
    if not users:
        raise ValueError(f"{path!r} holds a header but no interaction.")
    return _indexed(users, items, timestamps)


@dataclass
class LeaveOneOutSplit:
    """Per-user leave-one-out split with sampled negatives.

    Args:
        train (`list[np.ndarray]`): each kept user's training items (all but the two latest), by user position.
        validation (`np.ndarray` of shape `(U, 1 + num_negatives)`): the second-latest item first, then its negatives.
        test (`np.ndarray` of shape `(U, 1 + num_negatives)`): the latest item first, then its negatives.
        users (`np.ndarray` of shape `(U,)`): the kept users' indices.
        skipped (`dict[int, str]`): the users left out, with why (fewer than 3 distinct items, or too few unobserved
            items to draw the negatives from); reported, not silent.
        num_items (`int`): the item index range.
    """

    train: list
    validation: np.ndarray
    test: np.ndarray
    users: np.ndarray
    skipped: dict
    num_items: int


def leave_one_out_split(interactions: Interactions, num_negatives: int = 99, seed: int = 0) -> LeaveOneOutSplit:
    """PFedRec's split: per user, the latest distinct item (by timestamp; ties broken by item index) is the test item,
    the second latest the validation item, the rest training; `num_negatives` items the user never interacted with
    are drawn (seeded, without replacement; the validation and test negatives disjoint) for each held-out item. Users
    with fewer than 3 distinct items, or with fewer than `2 num_negatives` unobserved items, cannot be split and are
    skipped; `skipped` lists them with the reason."""
    check_positive_int("num_negatives", num_negatives)
    if interactions.num_items < num_negatives + MIN_INTERACTIONS:
        raise ValueError(
            f"`num_negatives` is {num_negatives}, but there are only {interactions.num_items} items; at least "
            f"{num_negatives + MIN_INTERACTIONS} are needed."
        )
    order = np.lexsort((interactions.items, interactions.timestamps, interactions.users))
    users, items = interactions.users[order], interactions.items[order]
    bounds = np.searchsorted(users, np.arange(interactions.num_users + 1))
    rng = np.random.default_rng(seed)
    train, validation, test, kept, skipped = [], [], [], [], {}
    for user in range(interactions.num_users):
        history = items[bounds[user] : bounds[user + 1]]
        _, first = np.unique(history[::-1], return_index=True)  # each item's latest occurrence
        distinct = np.ascontiguousarray(history[::-1][np.sort(first)][::-1])  # distinct items in time order
        if len(distinct) < MIN_INTERACTIONS:
            skipped[user] = f"{len(distinct)} distinct items, fewer than {MIN_INTERACTIONS}"
            continue
        seen = np.zeros(interactions.num_items, dtype=bool)
        seen[distinct] = True
        unseen = np.flatnonzero(~seen)
        if len(unseen) < 2 * num_negatives:
            skipped[user] = f"{len(unseen)} unobserved items, fewer than 2 x {num_negatives} negatives"
            continue
        negatives = rng.choice(unseen, size=2 * num_negatives, replace=False)
        train.append(distinct[:-2])
        validation.append(np.concatenate([[distinct[-2]], negatives[:num_negatives]]))
        test.append(np.concatenate([[distinct[-1]], negatives[num_negatives:]]))
        kept.append(user)
    if not kept:
        raise ValueError(f"no user has {MIN_INTERACTIONS} or more distinct interactions; nothing to split.")
    return LeaveOneOutSplit(
        train=train,
        validation=np.stack(validation),
        test=np.stack(test),
        users=np.asarray(kept, dtype=np.int64),
        skipped=skipped,
        num_items=interactions.num_items,
    )


class MultiTasteWorld:
    """Users who mix several tastes, with a known truth.

    Items are points `V` (`num_items x rank`, standard normal) of a low-rank space; user `u` has `2` or `3` taste
    vectors `T_u` (unit norm, `rank`) and mixture weights; each interaction picks a taste by its weight and an item
    with probability `softmax(V t / temperature)` (without repeats), at increasing timestamps. A single embedding has
    to average the tastes: its top items fall between them.

    Args:
        num_users (`int`), num_items (`int`), rank (`int`): sizes.
        interactions_per_user (`int`, defaults to 40): interactions drawn per user.
        temperature (`float`, defaults to 0.3): the sharpness of each taste's item distribution.
        seed (`int`, defaults to 0): draws everything.
    """

    def __init__(
        self,
        num_users: int = 200,
        num_items: int = 500,
        rank: int = 8,
        interactions_per_user: int = 40,
        temperature: float = 0.3,
        seed: int = 0,
    ):
        for name, value in (
            ("num_users", num_users),
            ("num_items", num_items),
            ("rank", rank),
            ("interactions_per_user", interactions_per_user),
        ):
            check_positive_int(name, value)
        if interactions_per_user + 2 * 99 > num_items:
            raise ValueError(
                f"`num_items` ({num_items}) must leave 2 x 99 negatives beyond `interactions_per_user` "
                f"({interactions_per_user})."
            )
        if not temperature > 0:
            raise ValueError(f"`temperature` must be positive, got {temperature!r}.")
        rng = np.random.default_rng(seed)
        self.item_factors = rng.standard_normal((num_items, rank))
        self.num_tastes = rng.integers(2, 4, size=num_users)
        self.tastes = []
        self.weights = []
        for count in self.num_tastes:
            vectors = rng.standard_normal((count, rank))
            self.tastes.append(vectors / np.linalg.norm(vectors, axis=1, keepdims=True))
            self.weights.append(rng.dirichlet(np.full(count, 4.0)))
        self.temperature = temperature
        users, items, timestamps = [], [], []
        for user in range(num_users):
            chosen = self._draw_items(user, interactions_per_user, rng)
            users += [user] * len(chosen)
            items += chosen
            timestamps += list(range(len(chosen)))
        self.interactions = Interactions(
            users=np.asarray(users, dtype=np.int64),
            items=np.asarray(items, dtype=np.int64),
            timestamps=np.asarray(timestamps, dtype=np.float64),
            num_users=num_users,
            num_items=num_items,
            user_ids=[str(u) for u in range(num_users)],
            item_ids=[str(i) for i in range(num_items)],
        )

    def taste_probabilities(self, user: int) -> np.ndarray:
        """`(num_tastes, num_items)`: each of the user's tastes' item distribution."""
        logits = self.tastes[user] @ self.item_factors.T / self.temperature
        logits -= logits.max(1, keepdims=True)
        probabilities = np.exp(logits)
        return probabilities / probabilities.sum(1, keepdims=True)

    def _draw_items(self, user: int, count: int, rng: np.random.Generator) -> list:
        probabilities = self.taste_probabilities(user)
        chosen, taken = [], np.zeros(probabilities.shape[1], dtype=bool)
        while len(chosen) < count:
            taste = rng.choice(len(probabilities), p=self.weights[user])
            p = np.where(taken, 0.0, probabilities[taste])
            item = int(rng.choice(len(p), p=p / p.sum()))
            taken[item] = True
            chosen.append(item)
        return chosen

    def top_items(self, user: int, k: int = 10) -> list[np.ndarray]:
        """Each of the user's tastes' `k` most likely items (the judge's truth for taste coverage)."""
        check_positive_int("k", k)
        return [np.argsort(-p)[:k] for p in self.taste_probabilities(user)]
