"""Distributional recommendation: the item scoring model, the user-embedding denoiser and the pipeline."""

import math

import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler

from diffusers_ext import (
    DistributionalRecommendationPipeline,
    ItemScoringModel,
    UserEmbeddingDenoiser,
)
from diffusers_ext.testing import PipelineConformanceTests


class TestDistributionalRecommendationPipeline(PipelineConformanceTests):
    pipeline_class = DistributionalRecommendationPipeline

    def test_num_images_per_prompt(self):
        pytest.skip("draws per user are `num_samples` (output dimension 1 of `embeddings`); one output row per user")


def tiny_pipeline(scheduler=None, num_items=50, d=8, seed=0):
    torch.manual_seed(seed)
    denoiser = UserEmbeddingDenoiser(embedding_dim=d, hidden_size=16, num_layers=2)
    items = ItemScoringModel(num_items, d)
    scheduler = scheduler or DDPMScheduler(num_train_timesteps=50)
    pipe = DistributionalRecommendationPipeline(denoiser, items, scheduler)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_item_scores_for_all_items_and_for_candidates_agree():
    items = ItemScoringModel(20, 4)
    users = torch.randn(3, 2, 4)
    full = items.scores(users)  # (3, 2, 20)
    candidates = torch.tensor([[5, 1, 7], [0, 19, 3], [2, 2, 4]])[:, None].expand(-1, 2, -1)
    picked = items.scores(users, candidates)
    torch.testing.assert_close(picked, full.gather(-1, candidates))
    with pytest.raises(ValueError, match=r"`items` holds item 20, outside \[0, 20\)"):
        items.scores(users, torch.tensor([[20]]))


@pytest.mark.parametrize("scheduler", [DDPMScheduler(num_train_timesteps=50), DDIMScheduler(num_train_timesteps=50)])
@pytest.mark.support_cell("distributional_recommendation", "pack")
def test_a_batch_of_users_equals_each_user_alone(scheduler):
    pipe = tiny_pipeline(scheduler)
    interacted = [[1, 2, 3], [10, 11], [40]]
    batch = pipe(
        interacted,
        num_samples=4,
        num_inference_steps=5,
        generator=[torch.Generator().manual_seed(s) for s in range(3)],
    )
    assert batch.scores.shape == (3, 50) and batch.top_items.shape == (3, 10) and batch.embeddings.shape == (3, 4, 8)
    for user, items in enumerate(interacted):
        single = pipe([items], num_samples=4, num_inference_steps=5, generator=torch.Generator().manual_seed(user))
        torch.testing.assert_close(single.embeddings[0], batch.embeddings[user], rtol=0, atol=1e-6)
        assert torch.equal(single.top_items[0], batch.top_items[user])
    # interacted items are never recommended
    for user, items in enumerate(interacted):
        assert not set(items) & set(batch.top_items[user].tolist())


def test_scores_average_the_draws_and_candidates_rank_their_rows():
    pipe = tiny_pipeline(DDIMScheduler(num_train_timesteps=50))
    out = pipe([[1, 2]], num_samples=3, num_inference_steps=4, generator=torch.Generator().manual_seed(0))
    expected = torch.sigmoid(pipe.item_model.scores(out.embeddings)).mean(1)
    expected[0, [1, 2]] = -1.0
    torch.testing.assert_close(out.scores, expected)
    candidates = torch.tensor([[7, 8, 9, 10]])
    ranked = pipe([[1, 2]], num_samples=3, num_inference_steps=4, top_k=2, candidates=candidates,
                  generator=torch.Generator().manual_seed(0))  # fmt: skip
    torch.testing.assert_close(ranked.scores, expected[:, 7:11])
    assert ranked.top_items.shape == (1, 2) and ranked.top_items.max() < 4


def test_save_and_load_round_trip(tmp_path):
    pipe = tiny_pipeline(DDIMScheduler(num_train_timesteps=50))
    pipe.save_pretrained(tmp_path / "pipe")
    again = DistributionalRecommendationPipeline.from_pretrained(tmp_path / "pipe")
    again.set_progress_bar_config(disable=True)
    a = pipe([[3, 4]], num_inference_steps=3, generator=torch.Generator().manual_seed(1)).scores
    b = again([[3, 4]], num_inference_steps=3, generator=torch.Generator().manual_seed(1)).scores
    torch.testing.assert_close(a, b)


def test_bad_calls_are_refused_before_any_model_work():
    pipe = tiny_pipeline()
    with pytest.raises(ValueError, match="`interacted` must be a non-empty list"):
        pipe([])
    with pytest.raises(ValueError, match=r"`interacted\[1\]` holds item 50, outside \[0, 50\)"):
        pipe([[1], [50]])
    with pytest.raises(ValueError, match=r"`interacted\[0\]` is empty"):
        pipe([[]])
    with pytest.raises(ValueError, match="`top_k` is 60 but only 50 items are scored"):
        pipe([[1]], top_k=60)
    with pytest.raises(ValueError, match="`num_samples` must be a positive int"):
        pipe([[1]], num_samples=0)
    with pytest.raises(ValueError, match=r"`candidates` must have shape \(batch, m\) with one row per user \(2\)"):
        pipe([[1], [2]], candidates=torch.tensor([[3, 4]]))
    with pytest.raises(ValueError, match="`generator` is a list of 1 generators, but `interacted` makes a batch of 2"):
        pipe([[1], [2]], generator=[torch.Generator()])
    with pytest.raises(ValueError, match="`denoiser` draws 8-dim embeddings but `item_model` scores 4-dim ones"):
        DistributionalRecommendationPipeline(pipe.denoiser, ItemScoringModel(5, 4), DDPMScheduler())


def world_split(seed=0):
    from diffusers_ext.data.movielens import MultiTasteWorld, leave_one_out_split

    world = MultiTasteWorld(num_users=24, num_items=300, rank=4, interactions_per_user=30, seed=seed)
    return leave_one_out_split(world.interactions, num_negatives=99, seed=seed)


@pytest.mark.parametrize("method", ["distributional", "fedmf"])
def test_federated_training_is_seeded_learns_and_keeps_user_embeddings_local(method):
    from diffusers_ext import FederatedRecommendationConfig, FederatedRecommendationTrainer

    split = world_split()
    config = FederatedRecommendationConfig(
        method=method,
        embedding_dim=8,
        num_rounds=6,
        clients_per_round=12,
        denoiser_hidden_size=16,
        num_train_timesteps=20,
        num_samples=4,
        num_inference_steps=4,
        seed=3,
        learning_rate=1.0,
        local_epochs=2,
    )  # fmt: skip (at the default step the loss of 6 tiny rounds stays at log 2 within noise)
    trainer = FederatedRecommendationTrainer(config, split)
    before = [state["embeddings"].clone() for state in trainer.client_states]
    history = trainer.train()
    assert len(history) == 6 and all(math.isfinite(r["loss"]) for r in history)
    assert history[-1]["loss"] < history[0]["loss"]
    chosen = set(trainer.sample_clients(0))
    moved = {c for c, state in enumerate(trainer.client_states) if not torch.equal(state["embeddings"], before[c])}
    assert chosen <= moved  # a sampled client's own embeddings changed, on the client
    # what the server averages is the item side (and the denoiser), never a user's embeddings
    assert {key.split(".")[0] for key in trainer.shared_state()} <= {"item_model", "denoiser"}
    metrics = trainer.evaluate("validation")
    assert 0 <= metrics["hr@10"] <= 1 and 0 <= metrics["ndcg@10"] <= metrics["hr@10"]
    again = FederatedRecommendationTrainer(config, split)
    again.train()
    for key, value in trainer.shared_state().items():
        torch.testing.assert_close(again.shared_state()[key], value, rtol=0, atol=0)


def test_fedavg_weights_clients_by_their_training_items():
    from diffusers_ext import FederatedRecommendationTrainer

    updates = [({"w": torch.tensor([0.0, 2.0])}, 1), ({"w": torch.tensor([3.0, 2.0])}, 2)]
    torch.testing.assert_close(FederatedRecommendationTrainer.aggregate(updates)["w"], torch.tensor([2.0, 2.0]))


def test_hit_rate_and_ndcg_of_the_held_out_column():
    from diffusers_ext.trainers.federated_recommendation_trainer import hit_rate_and_ndcg

    scores = torch.tensor([[0.9, 0.1, 0.2], [0.1, 0.5, 0.9], [0.5, 0.9, 0.1]])
    hits, ndcg = hit_rate_and_ndcg(scores, k=2)
    torch.testing.assert_close(hits, torch.tensor([1.0, 0.0, 1.0]))
    torch.testing.assert_close(ndcg, torch.tensor([1.0, 0.0, 1 / math.log2(3)]))
    # a diverged model (NaN scores) misses: NaN counts against the held-out item, wherever it is
    nan = float("nan")
    hits, ndcg = hit_rate_and_ndcg(torch.tensor([[nan, 0.1, 0.2], [0.9, nan, nan], [0.9, 0.1, 0.2]]), k=2)
    torch.testing.assert_close(hits, torch.tensor([0.0, 0.0, 1.0]))
    torch.testing.assert_close(ndcg, torch.tensor([0.0, 0.0, 1.0]))


def test_bad_configs_are_named():
    from diffusers_ext import FederatedRecommendationConfig

    with pytest.raises(ValueError, match="`method` must be one of"):
        FederatedRecommendationConfig(method="fedsgd")
    with pytest.raises(ValueError, match="`clients_per_round` must be a positive int, got 0"):
        FederatedRecommendationConfig(clients_per_round=0)


def test_bad_splits_are_named_before_training_and_skipped_users_are_said(tmp_path, caplog):
    import dataclasses
    import logging

    import numpy as np

    from diffusers_ext import FederatedRecommendationConfig, FederatedRecommendationTrainer
    from diffusers_ext.data.movielens import leave_one_out_split, load_interactions_csv

    config = FederatedRecommendationConfig(method="fedmf", embedding_dim=4, num_rounds=1)
    split = world_split()
    train = [items.copy() for items in split.train]
    train[2][0] = split.num_items
    with pytest.raises(ValueError, match=r"client 2's training items hold item 300, outside \[0, 300\)"):
        FederatedRecommendationTrainer(config, dataclasses.replace(split, train=train))
    test = split.test.copy()
    test[5, 7] = -1
    with pytest.raises(ValueError, match=r"`split.test` holds item -1 for client 5, outside \[0, 300\)"):
        FederatedRecommendationTrainer(config, dataclasses.replace(split, test=test))
    with pytest.raises(
        ValueError, match=r"`split.validation` must have shape \(clients, 1 \+ negatives\) with 24 rows"
    ):
        FederatedRecommendationTrainer(config, dataclasses.replace(split, validation=split.validation[:3]))
    with pytest.raises(ValueError, match="client 0 has no training item"):
        FederatedRecommendationTrainer(config, dataclasses.replace(split, train=[np.array([], dtype=int)] + train[1:]))
    # a user's CSV: one user with 2 interactions is skipped by the split, listed, and said by the trainer
    rows = ["user,item,timestamp"] + [
        f"u{u},i{i},{t}" for u in range(2) for t, i in enumerate(range(10 * u, 10 * u + 10))
    ]
    rows += ["short,i1,1", "short,i2,2"]
    path = tmp_path / "interactions.csv"
    path.write_text("\n".join(rows) + "\n")
    split = leave_one_out_split(load_interactions_csv(str(path)), num_negatives=3)
    assert len(split.train) == 2 and list(split.skipped.values()) == ["2 distinct items, fewer than 3"]
    with caplog.at_level(logging.WARNING):
        FederatedRecommendationTrainer(config, split)
    assert "1 user(s) were skipped by the split and get no client" in caplog.text
    (tmp_path / "no_time.csv").write_text("user,item\nu0,i1\n")
    with pytest.raises(ValueError, match=r"lacks the column\(s\) \['timestamp'\]"):
        load_interactions_csv(str(tmp_path / "no_time.csv"))
