"""SISS as a concept-unlearning baseline on a text-conditional UNet (prompt erasure with the shared retain term)."""

import pytest
import torch
from diffusers import DDPMScheduler, StableDiffusionPipeline

from diffusers_ext import ConstrainedUnlearningConfig, ConstrainedUnlearningTrainer
from diffusers_ext.testing import get_tiny_sd_components


TINY = {
    "per_device_train_batch_size": 4,
    "pool_size": 6,
    "pool_sampling_steps": 2,
    "pool_refresh_steps": 2,
    "save_strategy": "no",
    "disable_tqdm": True,
    "seed": 3,
}


def _siss(**overrides):
    components = get_tiny_sd_components(seed=0)
    config = ConstrainedUnlearningConfig(
        **{
            **TINY,
            "baseline": "siss",
            "forget_prompts": ["a photo of a cat"],
            "retain_prompts": ["a photo of a dog"],
            **overrides,
        }
    )
    scheduler = DDPMScheduler(
        beta_schedule="squaredcos_cap_v2", clip_sample=False, steps_offset=1
    )  # as SD configures it
    return ConstrainedUnlearningTrainer(StableDiffusionPipeline(**{**components, "scheduler": scheduler}), config)


def test_concept_siss_draws_the_mixture_under_the_forget_prompt_and_adds_the_retain_part():
    trainer = _siss(siss_mixture_weight=0.3)
    objective = trainer.objective
    assert objective.ref_pool.shape == objective.u_pool.shape == (6, *trainer.sample_shape)
    parts = trainer.sample_batch()
    assert [p.name for p in parts] == ["siss", "retain"]
    siss = parts[0]
    torch.testing.assert_close(siss.cond, trainer._repeat(trainer.forget_conds, 4))
    pool = torch.cat([objective.ref_pool, objective.u_pool])
    assert all(any(torch.equal(x, p) for p in pool) for x in siss.x)  # data: reference and forget samples
    assert all(any(torch.equal(a, p) for p in objective.u_pool) for a in siss.a)  # forget points: p_u only
    trainer.compute_targets(parts)
    torch.testing.assert_close(0.7 * siss.weight_x + 0.3 * siss.weight_a, torch.ones(4))


@pytest.mark.parametrize("neggrad_weight, retain_weight", [(1.0, 2.0), (0.5, 0.0)])
def test_concept_siss_loss_is_keep_minus_weighted_forget_plus_retain(neggrad_weight, retain_weight):
    trainer = _siss(neggrad_weight=neggrad_weight, retain_weight=retain_weight)
    parts = trainer.sample_batch()
    trainer.compute_targets(parts)
    loss, metrics = trainer.compute_loss(parts)
    siss = parts[0]
    with torch.no_grad():
        eps = trainer.predict(trainer.unet, siss.x_t, siss.t, siss.cond)
    sq_x = ((eps - siss.target_x) ** 2).flatten(1).mean(1)
    sq_a = ((eps - siss.target_a) ** 2).flatten(1).mean(1)
    # n = 12 pooled samples of which k = 6 are forget points: n/(n-k) = 2, k/(n-k) = 1
    expected = 2 * (siss.weight_x * sq_x).mean() - neggrad_weight * (siss.weight_a * sq_a).mean()
    expected = expected + retain_weight * metrics["retain_loss"]
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-4, atol=1e-6)
    assert ("retain" in [p.name for p in parts]) == (retain_weight > 0)


def test_concept_siss_trains_and_changes_the_forget_prediction():
    trainer = _siss(learning_rate=1e-2)
    x, t = torch.randn(2, *trainer.sample_shape, generator=torch.Generator().manual_seed(0)), torch.tensor([300, 700])
    cond = trainer._repeat(trainer.forget_conds, 2)
    with torch.no_grad():
        before = trainer.predict(trainer.ref_unet, x, t, cond)
    history = trainer.train(max_steps=2)
    assert len(history) == 2 and all(torch.isfinite(torch.tensor(h["loss"])) for h in history)
    with torch.no_grad():
        after = trainer.predict(trainer.accelerator.unwrap_model(trainer.unet).eval(), x, t, cond)
    assert not torch.allclose(after, before, atol=1e-6)
