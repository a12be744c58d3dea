"""ConstrainedUnlearningTrainer on tiny UNets: targets, dual ascent, stopping, baselines, LoRA, trackers, errors."""

import copy
import logging

import pytest
import torch
from diffusers import DDPMScheduler, StableDiffusionPipeline
from peft import LoraConfig

from diffusers_ext import ClassConditionalDDPMPipeline, ConstrainedUnlearningConfig, ConstrainedUnlearningTrainer
from diffusers_ext.testing import get_tiny_pixel_unet, get_tiny_sd_components


TINY = {
    "per_device_train_batch_size": 4,
    "pool_size": 6,
    "pool_sampling_steps": 2,
    "pool_refresh_steps": 2,
    "save_strategy": "no",
    "disable_tqdm": True,
}


def _scheduler(**overrides):
    return DDPMScheduler(beta_schedule="squaredcos_cap_v2", clip_sample=False, **overrides)


def _sd_scheduler():
    """The tiny schedule as Stable Diffusion configures it (`steps_offset=1`: the pipeline warns otherwise)."""
    return _scheduler(steps_offset=1)


def _pipeline(unet=None, scheduler=None):
    """A class-conditional pipeline of the tiny pixel UNet (null class 10) with the tests' DDPM schedule."""
    unet = unet if unet is not None else get_tiny_pixel_unet(seed=1, num_class_embeds=11)
    return ClassConditionalDDPMPipeline(unet, scheduler or _scheduler(), null_class_label=10)


def _lora(rank):
    return LoraConfig(r=rank, lora_alpha=rank, init_lora_weights="gaussian")


def _trainer(unet=None, **overrides):
    names = ("forget_dataset", "retain_dataset", "accelerator", "peft_config")
    kwargs = {k: overrides.pop(k) for k in names if k in overrides}
    config = ConstrainedUnlearningConfig(**{**TINY, "forget_classes": [3], **overrides})
    return ConstrainedUnlearningTrainer(_pipeline(unet), config, **kwargs)


def _digits_like(n, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.rand((n, 1, 8, 8), generator=generator) * 2 - 1, torch.arange(n) % 10


def _data_trainer(**overrides):
    return _trainer(
        forget_classes=None, forget_dataset=_digits_like(6, 0), retain_dataset=_digits_like(20, 1), **overrides
    )


@pytest.mark.parametrize(
    "overrides, eta",
    [
        ({"constraint": "reverse_kl", "lambda_init": 0.6}, 0.6 / 0.4),
        ({"constraint": "likelihood", "lambda_init": 0.6}, 0.6),
        ({"baseline": "esd", "esd_negative_guidance": 2.0}, 2.0),
    ],
)
def test_forget_target_is_reference_guided_away_from_the_forget_class(overrides, eta):
    trainer = _trainer(**overrides)
    parts = trainer.sample_batch()
    trainer.compute_targets(parts)
    forget = next(p for p in parts if p.name == "forget")
    assert forget.cond.tolist() == [3] * 4
    with torch.no_grad():
        eps_ref = trainer.ref_unet(forget.x_t, forget.t, class_labels=torch.full((4,), 10)).sample
        eps_u = trainer.ref_unet(forget.x_t, forget.t, class_labels=torch.full((4,), 3)).sample
    torch.testing.assert_close(forget.target, eps_ref + eta * (eps_ref - eps_u))
    assert trainer.guidance_strength() == pytest.approx(eta)
    retain = next(p for p in parts if p.name == "retain")
    assert 3 not in retain.cond.tolist() and 10 not in retain.cond.tolist()


def test_dual_ascent_moves_lambda_toward_the_constraint_and_stays_in_bounds():
    trainer = _trainer(constraint="reverse_kl", constraint_level=10.0, dual_learning_rate=0.05, lambda_max=0.8)
    trainer.dual_step(0.0)  # KL(q || p_u) = 0 < 10: violated, lambda grows by 0.05 * 10
    assert trainer.lambda_ == pytest.approx(0.5)
    trainer.dual_step(0.0)
    assert trainer.lambda_ == pytest.approx(0.8)  # clipped at lambda_max
    trainer.dual_step(30.0)  # slack 20: lambda shrinks, clipped at 0
    assert trainer.lambda_ == 0.0
    assert trainer.slack(30.0) == pytest.approx(20.0)

    likelihood = _trainer(constraint="likelihood", constraint_level=-1.0, dual_learning_rate=0.1)
    likelihood.dual_step(2.0)  # E_q[log p_u - log p_ref] = 2 > -1: violated, lambda grows
    assert likelihood.lambda_ == pytest.approx(0.3)
    assert likelihood.slack(2.0) == pytest.approx(-3.0)


@pytest.mark.support_cell("unlearning", "pack")
def test_primal_dual_run_logs_every_step_through_the_trackers():
    from accelerate import Accelerator
    from accelerate.tracking import GeneralTracker

    class ListTracker(GeneralTracker):
        name = "list"
        requires_logging_directory = False

        def __init__(self):
            super().__init__()
            self.logged = []

        @property
        def tracker(self):
            return self.logged

        def store_init_configuration(self, values):
            pass

        def log(self, values, step=None, **kwargs):
            self.logged.append((step, dict(values)))

    tracker = ListTracker()
    accelerator = Accelerator(log_with=[tracker])
    accelerator.init_trackers("unlearning-test")
    trainer = _trainer(constraint="reverse_kl", constraint_level=1e3, dual_learning_rate=1e-3, accelerator=accelerator)
    trainer.train(max_steps=3)
    assert [step for step, _ in tracker.logged] == [1, 2, 3]
    for _, values in tracker.logged:
        assert {"lambda", "constraint_estimate", "slack", "forget_loss", "retain_loss", "loss"} <= values.keys()
    lambdas = [values["lambda"] for _, values in tracker.logged]
    assert lambdas[0] > 0 and lambdas == sorted(lambdas), "lambda must grow while the level is far from met"
    assert tracker.logged[-1][1]["constraint_estimate"] > 0, "q moved away from p_u, so KL(q || p_u) > 0"
    accelerator.end_training()


def test_unreachable_level_stops_cleanly_reporting_the_best_value(caplog):
    trainer = _trainer(
        constraint="reverse_kl",
        constraint_level=1e9,
        lambda_max=0.2,
        dual_learning_rate=1.0,
        stop_patience=3,
        max_steps=50,
    )
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert trainer.global_step == 3, "lambda hits its bound at step 1; three steps of patience later it stops"
    assert "not reachable" in trainer.stop_reason and "best smoothed constraint value" in trainer.stop_reason
    assert f"{trainer.best_constraint:.4g}" in trainer.stop_reason
    assert "not reachable" in caplog.text


def test_forward_kl_data_loss_is_the_subtracted_mixture():
    trainer = _data_trainer(constraint="forward_kl", lambda_init=0.25)
    parts = trainer.sample_batch()
    trainer.compute_targets(parts)
    loss, metrics = trainer.compute_loss(parts)
    by_name = {p.name: p for p in parts}
    with torch.no_grad():
        unet = trainer.accelerator.unwrap_model(trainer.unet)
        losses = {
            name: torch.nn.functional.mse_loss(unet(p.x_t, p.t, class_labels=p.cond).sample, p.noise)
            for name, p in by_name.items()
        }
    k, n = 6, 26
    expected = ((k / n - 0.25) * losses["forget"] + (n - k) / n * losses["retain"]) / 0.75
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(metrics["constraint_estimate"], losses["forget"], rtol=1e-5, atol=1e-6)


def test_siss_importance_weights_undo_the_defensive_mixture():
    trainer = _data_trainer(baseline="siss", siss_mixture_weight=0.3)
    parts = trainer.sample_batch()
    trainer.compute_targets(parts)
    siss = parts[0]
    assert [p.name for p in parts] == ["siss"]
    # w_x = 1 / ((1-s) + s r), w_a = r / ((1-s) + s r) with r = q(m|a) / q(m|x): (1-s) w_x + s w_a = 1
    torch.testing.assert_close(0.7 * siss.weight_x + 0.3 * siss.weight_a, torch.ones(4))
    assert (siss.weight_x >= 0).all() and (siss.weight_x <= 1 / 0.7 + 1e-6).all()


def test_siss_retain_weight_adds_the_retain_term_of_the_other_data_methods():
    published, with_retain = _data_trainer(baseline="siss"), _data_trainer(baseline="siss", siss_retain_weight=2.0)
    assert not published.objective.wants_retain() and with_retain.objective.wants_retain()
    parts = with_retain.sample_batch()
    assert [p.name for p in parts] == ["siss", "retain"]
    with_retain.compute_targets(parts)
    loss, metrics = with_retain.compute_loss(parts)
    without, _ = with_retain.compute_loss([parts[0]])  # the same draws without the retain part
    torch.testing.assert_close(loss, without + 2.0 * metrics["retain_loss"])
    assert metrics["retain_loss"] > 0
    with pytest.raises(ValueError, match="siss_retain_weight"):
        ConstrainedUnlearningConfig(baseline="siss", siss_retain_weight=-1.0)


@pytest.mark.parametrize("baseline", ["neggrad_plus", "retain_only", "siss"])
def test_data_baselines_train_and_change_the_model(baseline):
    trainer = _data_trainer(baseline=baseline)
    before = copy.deepcopy(trainer.accelerator.unwrap_model(trainer.unet).state_dict())
    logs = trainer.train(max_steps=2)[-1]
    assert "lambda" not in logs and torch.isfinite(torch.tensor(logs["loss"]))
    after = trainer.accelerator.unwrap_model(trainer.unet).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_lora_on_a_unet2dmodel_merges_into_an_equivalent_plain_unet():
    trainer = _trainer(constraint="reverse_kl", peft_config=_lora(2), learning_rate=1e-2, lambda_init=0.5)
    trainer.train(max_steps=2)
    merged = trainer.unlearned_unet().eval()
    assert type(merged).__name__ == "UNet2DModel" and not any("lora" in k for k in merged.state_dict())
    x, t, c = (
        torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0)),
        torch.tensor([10, 500]),
        torch.tensor([3, 4]),
    )
    with torch.no_grad():
        lora_out = trainer.accelerator.unwrap_model(trainer.unet).eval()(x, t, class_labels=c).sample
        base_out = trainer.ref_unet(x, t, class_labels=c).sample
        merged_out = merged(x, t, class_labels=c).sample
    torch.testing.assert_close(merged_out, lora_out, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(lora_out, base_out, atol=1e-6), "the LoRA run did not change the model"


def _sd_trainer(peft_config=None, **overrides):
    components = get_tiny_sd_components(seed=0)
    config = ConstrainedUnlearningConfig(
        **{**TINY, "forget_prompts": ["a photo of a cat"], "retain_prompts": ["a photo of a dog"], **overrides}
    )
    pipe = StableDiffusionPipeline(**{**components, "scheduler": _sd_scheduler()})
    return ConstrainedUnlearningTrainer(pipe, config, peft_config=peft_config), components


def test_prompt_unlearning_with_lora_round_trips_through_load_lora_weights(tmp_path):
    trainer, _ = _sd_trainer(constraint="reverse_kl", peft_config=_lora(2), learning_rate=1e-2, lambda_init=0.5)
    logs = trainer.train(max_steps=2)[-1]
    assert {"lambda", "constraint_estimate", "slack"} <= logs.keys()
    StableDiffusionPipeline.save_lora_weights(tmp_path, unet_lora_layers=trainer.lora_state_dict())

    fresh = StableDiffusionPipeline(**get_tiny_sd_components(seed=0))
    fresh.load_lora_weights(tmp_path)
    cond = trainer.forget_conds[:1]
    x, t = torch.randn(1, 4, 16, 16, generator=torch.Generator().manual_seed(0)), torch.tensor([400])
    with torch.no_grad():
        expected = trainer.accelerator.unwrap_model(trainer.unet).eval()(x, t, encoder_hidden_states=cond).sample
        loaded = fresh.unet(x, t, encoder_hidden_states=cond).sample
        base = trainer.ref_unet(x, t, encoder_hidden_states=cond).sample
    torch.testing.assert_close(loaded, expected, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(loaded, base, atol=1e-6)


def test_prompt_with_a_token_the_tokenizer_does_not_know_is_an_error():
    from transformers import T5Config, T5EncoderModel

    from diffusers_ext.testing import get_tiny_t5_tokenizer

    tokenizer = get_tiny_t5_tokenizer(model_max_length=16)
    encoder = T5EncoderModel(
        T5Config(vocab_size=len(tokenizer), d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16)
    )
    components = get_tiny_sd_components(seed=0)
    config = ConstrainedUnlearningConfig(**TINY, forget_prompts=["a photo of a \u2603"])
    pipe = StableDiffusionPipeline(
        **{**components, "scheduler": _sd_scheduler(), "text_encoder": encoder, "tokenizer": tokenizer}
    )
    with pytest.raises(ValueError, match="does not know"):
        ConstrainedUnlearningTrainer(pipe, config)


@pytest.mark.parametrize(
    "config_kwargs, message",
    [
        ({"constraint": "reverse_kl", "lambda_max": 1.0}, "must be < 1 for constraint='reverse_kl'"),
        ({"constraint": "forward_kl", "lambda_max": 1.5}, "must be < 1 for constraint='forward_kl'"),
        ({"forget_classes": []}, "`forget_classes` is empty"),
        ({"forget_prompts": ["  "]}, "empty prompt"),
        ({"constraint": "kl"}, "`constraint` must be one of"),
        ({"baseline": "uce"}, "`baseline` must be None or one of"),
        ({"forget_classes": [3], "retain_classes": [3, 4]}, "both `forget_classes` and `retain_classes`"),
        ({"lambda_init": 0.95}, "`lambda_init`"),
    ],
)
def test_bad_config_raises(config_kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ConstrainedUnlearningConfig(**config_kwargs)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"forget_classes": [42]}, r"does not know: \[42\]"),
        ({"forget_classes": [10]}, r"does not know: \[10\]"),
        ({"forget_classes": None}, "nothing to forget"),
        (
            {
                "forget_classes": None,
                "forget_dataset": (torch.zeros(0, 1, 8, 8), torch.zeros(0)),
                "retain_dataset": _digits_like(4, 0),
            },
            "is empty",
        ),
        (
            {
                "forget_classes": None,
                "constraint": "reverse_kl",
                "forget_dataset": _digits_like(2, 0),
                "retain_dataset": _digits_like(4, 1),
            },
            "unlearns a concept",
        ),
        ({"forget_classes": None, "forget_dataset": _digits_like(2, 0), "constraint": "forward_kl"}, "retain_dataset"),
        ({"baseline": "neggrad_plus"}, "pass a `forget_dataset`"),
        ({"forget_classes": None, "forget_prompts": ["a cat"]}, "need a UNet2DConditionModel"),
    ],
)
def test_bad_trainer_inputs_raise_before_training(overrides, message):
    with pytest.raises(ValueError, match=message):
        _trainer(**overrides)


def test_v_prediction_scheduler_is_refused():
    config = ConstrainedUnlearningConfig(**TINY, forget_classes=[3])
    scheduler = DDPMScheduler(prediction_type="v_prediction")
    with pytest.raises(ValueError, match="prediction_type 'v_prediction'"):
        ConstrainedUnlearningTrainer(_pipeline(get_tiny_pixel_unet(num_class_embeds=11), scheduler), config)


def test_calibrated_level_is_what_the_retained_classes_read():
    trainer = _trainer(constraint="reverse_kl")
    level = trainer.calibrate_level(num_draws=2)
    assert level > 0 and level == trainer.calibrate_level(num_draws=2), "calibration must be deterministic"
    with pytest.raises(ValueError, match="membership parity"):
        _data_trainer(constraint="forward_kl").calibrate_level()


def test_checkpoint_resume_in_process_equals_the_uninterrupted_run(tmp_path):
    settings = {
        "constraint": "reverse_kl",
        "constraint_level": 50.0,
        "dual_learning_rate": 0.01,
        "save_strategy": "steps",
        "save_steps": 2,
    }
    _trainer(output_dir=str(tmp_path / "resumed"), **settings).train(max_steps=2)
    assert (tmp_path / "resumed" / "checkpoint-2" / "unlearning_state.safetensors").is_file()
    resumed = _trainer(output_dir=str(tmp_path / "resumed"), resume_from_checkpoint="latest", **settings)
    history = resumed.train(max_steps=4)
    assert [h["step"] for h in history] == [3, 4]
    straight = _trainer(output_dir=str(tmp_path / "straight"), **settings)
    straight_history = straight.train(max_steps=4)
    assert [h["loss"] for h in history] == [h["loss"] for h in straight_history[2:]]
    assert resumed.lambda_ == straight.lambda_ and resumed.lambda_ > 0
    for a, b in zip(resumed.trainable_parameters, straight.trainable_parameters):
        assert torch.equal(a, b)
    assert sorted(p.name for p in (tmp_path / "straight").iterdir()) == ["checkpoint-2", "checkpoint-4"]


def test_gradient_accumulation_takes_one_optimizer_and_one_dual_step_per_training_step():
    trainer = _trainer(
        constraint="reverse_kl",
        constraint_level=50.0,
        dual_learning_rate=0.01,
        gradient_accumulation_steps=2,
        per_device_train_batch_size=2,
    )
    logs = trainer.train(max_steps=1)[-1]
    steps = {int(state["step"]) for state in trainer.optimizer.optimizer.state.values()}
    assert steps == {1} and trainer.global_step == 1
    assert logs["lambda"] == pytest.approx(0.01 * (50.0 - logs["constraint_estimate"]))
    assert logs["grad_norm"] > 0
    from accelerate import Accelerator

    with pytest.raises(ValueError, match="accumulates 1 micro-steps; this trainer needs 2"):
        _trainer(gradient_accumulation_steps=2, accelerator=Accelerator())


def test_save_model_writes_the_pipeline_with_the_unlearned_unet_and_a_model_card(tmp_path):
    trainer = _trainer(constraint="reverse_kl", constraint_level=50.0, dual_learning_rate=0.01)
    trainer.train(max_steps=1)
    trainer.save_model(str(tmp_path), base_model="tiny-digits")
    from diffusers_ext import load_pipeline

    loaded = load_pipeline(str(tmp_path))
    assert isinstance(loaded, ClassConditionalDDPMPipeline) and loaded.config.null_class_label == 10
    unlearned = trainer.unlearned_unet().state_dict()
    assert all(torch.equal(v, unlearned[k]) for k, v in loaded.unet.state_dict().items())
    card = (tmp_path / "README.md").read_text()
    assert "tiny-digits with class 3 unlearned" in card and "KL(q || p_u) >= b" in card and "final lambda" in card


# ---------------------------------------------------------------------------------------------------------------------
# half-precision UNets, and the LoRA reference
# ---------------------------------------------------------------------------------------------------------------------


def _bf16_unet():
    return get_tiny_pixel_unet(seed=1, num_class_embeds=11).to(torch.bfloat16)


@pytest.fixture
def fresh_accelerator_state():
    """`mixed_precision` can only be chosen by the first Accelerator of a process: reset accelerate's state."""
    from accelerate.state import AcceleratorState, PartialState

    AcceleratorState._reset_state(True)
    yield
    AcceleratorState._reset_state(True)
    PartialState._reset_state()


@pytest.mark.parametrize("mixed_precision", ["no", "bf16"])
def test_a_bf16_unet_trains_with_or_without_mixed_precision(mixed_precision, fresh_accelerator_state):
    # float32 noise and samples met the bf16 UNet outside autocast (the reference, the pools, the targets)
    trainer = _trainer(
        unet=_bf16_unet(),
        constraint="reverse_kl",
        lambda_init=0.5,
        learning_rate=1e-2,
        mixed_precision=mixed_precision,
    )
    before = copy.deepcopy(trainer.accelerator.unwrap_model(trainer.unet).state_dict())
    history = trainer.train(max_steps=2)
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in history)
    after = trainer.accelerator.unwrap_model(trainer.unet).state_dict()
    assert all(v.dtype == torch.bfloat16 for v in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in after)
    assert trainer.retain_pool.dtype == torch.float32  # pools and targets stay float32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lora_reference_is_the_adapter_disabled_unet_not_a_copy(dtype):
    unet = get_tiny_pixel_unet(seed=1, num_class_embeds=11).to(dtype)
    pretrained = copy.deepcopy(unet)
    trainer = _trainer(unet=unet, constraint="reverse_kl", peft_config=_lora(2), learning_rate=1e-2, lambda_init=0.5)
    assert not list(trainer.ref_unet.parameters())  # no second set of weights
    x, t, c = (
        torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(0)).to(dtype),
        torch.tensor([10, 500]),
        torch.tensor([3, 4]),
    )
    trainer.train(max_steps=2)
    trained = trainer.accelerator.unwrap_model(trainer.unet)
    assert trained.training
    with torch.no_grad():
        reference = trainer.ref_unet(x, t, class_labels=c).sample
        expected = pretrained(x, t, class_labels=c).sample
        lora_out = trained.eval()(x, t, class_labels=c).sample
    assert torch.equal(reference, expected)  # exactly the pretrained computation, after training too
    assert not torch.allclose(lora_out.float(), reference.float(), atol=1e-6)  # and the adapters are back on
    merged = trainer.unlearned_unet()
    assert merged.dtype == dtype


def test_prompt_unlearning_with_lora_on_a_bf16_stable_diffusion():
    components = get_tiny_sd_components(seed=0)
    for name in ("unet", "vae", "text_encoder"):
        components[name] = components[name].to(torch.bfloat16)
    config = ConstrainedUnlearningConfig(
        **{**TINY, "forget_prompts": ["a photo of a cat"], "retain_prompts": ["a photo of a dog"]},
        constraint="reverse_kl",
        lambda_init=0.5,
        learning_rate=1e-2,
    )
    pipe = StableDiffusionPipeline(**{**components, "scheduler": _sd_scheduler()})
    trainer = ConstrainedUnlearningTrainer(pipe, config, peft_config=_lora(2))
    history = trainer.train(max_steps=2)
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in history)
    assert not list(trainer.ref_unet.parameters())
