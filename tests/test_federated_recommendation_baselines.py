"""The federated recommendation trainer's baselines (FedMF, FedNCF, PFedRec-style clients), its centralised upper
reference, and the local update each of them shares."""

import copy
import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from diffusers_ext import (
    FederatedRecommendationConfig,
    FederatedRecommendationTrainer,
    ItemScoringModel,
    NeuralItemScoringModel,
)
from diffusers_ext.data.movielens import LeaveOneOutSplit, MultiTasteWorld, leave_one_out_split
from diffusers_ext.trainers.federated_recommendation_trainer import best_scoring_assignment


def world_split(seed=0, num_users=16):
    world = MultiTasteWorld(num_users=num_users, num_items=250, rank=4, interactions_per_user=20, seed=seed)
    return leave_one_out_split(world.interactions, num_negatives=99, seed=seed)


def tiny_config(**overrides):
    options = {"embedding_dim": 8, "num_rounds": 5, "clients_per_round": 8, "denoiser_hidden_size": 16,
               "ncf_hidden_size": 8, "num_train_timesteps": 20, "num_samples": 4, "num_inference_steps": 4, "seed": 2,
               "learning_rate": 1.0, "local_epochs": 2}  # fmt: skip
    return FederatedRecommendationConfig(**{**options, **overrides})


def test_neural_item_scores_for_all_items_and_for_candidates_agree_and_round_trip(tmp_path):
    torch.manual_seed(0)
    model = NeuralItemScoringModel(20, 4, hidden_size=6)
    users = torch.randn(3, 4)
    candidates = torch.tensor([[5, 1, 7], [0, 19, 3], [2, 2, 4]])
    full = model.scores(users)  # (3, 20)
    assert full.shape == (3, 20)
    torch.testing.assert_close(model.scores(users, candidates), full.gather(-1, candidates))
    # the MLP branch matters: the score is not the plain dot product of the parent class
    plain = ItemScoringModel.scores(model, users)
    assert not torch.allclose(full, plain)
    model.save_pretrained(tmp_path / "ncf")
    again = NeuralItemScoringModel.from_pretrained(tmp_path / "ncf")
    assert again.config.hidden_size == 6
    torch.testing.assert_close(again.scores(users), full)
    with pytest.raises(ValueError, match=r"`items` holds item 20, outside \[0, 20\)"):
        model.scores(users, torch.tensor([[20], [0], [0]]))
    with pytest.raises(ValueError, match="`hidden_size` must be a positive int"):
        NeuralItemScoringModel(20, 4, hidden_size=0)


def test_each_user_embedding_trains_on_its_own_half_of_the_positives():
    split = world_split()
    config = tiny_config(num_user_embeddings=3, local_epochs=1, embedding_assignment="random_half")
    trainer = FederatedRecommendationTrainer(config, split)
    client = 1
    state = {k: v.clone() for k, v in trainer.client_states[client].items()}
    assert not all(torch.equal(state["masks"][0], m) for m in state["masks"][1:])  # the halves differ
    items = copy.deepcopy(trainer.item_model)
    _, count, loss = trainer.local_update(client, round_index=0)
    # the first (only) epoch's loss, recomputed embedding by embedding from the same draws
    positives = torch.as_tensor(split.train[client])
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + client)
    negatives = torch.randint(
        0, split.num_items, (len(positives) * config.negatives_per_positive,), generator=generator
    )
    total, weight = 0.0, 0.0
    for k in range(3):
        half = positives[state["masks"][k]]
        logits = items.scores(state["embeddings"][k], torch.cat([half, negatives]))
        labels = torch.cat([torch.ones(len(half)), torch.zeros(len(negatives))])
        total += F.binary_cross_entropy_with_logits(logits, labels, reduction="sum").item()
        weight += len(half) + len(negatives)
    assert count == len(positives)
    assert math.isclose(loss, total / weight, rel_tol=1e-5)


def two_taste_trainer(user_embeddings, assignment="best_scoring"):
    """One client whose positives are items 0-2 (taste A, item embedding (1, 0)) and 3-5 (taste B, (0, 1)), with
    the given `(2, 2)` user embeddings and no item bias."""
    split = LeaveOneOutSplit(
        train=[np.arange(6)],
        validation=np.array([[6, 7, 8]]),
        test=np.array([[9, 7, 8]]),
        users=np.array([0]),
        skipped={},
        num_items=10,
    )
    config = tiny_config(embedding_dim=2, num_user_embeddings=2, embedding_assignment=assignment, local_epochs=1)
    trainer = FederatedRecommendationTrainer(config, split)
    with torch.no_grad():
        trainer.item_model.item_embeddings.weight.zero_()
        trainer.item_model.item_embeddings.weight[:3, 0] = 1.0
        trainer.item_model.item_embeddings.weight[3:6, 1] = 1.0
        trainer.item_model.item_bias.weight.zero_()
    trainer.client_states[0]["embeddings"] = torch.tensor(user_embeddings)
    return trainer


def test_best_scoring_assignment_gives_each_taste_to_the_embedding_leaning_towards_it():
    # embedding 0 leans towards taste B, embedding 1 towards taste A: the assignment follows the scores, not the order
    trainer = two_taste_trainer([[0.0, 2.0], [2.0, 0.0]])
    masks = trainer.positive_masks(0, trainer.item_model)
    expected = torch.tensor([[False] * 3 + [True] * 3, [True] * 3 + [False] * 3])
    assert torch.equal(masks, expected)
    assert torch.equal(trainer.positive_masks(0, trainer.item_model), masks)  # deterministic
    # the local update fits each embedding on its taste and records the assignment it used
    trainer.local_update(0, round_index=0)
    assert torch.equal(trainer.client_states[0]["masks"], expected)
    # the random halves ignore the scores: the client's fixed masks, whatever the embeddings
    halves = two_taste_trainer([[0.0, 2.0], [2.0, 0.0]], assignment="random_half")
    stored = halves.client_states[0]["masks"]
    assert torch.equal(halves.positive_masks(0, halves.item_model), stored)
    assert not torch.equal(stored, expected)


def test_best_scoring_assignment_leaves_no_embedding_without_a_positive():
    # embedding 0 scores every positive highest; embedding 1 takes the one it scores best from that group (taste B,
    # the first of its ties: item 3)
    trainer = two_taste_trainer([[2.0, 2.0], [-1.0, -0.5]])
    masks = trainer.positive_masks(0, trainer.item_model)
    assert torch.equal(masks.int(), torch.tensor([[1, 1, 1, 0, 1, 1], [0, 0, 0, 1, 0, 0]]))
    # three embeddings all losing to the first: each empty one, in order, takes its best from the largest group
    scores = torch.tensor([[9.0, 9.0, 9.0, 9.0], [0.0, 3.0, 1.0, 0.0], [0.0, 5.0, 0.0, 2.0]])
    masks = best_scoring_assignment(scores)
    assert torch.equal(masks.int(), torch.tensor([[1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 1]]))
    assert (masks.sum(1) >= 1).all() and (masks.sum(0) == 1).all()  # a partition, nobody empty
    # fewer positives than embeddings: the last one is shared rather than emptying its group
    shared = best_scoring_assignment(torch.tensor([[1.0], [0.0]]))
    assert shared.all()
    with pytest.raises(ValueError, match=r"`scores` must have shape \(embeddings, positives >= 1\), got \(2, 0\)"):
        best_scoring_assignment(torch.zeros(2, 0))


def test_the_embedding_assignment_option_is_checked():
    with pytest.raises(
        ValueError, match=r"`embedding_assignment` must be one of \('best_scoring', 'random_half'\), got 'kmeans'"
    ):
        tiny_config(embedding_assignment="kmeans")


@pytest.mark.parametrize("method", ["fedncf", "pfedrec"])
def test_single_embedding_baselines_are_seeded_learn_and_keep_their_side_local(method):
    split = world_split()
    config = tiny_config(method=method)
    trainer = FederatedRecommendationTrainer(config, split)
    history = trainer.train()
    assert history[-1]["loss"] < history[0]["loss"]
    shared = trainer.shared_state()
    assert {key.split(".")[0] for key in shared} == {"item_model"}  # no denoiser, no user parameter
    if method == "fedncf":
        assert isinstance(trainer.item_model, NeuralItemScoringModel)
        assert any(key.startswith("item_model.mlp.") for key in shared)
    else:  # PFedRec's score function (embedding and bias) stays on the client
        assert all(state["bias"].shape == (1,) for state in trainer.client_states)
        assert any(state["bias"].abs().item() > 0 for state in trainer.client_states)
    before = copy.deepcopy(trainer.client_states)
    metrics = trainer.evaluate("validation")
    assert 0 <= metrics["ndcg@10"] <= metrics["hr@10"] <= 1
    assert trainer.evaluate("validation") == metrics  # the evaluation's own fine-tuning is seeded
    for state, old in zip(trainer.client_states, before):  # and it changes nothing a client keeps
        assert all(torch.equal(state[k], old[k]) for k in old)
    again = FederatedRecommendationTrainer(config, split)
    again.train()
    for key, value in shared.items():
        torch.testing.assert_close(again.shared_state()[key], value, rtol=0, atol=0)
    with pytest.raises(ValueError, match=f"`method='{method}'` has no denoiser"):
        trainer.pipeline()


def test_the_centralised_reference_visits_every_user_each_round_without_averaging():
    split = world_split()
    federated = FederatedRecommendationTrainer(tiny_config(num_rounds=1, clients_per_round=4), split)
    pooled = FederatedRecommendationTrainer(tiny_config(num_rounds=1, clients_per_round=4, centralised=True), split)
    start = [state["embeddings"].clone() for state in pooled.client_states]
    federated.train()
    pooled.train()
    moved = [not torch.equal(state["embeddings"], s) for state, s in zip(pooled.client_states, start)]
    assert all(moved)  # every user, not a sample of 4
    assert sum(not torch.equal(a["embeddings"], s) for a, s in zip(federated.client_states, start)) == 4
    # sequential: the shared models are the last user's local result, which no average of the updates gives
    with pytest.raises(ValueError, match="`centralised=True` trains on pooled data in this process"):
        pooled.train_round(1, run_local_updates=pooled.run_local_updates)
    again = FederatedRecommendationTrainer(tiny_config(num_rounds=1, clients_per_round=4, centralised=True), split)
    again.train()
    for key, value in pooled.shared_state().items():
        torch.testing.assert_close(again.shared_state()[key], value, rtol=0, atol=0)
    with pytest.raises(ValueError, match="`centralised` must be a bool, got 1"):
        tiny_config(centralised=1)
