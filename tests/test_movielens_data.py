"""Recommendation data: MovieLens-100K from the recbole wheel, users' CSVs, the leave-one-out split, the multi-taste
world."""

import numpy as np
import pytest

from diffusers_ext.data.movielens import (
    MultiTasteWorld,
    is_recbole_available,
    leave_one_out_split,
    load_interactions_csv,
    load_movielens_100k,
)


def write_csv(path, rows, header="user,item,rating,timestamp"):
    path.write_text(header + "\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n")
    return str(path)


def catalogue_rows(users=3, per_user=4, items=250):
    """Each user's items at increasing timestamps, plus one interaction per remaining item (by a fourth user), so the
    catalogue is large enough for 99 negatives per held-out item."""
    rows = [(f"u{u}", f"i{u * 10 + k}", 5, 100 * u + k) for u in range(users) for k in range(per_user)]
    rows += [("filler", f"i{i}", 1, 10_000 + i) for i in range(items)]
    return rows


def test_the_split_holds_out_the_latest_items_with_unseen_negatives(tmp_path):
    data = load_interactions_csv(write_csv(tmp_path / "a.csv", catalogue_rows()))
    split = leave_one_out_split(data, num_negatives=99, seed=0)
    user = data.user_ids.index("u1")
    position = list(split.users).index(user)
    names = np.asarray(data.item_ids)
    assert names[split.test[position, 0]] == "i13" and names[split.validation[position, 0]] == "i12"
    assert sorted(names[split.train[position]]) == ["i10", "i11"]
    seen = set(data.items[data.users == user])
    assert not seen & set(split.test[position, 1:]) and not seen & set(split.validation[position, 1:])
    assert len(set(split.test[position, 1:]) | set(split.validation[position, 1:])) == 198  # disjoint, no repeats
    again = leave_one_out_split(data, num_negatives=99, seed=0)
    assert np.array_equal(again.test, split.test)


def test_users_with_fewer_than_three_items_are_skipped_and_listed(tmp_path):
    rows = catalogue_rows() + [("short", "i1", 5, 1), ("short", "i2", 5, 2)]
    data = load_interactions_csv(write_csv(tmp_path / "a.csv", rows))
    split = leave_one_out_split(data, num_negatives=5)
    assert split.skipped[data.user_ids.index("short")] == "2 distinct items, fewer than 3"
    assert "unobserved items" in split.skipped[data.user_ids.index("filler")]
    assert data.user_ids.index("short") not in split.users


def test_bad_csvs_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"lacks the column\(s\) \['timestamp'\]"):
        load_interactions_csv(write_csv(tmp_path / "a.csv", [("u", "i", 5)], header="user,item,rating"))
    with pytest.raises(ValueError, match="row 2, column 'timestamp': 'yesterday' is not a number"):
        load_interactions_csv(write_csv(tmp_path / "b.csv", [("u", "i", 5, "yesterday")]))
    with pytest.raises(ValueError, match="is not a file"):
        load_interactions_csv(str(tmp_path / "missing.csv"))
    data = load_interactions_csv(write_csv(tmp_path / "c.csv", [("u", "i", 5, 1), ("u", "j", 5, 2), ("u", "k", 5, 3)]))
    with pytest.raises(ValueError, match="`num_negatives` is 99, but there are only 3 items"):
        leave_one_out_split(data)


@pytest.mark.skipif(not is_recbole_available(), reason="the recbole wheel is not installed")
def test_movielens_100k_from_the_wheel():
    data = load_movielens_100k()
    assert (data.num_users, data.num_items, len(data.users)) == (943, 1682, 100_000)
    split = leave_one_out_split(data)
    assert len(split.users) == 943 and not split.skipped and split.test.shape == (943, 100)


def test_the_multi_taste_world_draws_from_every_taste():
    world = MultiTasteWorld(num_users=30, num_items=400, rank=6, interactions_per_user=40, seed=1)
    assert set(world.num_tastes) <= {2, 3}
    split = leave_one_out_split(world.interactions)
    assert len(split.users) == 30
    # most users' histories hit the top items of more than one of their tastes
    hits = []
    for user in range(30):
        history = set(world.interactions.items[world.interactions.users == user])
        hits.append(sum(bool(history & set(top)) for top in world.top_items(user, 20)))
    assert np.mean(np.asarray(hits) >= 2) > 0.8
