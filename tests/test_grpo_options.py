"""The Flow-GRPO options of DiffusionGRPOConfig, one test each: clipping with several iterations, dropping
zero-advantage samples, the EMA of the policy, guidance during rollouts, shared initial noise within a group."""

import pytest
import torch
from peft.utils import get_peft_model_state_dict
from safetensors.torch import load_file
from test_grpo_trainer import tiny_trainer

from diffusers_ext import DiffusionGRPOConfig
from diffusers_ext.rewards import BrightnessReward


def test_ratio_clips_only_with_several_optimizer_steps_per_rollout(tmp_path):
    # One optimizer step per rollout: every ratio is exp(0) = 1 when it is computed, so nothing can clip.
    single = tiny_trainer(tmp_path / "one", max_steps=3, num_iterations=1, epsilon=1e-3)
    assert all(log["clip_ratio/region_mean"] == 0 for log in single.train())
    # Later iterations rescore the same rollout under an updated policy: the ratio leaves [1 - eps, 1 + eps].
    several = tiny_trainer(tmp_path / "three", max_steps=3, num_iterations=3, epsilon=1e-3)
    assert max(log["clip_ratio/region_mean"] for log in several.train()) > 0


@pytest.mark.support_cell("grpo", "sd3", dtype="bfloat16")
def test_in_bf16_the_ratio_is_one_at_one_iteration(tmp_path):
    # the trajectory stores the bf16-rounded sample and the loss rescores it; the old log-prob scored the float32
    # sample, so 58% of the tiny SD3's transitions clipped at epsilon 1e-4
    trainer = tiny_trainer(tmp_path, max_steps=2, num_iterations=1, epsilon=1e-4)
    trainer.pipeline.to(torch.bfloat16)
    rollout = trainer.generate(trainer.prompt_indices(0), 0)
    assert rollout.latents.dtype == torch.bfloat16
    index = torch.arange(rollout.latents.shape[0])
    for i in trainer.timesteps_to_train(0):
        with torch.no_grad():
            log_prob, _, _ = trainer.step_log_prob(trainer.transformer, rollout, index, i)
        assert (log_prob - rollout.log_probs[:, i]).abs().max() < 1e-5
    assert all(log["clip_ratio/region_mean"] == 0 for log in trainer.train())


def half_constant_reward(prompts, images, **kwargs):
    """Constant for "a cat" (a group without spread), brightness otherwise."""
    brightness = BrightnessReward(1.0)(prompts, images)
    return [1.0 if prompt == "a cat" else value for prompt, value in zip(prompts, brightness)]


def test_drop_zero_advantage_leaves_flat_groups_out_of_the_loss(tmp_path):
    sizes = {}
    for drop in (False, True):
        trainer = tiny_trainer(
            tmp_path / str(drop), [half_constant_reward], ["a cat", "a dog"], max_steps=1, drop_zero_advantage=drop
        )
        seen = []
        original = trainer.compute_loss

        def recording(rollout, index, i, original=original, seen=seen):
            seen.append(sorted({rollout.prompts[j] for j in index.tolist()}))
            return original(rollout, index, i)

        trainer.compute_loss = recording
        log = trainer.train()[0]
        sizes[drop] = seen
        assert log["frac_reward_zero_std"] == 0.5
        assert log["frac_samples_trained"] == (0.5 if drop else 1.0)
    assert all(prompts == ["a cat", "a dog"] for prompts in sizes[False])
    assert sizes[True] and all(prompts == ["a dog"] for prompts in sizes[True])


def test_ema_of_the_policy_is_updated_swapped_in_and_saved(tmp_path):
    trainer = tiny_trainer(tmp_path, max_steps=2, use_ema=True, ema_decay=0.5, ema_update_steps=1)
    snapshots = []
    for step in (1, 2):
        trainer.train(step)
        snapshots.append([p.detach().clone() for p in trainer.trainable_parameters])
    # The first update copies the weights; the second averages with decay 0.5.
    expected = [0.5 * a + 0.5 * b for a, b in zip(*snapshots)]
    for shadow, wanted in zip(trainer.ema.shadow_params, expected):
        torch.testing.assert_close(shadow, wanted)
    assert any((a != b).any() for a, b in zip(*snapshots)), "the policy must move for this test to mean anything"
    with trainer.ema_weights() as transformer:
        swapped = {k: v.clone() for k, v in get_peft_model_state_dict(transformer).items()}
    for parameter, current in zip(trainer.trainable_parameters, snapshots[1]):
        torch.testing.assert_close(parameter, current)  # restored after the context
    current = {k: v.clone() for k, v in get_peft_model_state_dict(trainer.unwrapped_transformer).items()}
    trainer.save_model(str(tmp_path / "saved"))
    saved = load_file(str(tmp_path / "saved" / "pytorch_lora_weights.safetensors"))
    saved = {k.removeprefix("transformer."): v for k, v in saved.items()}
    assert saved.keys() == swapped.keys()
    for key, value in saved.items():
        torch.testing.assert_close(value.float(), swapped[key].float())
    assert any(not torch.allclose(saved[k].float(), current[k].float()) for k in saved), (
        "saved the EMA, not the policy"
    )


def test_guidance_during_rollouts_stores_the_negative_branch_and_rescores_consistently(tmp_path):
    trainer = tiny_trainer(tmp_path, guidance_scale=3.0)
    rollout = trainer.generate(trainer.prompt_indices(0), 0)
    assert rollout.uncond is not None and rollout.uncond["prompt_embeds"].shape == rollout.cond["prompt_embeds"].shape
    index = torch.arange(8)
    with torch.no_grad():
        log_prob, _, _ = trainer.step_log_prob(trainer.transformer, rollout, index, 0)
        torch.testing.assert_close(log_prob, rollout.log_probs[:, 0], atol=1e-4, rtol=0)
        guided = trainer.adapter.velocity(
            trainer.transformer, rollout.latents[:, 0], rollout.timesteps[0], rollout.cond, rollout.uncond, 3.0
        )
        plain = trainer.adapter.velocity(
            trainer.transformer, rollout.latents[:, 0], rollout.timesteps[0], rollout.cond, None, 1.0
        )
    assert (guided - plain).abs().max() > 1e-3
    assert tiny_trainer(tmp_path / "off").generate([0, 1], 0).uncond is None  # guidance_scale 1.0: no CFG


def test_init_same_noise_shares_the_initial_noise_within_a_group(tmp_path):
    shared = tiny_trainer(tmp_path / "same", init_same_noise=True).generate([0, 1], 0).latents[:, 0]
    groups = shared.view(2, 4, *shared.shape[1:])
    assert torch.equal(groups[:, 0:1].expand_as(groups), groups)
    assert (groups[0, 0] - groups[1, 0]).abs().max() > 0
    independent = tiny_trainer(tmp_path / "own").generate([0, 1], 0).latents[:, 0]
    assert (independent[0] - independent[1]).abs().max() > 0


def test_option_defaults_and_errors():
    config = DiffusionGRPOConfig()
    assert (config.scale_rewards, config.drop_zero_advantage, config.use_ema, config.init_same_noise) == (
        "group",
        False,
        False,
        False,
    )
    assert config.beta == 0.0 and config.guidance_scale == 4.5
    for name in ("drop_zero_advantage", "use_ema", "ema_decay", "ema_update_steps", "init_same_noise", "beta"):
        assert DiffusionGRPOConfig.__dataclass_fields__[name].metadata["help"]
    with pytest.raises(ValueError, match="ema_decay"):
        DiffusionGRPOConfig(ema_decay=1.0)
    with pytest.raises(ValueError, match="ema_update_steps"):
        DiffusionGRPOConfig(ema_update_steps=0)


def test_generation_batch_and_accumulation_keep_trls_meanings(tmp_path):
    # Old meaning kept at the default: gradient_accumulation_steps=2 alone is two micro-batches per rollout and one
    # optimizer step (steps_per_generation defaults to gradient_accumulation_steps, as in TRL).
    default = tiny_trainer(tmp_path / "a", per_device_train_batch_size=4, gradient_accumulation_steps=2)
    assert (default.generation_batch_size, default.steps_per_generation, default.images_per_process) == (8, 2, 8)
    given = tiny_trainer(tmp_path / "b", per_device_train_batch_size=4, generation_batch_size=8)
    assert (given.steps_per_generation, given.args.steps_per_generation, given.args.generation_batch_size) == (
        2,
        None,
        8,
    )
    # Two micro-batches per rollout, each its own optimizer step.
    two = tiny_trainer(
        tmp_path / "c", per_device_train_batch_size=4, steps_per_generation=2, max_steps=1, num_inference_steps=3
    )
    two.train()
    steps = {int(state["step"]) for state in two.optimizer.optimizer.state.values()}
    assert steps == {2} and two.global_step == 1
    with pytest.raises(ValueError, match="cannot both be set"):
        DiffusionGRPOConfig(num_generations=4, generation_batch_size=8, steps_per_generation=2)
    with pytest.raises(ValueError, match="must be a multiple of `gradient_accumulation_steps`"):
        DiffusionGRPOConfig(
            num_generations=4, per_device_train_batch_size=4, steps_per_generation=3, gradient_accumulation_steps=2
        )
    with pytest.raises(ValueError, match="divisible by the global batch size"):
        tiny_trainer(tmp_path / "d", per_device_train_batch_size=8, generation_batch_size=12, num_generations=4)


def test_a_process_whose_images_were_all_dropped_still_joins_the_backward_under_ddp(tmp_path, monkeypatch):
    """DDP all-reduces in backward: with every image dropped, a process still runs a zero-weighted loss."""

    def constant(prompts, images, **kwargs):
        return [1.0] * len(prompts)  # no group has spread: every image is dropped

    trainer = tiny_trainer(tmp_path, [constant], ["a cat", "a dog"], max_steps=1, drop_zero_advantage=True)
    backwards = []
    original = trainer.accelerator.backward
    trainer.accelerator.backward = lambda loss, **kw: (backwards.append(float(loss.detach())), original(loss, **kw))[1]
    monkeypatch.setattr(type(trainer.accelerator), "num_processes", property(lambda self: 2))
    rollout = trainer.score_rollout(trainer.generate(trainer.prompt_indices(0), 0))
    trainer.optimize(rollout, 0)
    # one zero-weighted backward per trained timestep (DDP averages its zero gradients with the other processes')
    assert len(backwards) == len(trainer.timesteps_to_train(0)) and all(value == 0.0 for value in backwards)
    monkeypatch.undo()
    backwards.clear()
    trainer.optimize(rollout, 0)  # one process: nothing to run
    assert backwards == []


def test_vae_decode_batch_size_decodes_in_chunks_to_the_same_images(tmp_path):
    whole = tiny_trainer(tmp_path / "whole")
    chunked = tiny_trainer(tmp_path / "chunked", vae_decode_batch_size=3)
    calls = []
    decode = chunked.adapter.decode
    chunked.adapter.decode = lambda latents, *size: calls.append(len(latents)) or decode(latents, *size)
    a = whole.generate(whole.prompt_indices(0), 0).images
    b = chunked.generate(chunked.prompt_indices(0), 0).images
    assert calls == [3, 3, 2]
    torch.testing.assert_close(b, a, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="vae_decode_batch_size"):
        DiffusionGRPOConfig(output_dir=str(tmp_path), vae_decode_batch_size=0)


def test_gradient_checkpointing_switches_on_the_models_own_and_keeps_the_update(tmp_path):
    plain = tiny_trainer(tmp_path / "plain", max_steps=1)
    checkpointed = tiny_trainer(tmp_path / "checkpointed", max_steps=1, gradient_checkpointing=True)
    assert checkpointed.unwrapped_transformer.is_gradient_checkpointing
    assert not plain.unwrapped_transformer.is_gradient_checkpointing
    plain.train()
    checkpointed.train()
    for p, q in zip(plain.trainable_parameters, checkpointed.trainable_parameters):
        torch.testing.assert_close(q, p, atol=1e-6, rtol=0)


def test_gradient_checkpointing_on_a_model_without_it_is_a_clear_error():
    from diffusers_ext.trainers.base_trainer import enable_gradient_checkpointing

    with pytest.raises(ValueError, match="gradient_checkpointing.*Linear"):
        enable_gradient_checkpointing(torch.nn.Linear(2, 2))
