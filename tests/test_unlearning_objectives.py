"""Unlearning objectives: pinned losses of every method, the objective registry, the "auto" level and step size."""

import pytest
import torch
from diffusers import DDPMScheduler

from diffusers_ext import ClassConditionalDDPMPipeline, ConstrainedUnlearningConfig, ConstrainedUnlearningTrainer
from diffusers_ext.testing import get_tiny_pixel_unet
from diffusers_ext.trainers.unlearning_objectives import OBJECTIVES, UnlearningObjective


TINY = {
    "per_device_train_batch_size": 4,
    "pool_size": 6,
    "pool_sampling_steps": 2,
    "pool_refresh_steps": 2,
    "seed": 5,
    "save_strategy": "no",
    "disable_tqdm": True,
}


def _scheduler():
    return DDPMScheduler(beta_schedule="squaredcos_cap_v2", clip_sample=False)


def _digits_like(n, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.rand((n, 1, 8, 8), generator=generator) * 2 - 1, torch.arange(n) % 10


# Losses of the first three steps (and the final lambda) measured with the implementation before the trainers were
# rebuilt on DiffusionTrainer (commit f79ba98, one branch per method); the objective classes reproduce them bit for
# bit on the machine they were recorded on. A change here is a change of what a method optimises.
PINNED = {
    "reverse_kl": (
        {
            "constraint": "reverse_kl",
            "constraint_level": 30.0,
            "dual_learning_rate": 0.01,
            "lambda_max": 0.75,
            "retain_weight": 2.0,
        },
        [0.02346193604171276, 0.03811781853437424, 0.13621555268764496],
        0.75,
    ),
    "likelihood": (
        {"constraint": "likelihood", "constraint_level": -5.0, "dual_learning_rate": 0.05, "lambda_max": 3.0},
        [0.02346193604171276, 0.1281716227531433, 0.26990461349487305],
        3.0,
    ),
    "forward_kl": (
        {"constraint": "forward_kl", "constraint_level": 1.0, "dual_learning_rate": 0.1, "lambda_max": 0.5},
        [0.9237877726554871, 1.1711679697036743, 1.1691244840621948],
        0.0,
    ),
    "esd": (
        {"baseline": "esd", "esd_negative_guidance": 2.0, "retain_weight": 0.0},
        [0.21115742623806, 0.1726682186126709, 0.19697611033916473],
        0.0,
    ),
    "forward_kl_data": (
        {"constraint": "forward_kl", "lambda_init": 0.25, "constraint_level": 0.5, "dual_learning_rate": 0.3},
        [1.4068553447723389, 0.9432435631752014, 1.13538658618927],
        0.0,
    ),
    "siss": (
        {"baseline": "siss", "siss_mixture_weight": 0.3},
        [1.0265631675720215, 0.01738983392715454, 1.5030956268310547],
        0.0,
    ),
    "neggrad_plus": (
        {"baseline": "neggrad_plus", "neggrad_weight": 0.5},
        [0.8609151840209961, 0.3976556062698364, 0.6232616901397705],
        0.0,
    ),
    "retain_only_data": (
        {"baseline": "retain_only", "retain_weight": 2.0},
        [2.2306575775146484, 2.2926461696624756, 2.100764036178589],
        0.0,
    ),
}


@pytest.mark.parametrize("name", list(PINNED))
def test_every_objective_reproduces_its_pinned_losses(name):
    overrides, losses, final_lambda = PINNED[name]
    data = {}
    if name.endswith("_data") or name in ("siss", "neggrad_plus"):
        data = {"forget_dataset": _digits_like(6, 0), "retain_dataset": _digits_like(20, 1)}
    else:
        overrides = {**overrides, "forget_classes": [3]}
    config = ConstrainedUnlearningConfig(**TINY, **overrides)
    unet = get_tiny_pixel_unet(seed=1, num_class_embeds=11)
    trainer = ConstrainedUnlearningTrainer(ClassConditionalDDPMPipeline(unet, _scheduler(), 10), config, **data)
    history = trainer.train(max_steps=3)
    torch.testing.assert_close([h["loss"] for h in history], losses, rtol=1e-4, atol=1e-7)
    assert trainer.lambda_ == pytest.approx(final_lambda)


def test_registry_covers_every_constraint_and_baseline():
    from diffusers_ext.trainers.constrained_unlearning_config import BASELINES, CONSTRAINTS

    assert set(OBJECTIVES) == {*CONSTRAINTS, *BASELINES}
    for name, cls in OBJECTIVES.items():
        assert issubclass(cls, UnlearningObjective) and cls.name == name
        assert cls.primal_dual == (name in CONSTRAINTS), name
    assert OBJECTIVES["likelihood"].sense == "<=" and OBJECTIVES["reverse_kl"].sense == ">="


def _concept_trainer(**overrides):
    config = ConstrainedUnlearningConfig(**TINY, forget_classes=[3], **overrides)
    unet = get_tiny_pixel_unet(seed=1, num_class_embeds=11)
    return ConstrainedUnlearningTrainer(ClassConditionalDDPMPipeline(unet, _scheduler(), 10), config), config


def test_auto_level_and_dual_step_are_resolved_on_the_trainer_not_written_into_the_config():
    trainer, config = _concept_trainer(
        constraint="reverse_kl",
        constraint_level="auto",
        constraint_level_factor=1.5,
        dual_learning_rate="auto",
        dual_learning_rate_scale=0.05,
    )
    level = trainer.calibrate_level() * 1.5
    history = trainer.train(max_steps=2)
    assert trainer.constraint_level == level and trainer.dual_learning_rate == 0.05 / level
    assert (config.constraint_level, config.dual_learning_rate) == ("auto", "auto")
    # The same run with the resolved numbers given explicitly is the same run.
    explicit, _ = _concept_trainer(constraint="reverse_kl", constraint_level=level, dual_learning_rate=0.05 / level)
    assert [h["loss"] for h in explicit.train(max_steps=2)] == [h["loss"] for h in history]
    assert explicit.lambda_ == trainer.lambda_
    # Strings from a command line or YAML file are numbers or "auto".
    assert ConstrainedUnlearningConfig(forget_classes=[3], constraint_level="12.5").constraint_level == 12.5
    with pytest.raises(ValueError, match="`constraint_level` must be a number or 'auto', got 'high'"):
        ConstrainedUnlearningConfig(forget_classes=[3], constraint_level="high")
    with pytest.raises(ValueError, match="for data unlearning give the level"):
        ConstrainedUnlearningTrainer(
            ClassConditionalDDPMPipeline(get_tiny_pixel_unet(seed=1, num_class_embeds=11), _scheduler(), 10),
            ConstrainedUnlearningConfig(**TINY, constraint="forward_kl", constraint_level="auto"),
            forget_dataset=_digits_like(6, 0),
            retain_dataset=_digits_like(20, 1),
        )


def test_removed_names_are_gone():
    for name in ("train_batch_size", "adam_weight_decay", "use_lora", "lora_rank"):
        with pytest.raises(TypeError, match=name):
            ConstrainedUnlearningConfig(forget_classes=[3], **{name: 1})
    trainer, _ = _concept_trainer()
    assert not hasattr(trainer, "config") and not hasattr(trainer, "step")
