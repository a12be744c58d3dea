"""The same trainers on a tiny FluxPipeline (packed latents, distilled guidance, no CFG branch)."""

import re

import pytest
import torch
from diffusers import FluxPipeline
from test_grpo_trainer import tiny_lora

from diffusers_ext import DiffusionGRPOConfig, DiffusionGRPOTrainer, E2POConfig, E2POTrainer
from diffusers_ext.rewards import BrightnessReward
from diffusers_ext.testing import get_tiny_flux_components


def tiny_flux(seed=0):
    return FluxPipeline(**get_tiny_flux_components(seed))


SETTINGS = {
    "max_steps": 3,
    "num_generations": 4,
    "per_device_train_batch_size": 8,
    "num_inference_steps": 3,
    "guidance_scale": 3.5,
    "height": 8,
    "width": 8,
    "max_sequence_length": 8,
    "learning_rate": 1e-2,
    "epsilon": 0.2,
    "save_steps": 1000,
    "beta": 0.1,
}


def test_grpo_on_flux_trains_rescores_and_saves_a_loadable_lora(tmp_path):
    trainer = DiffusionGRPOTrainer(
        tiny_flux(),
        [BrightnessReward(1.0)],
        DiffusionGRPOConfig(output_dir=str(tmp_path), **SETTINGS),
        ["a", "b"],
        peft_config=tiny_lora(),
    )
    rollout = trainer.generate(trainer.prompt_indices(0), 0)
    assert rollout.images.shape == (8, 3, 8, 8) and rollout.uncond is None
    with torch.no_grad():
        log_prob, _, _ = trainer.step_log_prob(trainer.transformer, rollout, torch.arange(8), 1)
    torch.testing.assert_close(log_prob, rollout.log_probs[:, 1], atol=1e-4, rtol=0)

    history = trainer.train()
    assert all(torch.isfinite(torch.tensor([log["loss"], log["kl"], log["reward"]])).all() for log in history)
    assert history[-1]["kl"] > 0
    trainer.save_model()
    pipe = tiny_flux()
    pipe.load_lora_weights(str(tmp_path))

    # Adapter names differ ("default" when trained, "default_0" when loaded); compare the weights by module.
    def lora_weights(model):
        return {re.sub(r"\.default\w*\.", ".", n): p for n, p in model.named_parameters() if "lora_" in n}

    loaded, trained = lora_weights(pipe.transformer), lora_weights(trainer.unwrapped_transformer)
    assert loaded.keys() == trained.keys() and loaded
    for name, value in trained.items():
        torch.testing.assert_close(loaded[name], value.detach(), msg=name)


def test_e2po_on_flux_perturbs_t5_and_pooled_embeddings(tmp_path):
    config = E2POConfig(output_dir=str(tmp_path), e2po_num_anchors=2, e2po_num_directions=1, **SETTINGS)
    trainer = E2POTrainer(tiny_flux(), [BrightnessReward(1.0)], config, ["a", "b"], peft_config=tiny_lora())
    rollout = trainer.generate(trainer.prompt_indices(0), 0)
    for key in ("prompt_embeds", "pooled_prompt_embeds"):
        group = rollout.cond[key][:4]
        torch.testing.assert_close(group[0], group[1])
        assert (group[2] - group[0]).abs().max() > 0
        torch.testing.assert_close((group[2] + group[3]) / 2, group[0], atol=1e-5, rtol=0)
    assert trainer.train()[-1]["e2po/scale"] > 0


def test_flux_rows_take_prompt_2_and_refuse_prompt_3(tmp_path):
    """Flux: a row's `prompt_2` reaches T5 (as `FluxPipeline(prompt_2=...)`); `prompt_3` is refused."""
    config = DiffusionGRPOConfig(output_dir=str(tmp_path), **SETTINGS)
    with pytest.raises(ValueError, match=r"'prompt_3' column.*\['prompt', 'prompt_2'\]"):
        DiffusionGRPOTrainer(tiny_flux(), [BrightnessReward(1.0)], config, [{"prompt": "a", "prompt_3": "b"}])
    trainer = DiffusionGRPOTrainer(tiny_flux(), [BrightnessReward(1.0)], config, [{"prompt": "a", "prompt_2": "b"}])
    cond, _ = trainer.adapter.encode(["a"], "", 1.0, 8, {"prompt_2": ["b"]})
    expected, pooled, _ = trainer.pipeline.encode_prompt(["a"], ["b"], max_sequence_length=8)
    torch.testing.assert_close(cond["prompt_embeds"], expected)
    torch.testing.assert_close(cond["pooled_prompt_embeds"], pooled)


def test_grpo_on_a_bf16_flux_does_not_clip_at_one_iteration(tmp_path):
    # the old log-prob scored the float32 sample, the loss the stored bf16 one (7% clipped at epsilon 1e-4 on a
    # reduced-width Flux, issue 38)
    pipe = tiny_flux().to(torch.bfloat16)
    settings = {**SETTINGS, "max_steps": 2, "epsilon": 1e-4, "num_iterations": 1, "beta": 0.0}
    trainer = DiffusionGRPOTrainer(
        pipe,
        [BrightnessReward(1.0)],
        DiffusionGRPOConfig(output_dir=str(tmp_path), **settings),
        ["a", "b"],
        peft_config=tiny_lora(),
    )
    assert all(log["clip_ratio/region_mean"] == 0 for log in trainer.train())
