"""The federated-recommendation benchmark's measurements on hand-made cases: Kendall's tau of top-k lists, taste
coverage, the flips of ambiguous feedback, the trainer's catalogue scores, and the benchmark's target rows."""

import numpy as np
import pytest
import torch

from diffusers_ext import FederatedRecommendationConfig, FederatedRecommendationTrainer
from diffusers_ext.data.movielens import LeaveOneOutSplit, MultiTasteWorld, leave_one_out_split
from diffusers_ext.evaluation.federated_recommendation import (
    flip_training_positives,
    taste_coverage,
    top_k_kendall_tau,
)


def test_kendall_tau_of_identical_reversed_and_swapped_top_lists():
    scores = np.array([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
    assert top_k_kendall_tau(scores, scores, k=3) == pytest.approx([1.0])
    # the top 3 reversed, the rest unchanged: every pair of the union {0, 1, 2} is discordant
    reversed_top = np.array([[3.0, 4.0, 5.0, 2.0, 1.0, 0.0]])
    assert top_k_kendall_tau(scores, reversed_top, k=3) == pytest.approx([-1.0])
    # one adjacent swap among the top 3: 1 discordant pair of 3
    swapped = np.array([[4.0, 5.0, 3.0, 2.0, 1.0, 0.0]])
    assert top_k_kendall_tau(scores, swapped, k=3) == pytest.approx([1 / 3])
    # item 3 enters the top 3 in place of item 2: a's list {0, 1, 2} keeps its order in b (positions 0, 2, 3): 1;
    # b's list {0, 3, 1} sits at a's positions 0, 3, 1: pairs (0,3) +, (0,1) +, (3,1) -: 1/3; the mean: 2/3
    entered = np.array([[5.0, 3.0, 2.0, 4.0, 1.0, 0.0]])
    assert top_k_kendall_tau(scores, entered, k=3) == pytest.approx([2 / 3])
    # two unrelated rankings score near 0 (not the -0.5 of the union of two disjoint lists)
    rng = np.random.default_rng(0)
    unrelated = top_k_kendall_tau(rng.random((200, 500)), rng.random((200, 500)), k=50)
    assert abs(unrelated.mean()) < 0.02


def test_kendall_tau_leaves_excluded_items_out_and_checks_its_input():
    a = np.array([[9.0, 5.0, 4.0, 3.0, 2.0], [1.0, 2.0, 3.0, 4.0, 5.0]])
    b = np.array([[0.0, 5.0, 4.0, 3.0, 2.0], [1.0, 2.0, 3.0, 5.0, 4.0]])
    # user 0 differs only on item 0, which is excluded; user 1 swaps its top two
    taus = top_k_kendall_tau(a, b, k=2, exclude=[[0], []])
    assert taus == pytest.approx([1.0, -1.0])
    with pytest.raises(ValueError, match="same shape"):
        top_k_kendall_tau(a, b[:1], k=2)
    with pytest.raises(ValueError, match="`exclude` must hold one item list per user"):
        top_k_kendall_tau(a, b, k=2, exclude=[[0]])
    with pytest.raises(ValueError, match=r"`k` \(5\) must not exceed user 0's 4 rankable items"):
        top_k_kendall_tau(a, b, k=5, exclude=[[0], []])


def test_taste_coverage_of_a_list_covering_one_taste_and_both():
    tastes = [[np.array([0, 1]), np.array([4, 5])]]
    one_taste = np.array([[9.0, 8.0, 7.0, 0.0, 0.5, 0.4]])  # top 3: 0, 1, 2
    worst, mean = taste_coverage(one_taste, tastes, n=3)
    assert worst == pytest.approx([0.0]) and mean == pytest.approx([0.5])
    both = np.array([[9.0, 0.0, 0.0, 0.0, 8.0, 7.0]])  # top 3: 0, 4, 5
    worst, mean = taste_coverage(both, tastes, n=3)
    assert worst == pytest.approx([0.5]) and mean == pytest.approx([0.75])
    with pytest.raises(ValueError, match=r"`n` \(7\) must not exceed the 6 scored items"):
        taste_coverage(both, tastes, n=7)
    with pytest.raises(ValueError, match="one taste list per user"):
        taste_coverage(both, tastes * 2, n=3)


def _split() -> LeaveOneOutSplit:
    world = MultiTasteWorld(num_users=12, num_items=250, rank=4, interactions_per_user=20, seed=0)
    return leave_one_out_split(world.interactions, num_negatives=99, seed=0)


def test_flips_keep_counts_and_never_flip_onto_a_held_out_item():
    split = _split()
    flipped = flip_training_positives(split, 0.3, seed=1)
    for client, (before, after) in enumerate(zip(split.train, flipped.train)):
        assert len(after) == len(before)  # counts kept
        assert len(np.unique(after)) == len(after)  # still distinct items
        changed = after[after != before]
        assert len(changed) == round(0.3 * len(before))
        assert not np.isin(changed, before).any()  # onto items the user never interacted with
        assert split.test[client, 0] not in after and split.validation[client, 0] not in after
    np.testing.assert_array_equal(flipped.test, split.test)  # what clients are judged on is untouched
    np.testing.assert_array_equal(flipped.validation, split.validation)
    assert all(np.array_equal(a, b) for a, b in zip(flip_training_positives(split, 0.0).train, split.train))
    again = flip_training_positives(split, 0.3, seed=1)  # seeded
    assert all(np.array_equal(a, b) for a, b in zip(again.train, flipped.train))
    with pytest.raises(ValueError, match=r"`fraction` must be a number in \[0, 1\], got 1.5"):
        flip_training_positives(split, 1.5)
    with pytest.raises(TypeError, match="`split` must be a LeaveOneOutSplit"):
        flip_training_positives(split.train, 0.1)


@pytest.mark.parametrize("method", ["distributional", "fedmf", "fedncf", "pfedrec"])
def test_catalogue_scores_agree_with_the_candidate_scores(method):
    split = _split()
    config = FederatedRecommendationConfig(
        method=method, embedding_dim=8, num_rounds=2, clients_per_round=6, denoiser_hidden_size=16,
        ncf_hidden_size=8, num_train_timesteps=20, num_samples=3, num_inference_steps=4, learning_rate=1.0, seed=3,
    )  # fmt: skip
    trainer = FederatedRecommendationTrainer(config, split)
    trainer.train()
    catalogue = trainer.catalogue_scores(seed=5, batch_size=5)
    assert catalogue.shape == (len(split.train), split.num_items)
    candidates = trainer.candidate_scores("test", seed=5)
    torch.testing.assert_close(catalogue.gather(1, torch.as_tensor(split.test)), candidates)


def test_benchmark_targets_are_computed_from_the_recorded_comparisons():
    from diffusers_ext.evaluation.reporting import load_script

    script = load_script("benchmarks/federated_recommendation/federated_recommendation.py")

    def comparison(z, difference=0.0):
        return {"baseline": "fedmf", "z": z, "difference": difference}

    levels = [
        {"flip_fraction": p, "comparisons": {"hr@10": comparison(z, d), "round_tau": comparison(3.0),
                                             "seed_tau": comparison(1.0)}}
        for p, z, d in ((0.0, -1.0, -0.005), (0.2, 2.5, 0.02), (0.3, 1.5, 0.01))
    ]  # fmt: skip
    results = {"world": {"comparison": comparison(4.0)}, "movielens": {"levels": levels}}
    rows = script.targets_of(results)
    assert [row["met"] for row in rows] == [True, True, False, True, False, True]
    assert rows[-1]["value"] == -0.005 and rows[-1]["threshold"] == -0.01
