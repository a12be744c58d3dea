"""GraphGRPOTrainer: advantage and loss math against hand-computed values, training, errors, checkpoint/resume."""

import math

import pytest
import torch

from diffusers_ext import (
    GraphDiscreteFlowScheduler,
    GraphFlowPipeline,
    GraphGRPOConfig,
    GraphGRPOTrainer,
    GraphTransformerModel,
)
from diffusers_ext.rewards.graphs import tree_validity_reward
from diffusers_ext.trainers.graph_grpo_trainer import graph_grpo_advantages, mse_log_ratio_kl


pytest.importorskip("networkx")


def make_pipe(seed=0, rate="analytic"):
    torch.manual_seed(seed)
    model = GraphTransformerModel.tiny()
    scheduler = GraphDiscreteFlowScheduler(edge_marginals=[0.7, 0.3], rate=rate)
    return GraphFlowPipeline(model=model, scheduler=scheduler)


def make_args(tmp_path, **overrides):
    options = {
        "output_dir": str(tmp_path / "out"),
        "max_steps": 2,
        "num_generations": 4,
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "num_inference_steps": 4,
        "num_nodes": [5, 6],
        "learning_rate": 1e-3,
        "save_strategy": "no",
        "disable_tqdm": True,
    }
    options.update(overrides)
    return GraphGRPOConfig(**options)


def edge_count_reward(graphs, **columns):
    """A dense reward with spread: the number of edges."""
    return [float(g.number_of_edges()) for g in graphs]


# ------------------------------------------------------------------------------------------------------------------
# Advantage and loss math
# ------------------------------------------------------------------------------------------------------------------


def test_per_size_advantages_match_hand_computation():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 4.0, 2.0, 4.0])
    keys = torch.tensor([5, 5, 5, 5, 6, 6, 6, 6])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    adv, group_std = graph_grpo_advantages(rewards, keys, groups, "per_size")
    # size 5: mean 0.25, population std sqrt(0.25 * 0.75); size 6: mean 3, population std 1
    s5 = math.sqrt(0.25 * 0.75)
    expected = [0.75 / (s5 + 1e-4)] + [-0.25 / (s5 + 1e-4)] * 3 + [-1 / 1.0001, 1 / 1.0001] * 2
    assert adv.tolist() == pytest.approx(expected, rel=1e-6)
    # group std is the unbiased std of each group: [1, 0] -> 1/sqrt(2), [0, 0] -> 0, [2, 4] -> sqrt(2)
    assert group_std.tolist() == pytest.approx([math.sqrt(0.5), 0.0, math.sqrt(2), math.sqrt(2)], rel=1e-6)


def test_group_batch_none_advantages_and_clip():
    rewards = torch.tensor([1.0, 3.0, 5.0, 5.0])
    keys = torch.tensor([4, 4, 4, 4])
    groups = torch.tensor([0, 0, 1, 1])
    adv, _ = graph_grpo_advantages(rewards, keys, groups, "group")
    std = math.sqrt(2.0)  # unbiased std of [1, 3]
    assert adv.tolist() == pytest.approx([-1 / (std + 1e-4), 1 / (std + 1e-4), 0.0, 0.0], rel=1e-6)
    adv, _ = graph_grpo_advantages(rewards, keys, groups, "none")
    assert adv.tolist() == pytest.approx([-1.0, 1.0, 0.0, 0.0])
    adv, _ = graph_grpo_advantages(rewards, keys, groups, "batch")
    batch_std = float(rewards.std())
    assert adv.tolist() == pytest.approx([-1 / (batch_std + 1e-4), 1 / (batch_std + 1e-4), 0.0, 0.0], rel=1e-6)
    # one success among 100: (1 - 0.01) / sqrt(0.01 * 0.99) = 9.95 > 5, clipped
    rewards = torch.tensor([1.0] + [0.0] * 99)
    adv, _ = graph_grpo_advantages(rewards, torch.zeros(100), torch.zeros(100, dtype=torch.long), "per_size")
    assert float(adv[0]) == 5.0 and float(adv[1]) == pytest.approx(-0.01 / (math.sqrt(0.0099) + 1e-4), rel=1e-5)


def test_constant_reward_gives_zero_advantages():
    rewards = torch.full((8,), 0.7)
    for scale in ("per_size", "group", "batch", "none"):
        adv, std = graph_grpo_advantages(rewards, torch.tensor([5] * 8), torch.arange(8) // 4, scale)
        assert torch.equal(adv, torch.zeros(8)) and torch.equal(std, torch.zeros(2))


def test_mse_kl():
    assert mse_log_ratio_kl(torch.tensor([1.0, -2.0]), torch.tensor([0.5, 0.0])).tolist() == [0.25, 4.0]


def test_clipped_loss_and_kl_match_hand_computation(tmp_path):
    trainer = GraphGRPOTrainer(make_pipe(), edge_count_reward, make_args(tmp_path, beta=0.0))
    rollout = trainer.score_rollout(trainer.generate(0))
    index = torch.arange(3)
    i = 1
    with torch.no_grad():
        new = trainer.step_log_prob(trainer.model, rollout, index, i)
    # ratios 1.5 (A = +1, clipped to 1.28), 0.5 (A = -1, clipped to 0.8), 1.1 (A = +2, inside)
    rollout.log_probs[index, i] = new - torch.log(torch.tensor([1.5, 0.5, 1.1]))
    rollout.advantages[index] = torch.tensor([1.0, -1.0, 2.0])
    loss, metrics = trainer.compute_loss(rollout, index, i)
    expected = (-1.28 + 0.8 - 2.2) / 3
    assert metrics["policy_loss"] == pytest.approx(expected, rel=1e-4)
    assert float(loss.detach()) == pytest.approx(3 * expected, rel=1e-4)
    assert metrics["clip_ratio/high_mean"] == pytest.approx(1 / 3)
    assert metrics["clip_ratio/low_mean"] == pytest.approx(1 / 3)
    # the log-ratio is clamped to +-5 before exp
    rollout.log_probs[index, i] = new - 20.0
    rollout.advantages[index] = torch.tensor([-1.0, -1.0, -1.0])
    _, metrics = trainer.compute_loss(rollout, index, i)
    assert metrics["policy_loss"] == pytest.approx(math.exp(5.0), rel=1e-4)

    # KL: a frozen copy as the reference; after moving the policy, kl = mean((new - ref)^2)
    trainer = GraphGRPOTrainer(make_pipe(), edge_count_reward, make_args(tmp_path, beta=0.5))
    rollout = trainer.score_rollout(trainer.generate(0))
    with torch.no_grad():
        reference = trainer.step_log_prob(trainer.reference, rollout, index, i)
        for p in trainer.unwrapped_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
        new = trainer.step_log_prob(trainer.model, rollout, index, i)
    rollout.log_probs[index, i] = new  # ratio 1
    rollout.advantages[index] = 0.0
    loss, metrics = trainer.compute_loss(rollout, index, i)
    kl = ((new - reference) ** 2).mean().item()
    assert kl > 0
    assert metrics["kl"] == pytest.approx(kl, rel=1e-4)
    assert float(loss.detach()) == pytest.approx(0.5 * 3 * kl, rel=1e-4)


# ------------------------------------------------------------------------------------------------------------------
# Rollouts and training
# ------------------------------------------------------------------------------------------------------------------


def test_rollout_is_on_policy_and_groups_share_their_start(tmp_path):
    trainer = GraphGRPOTrainer(make_pipe(), edge_count_reward, make_args(tmp_path))
    rollout = trainer.generate(0)
    B, T = rollout.log_probs.shape
    assert (B, T) == (8, 4) and rollout.node_states.shape[:2] == (8, 5)
    assert rollout.node_mask.sum(1).tolist() == [5] * 4 + [6] * 4
    starts = rollout.edge_states[:, 0]
    assert all(torch.equal(starts[0], starts[g]) for g in range(4))
    assert all(torch.equal(starts[4], starts[g]) for g in range(4, 8))
    assert len(rollout.graphs) == 8 and rollout.train_mask.all()
    # the stored log-probs are the policy's: recomputing them gives ratio 1
    with torch.no_grad():
        for i in range(T):
            recomputed = trainer.step_log_prob(trainer.model, rollout, torch.arange(B), i)
            assert torch.allclose(recomputed, rollout.log_probs[:, i], atol=1e-5)
    independent = GraphGRPOTrainer(make_pipe(), edge_count_reward, make_args(tmp_path, shared_start=False))
    starts = independent.generate(0).edge_states[:, 0]
    assert not all(torch.equal(starts[0], starts[g]) for g in range(1, 4))


@pytest.mark.support_cell("graph_grpo", "pack")
def test_two_steps_change_weights_and_log_metrics(tmp_path):
    pipe = make_pipe()
    before = {k: v.clone() for k, v in pipe.model.state_dict().items()}
    trainer = GraphGRPOTrainer(pipe, [edge_count_reward, tree_validity_reward], make_args(tmp_path))
    history = trainer.train()
    assert len(history) == 2 and trainer.global_step == 2
    for key in ("reward", "loss", "kl", "grad_norm", "rewards/edge_count_reward/mean", "frac_reward_zero_std"):
        assert math.isfinite(history[-1][key]), key
    after = trainer.unwrapped_model.state_dict()
    assert max((before[k] - after[k]).abs().max().item() for k in before) > 1e-5


def test_steps_per_generation_has_trls_meaning_as_in_the_image_trainer(tmp_path):
    # gradient_accumulation_steps=1 and steps_per_generation=2: each step generates two micro-batches of 4 graphs per
    # process and makes one optimizer step on each, as DiffusionGRPOTrainer does
    trainer = GraphGRPOTrainer(
        make_pipe(),
        edge_count_reward,
        make_args(tmp_path, gradient_accumulation_steps=1, steps_per_generation=2, max_steps=1),
    )
    assert (trainer.generation_batch_size, trainer.steps_per_generation, trainer.graphs_per_process) == (8, 2, 8)
    assert len(trainer.group_rows(0)) == 2  # two groups of num_generations=4
    trainer.train()
    assert {int(state["step"]) for state in trainer.optimizer.optimizer.state.values()} == {2}
    with pytest.raises(ValueError, match="cannot both be set"):
        make_args(tmp_path, generation_batch_size=8, steps_per_generation=2)
    with pytest.raises(ValueError, match="must be a multiple of `gradient_accumulation_steps`"):
        make_args(tmp_path, steps_per_generation=3)


def test_both_grpo_configs_share_the_grpo_fields_and_resolve_one_generation_batch():
    from dataclasses import fields

    from diffusers_ext import BaseGRPOConfig, DiffusionGRPOConfig
    from diffusers_ext.trainers.base_config import GenerationBatch

    shared = {f.name for f in fields(BaseGRPOConfig)}
    assert {"num_generations", "beta", "epsilon", "scale_rewards", "steps_per_generation"} <= shared
    for config_class in (DiffusionGRPOConfig, GraphGRPOConfig):
        assert issubclass(config_class, BaseGRPOConfig)
        assert all(f.metadata.get("help") for f in fields(config_class)), config_class
    settings = {"per_device_train_batch_size": 4, "num_generations": 4, "gradient_accumulation_steps": 2}
    image = DiffusionGRPOConfig(**settings).resolve_generation_batch(2)
    graph = GraphGRPOConfig(**settings).resolve_generation_batch(2)
    assert type(image) is type(graph) is GenerationBatch and image == graph == (16, 2, 8)
    image = DiffusionGRPOConfig(**settings, steps_per_generation=4).resolve_generation_batch(2)
    assert GraphGRPOConfig(**settings, steps_per_generation=4).resolve_generation_batch(2) == image == (32, 4, 16)
    with pytest.raises(ValueError, match="divisible by the global batch size"):
        GraphGRPOConfig(
            **{**settings, "gradient_accumulation_steps": 1}, generation_batch_size=12
        ).resolve_generation_batch(2)


def test_constant_reward_trains_nothing(tmp_path):
    pipe = make_pipe()
    before = {k: v.clone() for k, v in pipe.model.state_dict().items()}
    args = make_args(tmp_path, beta=0.0, weight_decay=0.0, max_steps=1)
    trainer = GraphGRPOTrainer(pipe, lambda graphs, **kw: [1.0] * len(graphs), args)
    rollout = trainer.score_rollout(trainer.generate(0))
    assert torch.equal(rollout.advantages, torch.zeros(8))
    history = trainer.train()
    assert history[0]["frac_reward_zero_std"] == 1.0 and history[0]["policy_loss"] == 0.0
    after = trainer.unwrapped_model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_refinement_groups_and_dynamic_prior(tmp_path):
    args = make_args(tmp_path, refine_top_k=1, refine_noise_fraction=0.5, dynamic_prior_alpha=0.5, max_steps=1)
    trainer = GraphGRPOTrainer(make_pipe(), edge_count_reward, args)
    rollout = trainer.score_rollout(trainer.generate(0))
    refined = trainer.refine(rollout, 0)
    assert len(refined) == 4
    # the best graph is re-noised to the first grid time >= 0.5 and regenerated from there
    grid = trainer.scheduler.time_grid
    start = int((grid[:-1] < 0.5).sum())
    assert refined.train_mask[:, :start].sum() == 0 and refined.train_mask[:, start:].all()
    assert all(torch.equal(refined.edge_states[0, start], refined.edge_states[g, start]) for g in range(4))
    assert float(refined.parent_rewards[0]) == float(rollout.rewards.max())
    p1 = float(trainer.scheduler.edge_marginals[1])
    history = trainer.train()
    assert "refine/reward" in history[0] and "refine/parent_reward" in history[0]
    assert float(trainer.scheduler.edge_marginals[1]) != p1
    assert trainer.scheduler.config.edge_marginals == pytest.approx(trainer.scheduler.edge_marginals.tolist())


def test_checkpoint_resume_is_exact(tmp_path):
    options = {
        "save_strategy": "steps",
        "save_steps": 1,
        "max_steps": 3,
        "dynamic_prior_alpha": 0.2,
        "refine_top_k": 1,
    }
    straight = GraphGRPOTrainer(make_pipe(), edge_count_reward, make_args(tmp_path / "a", **options))
    straight.train()
    first = GraphGRPOTrainer(make_pipe(), edge_count_reward, make_args(tmp_path / "b", **options))
    first.train(max_steps=2)
    resumed = GraphGRPOTrainer(
        make_pipe(), edge_count_reward, make_args(tmp_path / "b", resume_from_checkpoint="latest", **options)
    )
    assert resumed.scheduler.edge_marginals[1] != first.scheduler.edge_marginals[1]  # a fresh scheduler
    resumed.train()
    assert resumed.global_step == 3
    assert torch.allclose(resumed.scheduler.edge_marginals, straight.scheduler.edge_marginals)
    assert resumed.history[-1]["reward"] == straight.history[-1]["reward"]
    a, b = straight.unwrapped_model.state_dict(), resumed.unwrapped_model.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_save_model_loads_as_a_pipeline(tmp_path):
    trainer = GraphGRPOTrainer(make_pipe(), edge_count_reward, make_args(tmp_path, max_steps=1))
    trainer.train()
    folder = trainer.save_model(str(tmp_path / "saved"))
    loaded = GraphFlowPipeline.from_pretrained(folder)
    a, b = trainer.unwrapped_model.state_dict(), loaded.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "saved" / "README.md").is_file()


def test_lora_reference_is_the_disabled_adapter(tmp_path):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=2, lora_alpha=2, init_lora_weights="gaussian")
    trainer = GraphGRPOTrainer(make_pipe(), edge_count_reward, make_args(tmp_path, max_steps=1), peft_config=config)
    assert trainer.reference is None
    assert all("lora" in n for n, p in trainer.unwrapped_model.named_parameters() if p.requires_grad)
    history = trainer.train()
    assert math.isfinite(history[0]["kl"])
    trainer.save_model(str(tmp_path / "lora"))
    assert (tmp_path / "lora" / "pytorch_lora_weights.safetensors").is_file()


# ------------------------------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"num_generations": 1}, "num_generations"),
        ({"epsilon_high": 0.0}, "epsilon_high"),
        ({"scale_rewards": "prompt"}, "scale_rewards"),
        ({"refine_noise_fraction": 1.0}, "refine_noise_fraction"),
        ({"per_device_train_batch_size": 3, "gradient_accumulation_steps": 1}, "multiple of `num_generations`"),
        ({"generation_batch_size": 6}, "multiple of `num_generations`"),
        ({"num_nodes": [0]}, "num_nodes"),
        ({"dynamic_prior_alpha": 2.0}, "dynamic_prior_alpha"),
        ({"train_max_steps": 0}, "train_max_steps"),
        ({"kl_type": "k3"}, "kl_type"),
    ],
)
def test_config_errors(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        make_args(tmp_path, **overrides)


def test_trainer_errors(tmp_path):
    args = make_args(tmp_path)
    with pytest.raises(ValueError, match="rate='analytic'"):
        GraphGRPOTrainer(make_pipe(rate="defog"), edge_count_reward, args)
    with pytest.raises(TypeError, match="GraphFlowPipeline"):
        GraphGRPOTrainer(object(), edge_count_reward, args)
    with pytest.raises(TypeError, match="reward_funcs"):
        GraphGRPOTrainer(make_pipe(), "tree", args)
    with pytest.raises(ValueError, match="reward_weights"):
        GraphGRPOTrainer(make_pipe(), edge_count_reward, make_args(tmp_path, reward_weights=[1.0, 2.0]))
    with pytest.raises(ValueError, match="no node counts"):
        GraphGRPOTrainer(make_pipe(), edge_count_reward, make_args(tmp_path, num_nodes=None))
    with pytest.raises(ValueError, match="train_max_steps"):
        GraphGRPOTrainer(make_pipe(), edge_count_reward, make_args(tmp_path, train_max_steps=9))
    with pytest.raises(ValueError, match="num_nodes"):
        GraphGRPOTrainer(make_pipe(), edge_count_reward, args, train_dataset=[{"num_nodes": "six"}])
    with pytest.raises(TypeError, match="GraphGRPOConfig"):
        GraphGRPOTrainer(make_pipe(), edge_count_reward, object())
    short = GraphGRPOTrainer(make_pipe(), lambda graphs, **kw: [1.0], args)
    with pytest.raises(ValueError, match="returned 1 rewards for 8 graphs"):
        short.train()
    nan = GraphGRPOTrainer(make_pipe(), lambda graphs, **kw: [math.nan] * len(graphs), args)
    with pytest.raises(ValueError, match="non-finite"):
        nan.train()


def test_dataset_rows_and_columns_reach_the_reward(tmp_path):
    seen = {}

    def reward(graphs, label, num_nodes, trainer_state):
        seen["label"], seen["num_nodes"], seen["step"] = label, num_nodes, trainer_state["global_step"]
        return [float(g.number_of_nodes() == n) for g, n in zip(graphs, num_nodes)]

    rows = [{"num_nodes": 5, "label": "a"}, {"num_nodes": 7, "label": "b"}]
    trainer = GraphGRPOTrainer(make_pipe(), reward, make_args(tmp_path, num_nodes=None, max_steps=1), rows)
    history = trainer.train()
    assert history[0]["reward"] == 1.0
    assert len(seen["label"]) == 8 and set(seen["num_nodes"]) <= {5, 7} and seen["step"] == 0
