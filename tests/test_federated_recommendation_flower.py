"""Flower as the federated engine: the simulation runs the trainer's rounds and ends with the in-process loop's shared
models. Needs `flwr[simulation]` (the `flower` extra, tested in its own environment by CI); skipped without it."""

import pytest
import torch


flwr = pytest.importorskip("flwr")
pytest.importorskip("ray")

from diffusers_ext import FederatedRecommendationConfig, FederatedRecommendationTrainer  # noqa: E402
from diffusers_ext.data.movielens import MultiTasteWorld, leave_one_out_split  # noqa: E402
from diffusers_ext.trainers.federated_recommendation_flower import (  # noqa: E402
    config_from_run_config,
    run_flower_simulation,
    split_from_run_config,
)


def tiny_split():
    world = MultiTasteWorld(num_users=8, num_items=250, rank=4, interactions_per_user=12, seed=1)
    return leave_one_out_split(world.interactions, num_negatives=99, seed=1)


@pytest.mark.parametrize("method", ["distributional", "fedmf"])
def test_the_flower_simulation_gives_the_in_process_shared_models(method):
    split = tiny_split()
    config = FederatedRecommendationConfig(
        method=method, embedding_dim=4, num_rounds=3, clients_per_round=4, denoiser_hidden_size=8,
        num_train_timesteps=10, seed=5,
    )  # fmt: skip
    flower = run_flower_simulation(config, split)
    local = FederatedRecommendationTrainer(config, split)
    local.train()
    assert [r["round"] for r in flower.history] == [1, 2, 3]
    assert flower.history == local.history  # the same clients' losses, round by round
    expected = local.shared_state()
    assert flower.shared_state.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(flower.shared_state[key], value, rtol=0, atol=0)
    # the models moved: equal because the same rounds ran, not because nothing did
    untrained = FederatedRecommendationTrainer(config, split).shared_state()
    assert not torch.equal(
        untrained["item_model.item_embeddings.weight"], expected["item_model.item_embeddings.weight"]
    )


def test_run_config_builds_the_config_and_split_and_names_bad_keys():
    run_config = {"dataset": "multi-taste", "world-users": 8, "world-items": 250, "world-rank": 4,
                  "world-interactions": 12, "world-seed": 1, "split-seed": 1, "method": "fedmf", "num-rounds": 2}  # fmt: skip
    config = config_from_run_config(run_config)
    assert config.method == "fedmf" and config.num_rounds == 2
    split = split_from_run_config(run_config)
    assert [list(t) for t in split.train] == [list(t) for t in tiny_split().train]
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['num-round'\]"):
        config_from_run_config({"num-round": 3})
    with pytest.raises(ValueError, match="`dataset` must be 'ml-100k' or 'multi-taste', got 'ml-1m'"):
        split_from_run_config({"dataset": "ml-1m"})
