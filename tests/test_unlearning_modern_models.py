"""Constrained unlearning on SDXL (pooled embeddings and time ids), SD3 and Flux (velocity-space targets, LoRA on the
transformer), with tiny real components in float32 and in the dtype users run them in.
The tests parametrized by `modern_pipelines.dtype_cases` carry the `support_cell` markers of docs/support.md."""

import math
import re

import pytest
import torch
from modern_pipelines import FAMILIES, MAX_SEQUENCE_LENGTH, call_kwargs, dtype_cases, resolution, tiny_pipeline
from peft import LoraConfig

from diffusers_ext import ConstrainedUnlearningConfig, ConstrainedUnlearningTrainer
from diffusers_ext.pipelines.denoiser_families import Conditions
from diffusers_ext.trainers.unlearning_noise import FlowMatchingNoiseProcess


def _config(tmp_path, family, **overrides):
    settings = {
        "output_dir": str(tmp_path),
        "forget_prompts": ["a photo of a cat"],
        "retain_prompts": ["a photo of a dog"],
        "constraint": "reverse_kl",
        "constraint_level": 1e3,  # out of reach: lambda must rise every step
        "dual_learning_rate": 1e-4,
        "lambda_init": 0.5,
        "max_steps": 2,
        "per_device_train_batch_size": 2,
        "pool_size": 2,
        "pool_sampling_steps": 2,
        "learning_rate": 1e-2,
        "resolution": resolution(family),
        "max_sequence_length": MAX_SEQUENCE_LENGTH,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "seed": 0,
    }
    return ConstrainedUnlearningConfig(**{**settings, **overrides})


def _lora():
    return LoraConfig(r=2, lora_alpha=2, init_lora_weights="gaussian")


def _lora_weights(model):
    # adapter names differ ("default" when trained, "default_0" when loaded); compare the weights by module
    return {re.sub(r"\.default\w*\.", ".", n): p.detach().float() for n, p in model.named_parameters() if "lora_" in n}


@pytest.mark.parametrize("family, dtype", dtype_cases("unlearning"))
def test_unlearning_trains_lora_that_reloads_into_the_pipeline_and_samples(family, dtype, tmp_path):
    pipe = tiny_pipeline(family, dtype)
    # a large step, so that the LoRA's change stands out of half precision's rounding
    trainer = ConstrainedUnlearningTrainer(pipe, _config(tmp_path, family, learning_rate=5e-2), peft_config=_lora())
    assert trainer.noise_process.flow_matching == (family != "sdxl")
    history = trainer.train()
    for logs in history:
        assert all(math.isfinite(v) for v in logs.values()), logs
    assert history[-1]["lambda"] > 0.5  # the dual ascent on the violated constraint
    trained = trainer.accelerator.unwrap_model(trainer.unet)
    assert trained.dtype == dtype

    trainer.save_model()
    assert (tmp_path / "pytorch_lora_weights.safetensors").is_file() and (tmp_path / "README.md").is_file()
    fresh = tiny_pipeline(family, dtype)
    denoiser = fresh.unet if family == "sdxl" else fresh.transformer
    generator = torch.Generator().manual_seed(0)
    x = torch.randn((1, *trainer.sample_shape), generator=generator)
    t = torch.tensor([trainer.num_train_timesteps // 2])
    timestep = trainer.noise_process.model_timestep(t)
    cond = trainer.forget_conds[:1]
    with torch.no_grad():
        before = trainer.family.predict(denoiser, x, timestep, cond, dtype).float()
        fresh.load_lora_weights(str(tmp_path))
        after = trainer.family.predict(denoiser.eval(), x, timestep, cond, dtype).float()
        expected = trainer.family.predict(trained.eval(), x, timestep, cond, dtype).float()
    loaded, saved = _lora_weights(denoiser), _lora_weights(trained)
    assert loaded.keys() == saved.keys() and loaded
    for name, value in saved.items():
        torch.testing.assert_close(loaded[name], value, atol=1e-2 if dtype != torch.float32 else 0, rtol=1e-2)
    # the reloaded LoRA gives the trained model's prediction, which the unlearning moved
    torch.testing.assert_close(after, expected, atol=2e-2 if dtype != torch.float32 else 1e-5, rtol=2e-2)
    assert (after - before).abs().max() > 4 * (expected - after).abs().max()

    steps = []

    def callback(pipeline, step, timestep, tensors):
        assert torch.isfinite(tensors["latents"]).all()
        steps.append(step)
        return tensors

    images = fresh(
        "a photo of a cat",
        num_inference_steps=2,
        output_type="np",
        callback_on_step_end=callback,
        **call_kwargs(family),
    ).images
    assert steps == [0, 1]
    assert images.shape == (1, resolution(family), resolution(family), 3) and bool((images == images).all())


@pytest.mark.parametrize("family, dtype", dtype_cases("unlearning"))
def test_batched_predictions_and_targets_equal_single_ones(family, dtype, tmp_path):
    """One forward over the forget, retain and reference prompts' [`Conditions`] equals a forward per prompt."""
    trainer = ConstrainedUnlearningTrainer(tiny_pipeline(family, dtype), _config(tmp_path, family))
    conds = Conditions.cat([trainer.forget_conds, trainer.retain_conds, trainer.reference_cond])
    assert len(conds) == 3
    if family == "sdxl":  # the pooled embedding and SDXL's (size, crop, size) time ids travel with the prompt states
        assert set(conds.tensors) == {"encoder_hidden_states", "text_embeds", "time_ids"}
        side = resolution(family)
        assert conds.tensors["time_ids"].tolist() == [[side, side, 0, 0, side, side]] * 3
    else:
        assert set(conds.tensors) == {"encoder_hidden_states", "pooled_projections"}
    x = torch.randn((3, *trainer.sample_shape), generator=torch.Generator().manual_seed(1))
    t = torch.tensor([10, trainer.num_train_timesteps // 2, trainer.num_train_timesteps - 1])
    with torch.no_grad():
        batched = trainer.predict(trainer.ref_unet, x, t, conds)
        singles = torch.cat(
            [trainer.predict(trainer.ref_unet, x[i : i + 1], t[i : i + 1], conds[i : i + 1]) for i in range(3)]
        )
    assert batched.dtype == torch.float32 and torch.isfinite(batched).all()
    tolerance = {"atol": 1e-5, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(batched, singles, **tolerance)
    # prompts are told apart: the forget and retain prompts give different predictions
    assert (batched[0] - trainer.predict(trainer.ref_unet, x[:1], t[:1], conds[1:2])[0]).abs().max() > 0


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_the_velocity_target_is_the_noise_space_target(family, tmp_path):
    """The reverse-KL / ESD target written in velocity space, v_ref + eta (v_ref - v_u), is the noise-space target
    eps_ref + eta (eps_ref - eps_u) of the same model: eps = x_t + (1 - sigma) v is affine in v with the same x_t."""
    trainer = ConstrainedUnlearningTrainer(
        tiny_pipeline(family), _config(tmp_path, family, lambda_init=0.6), peft_config=_lora()
    )
    part = trainer.sample_batch(0)[0]
    assert part.name == "forget"
    trainer.compute_targets([part])
    eta = 0.6 / 0.4
    sigma = trainer.noise_process.sigmas[part.t].view(-1, 1, 1, 1)

    def to_eps(v):
        return part.x_t + (1 - sigma) * v

    eps_target = to_eps(part.eps_ref) + eta * (to_eps(part.eps_ref) - to_eps(part.eps_u))
    torch.testing.assert_close(to_eps(part.target), eps_target, atol=1e-5, rtol=1e-5)
    # the denoising target is the velocity noise - x0 of x_t = (1 - sigma) x0 + sigma noise
    torch.testing.assert_close(part.x_t, (1 - sigma) * part.x0 + sigma * part.noise)
    torch.testing.assert_close(part.denoising_target, part.noise - part.x0)


def test_flow_path_kl_of_two_gaussians_is_their_kl():
    """The reverse-KL constraint's path sum recovers KL(q_0 || p_0) for data N(a, I) and N(b, I).

    Under the rectified flow x_s = (1 - s) x0 + s eps, N(m, I) data has the velocity field
    v(x) = (2s - 1) / V (x - (1 - s) m) - m with V = (1 - s)^2 + s^2, so v_a - v_b = -s / V (a - b) everywhere, and
    both flows start from the same noise at s = 1: the path KL int (1 - s) / s ||v_a - v_b||^2 ds must equal
    KL(N(a, I) || N(b, I)) = ||a - b||^2 / 2.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler

    a, b = torch.tensor([0.3, -1.0, 2.0]), torch.tensor([-0.5, 0.0, 1.0])
    for shift in (1.0, 3.0):  # Flux's training sigmas, SD3's
        process = FlowMatchingNoiseProcess(FlowMatchEulerDiscreteScheduler(shift=shift).config)
        s = process.sigmas.double()
        gap = (s / ((1 - s) ** 2 + s**2)) ** 2 * float(((a - b) ** 2).sum())
        path_kl = float((process.path_weights.double() * gap).sum())
        assert path_kl == pytest.approx(float(((a - b) ** 2).sum()) / 2, rel=2e-3)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_data_unlearning_on_a_text_to_image_model_is_refused(family, tmp_path):
    config = _config(tmp_path, family, constraint="forward_kl", forget_prompts=None, retain_prompts=None)
    images = torch.zeros(2, 4, 8, 8)
    with pytest.raises(ValueError, match="data unlearning is supported for UNet2DModel"):
        ConstrainedUnlearningTrainer(tiny_pipeline(family), config, forget_dataset=images, retain_dataset=images)


def test_a_flow_transformer_with_a_ddpm_scheduler_is_refused(tmp_path):
    from diffusers import DDPMScheduler

    pipe = tiny_pipeline("flux")
    pipe.scheduler = DDPMScheduler()
    with pytest.raises(TypeError, match="FluxTransformer2DModel .*expected a FlowMatchEulerDiscreteScheduler"):
        ConstrainedUnlearningTrainer(pipe, _config(tmp_path, "flux"))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_train_unlearning_script_takes_the_pipeline_folder(family, tmp_path):
    from test_unlearning_script import TINY, _script

    base = tmp_path / "base"
    tiny_pipeline(family).save_pretrained(base)
    out = tmp_path / "out"
    argv = ["--pretrained_model_name_or_path", str(base), "--output_dir", str(out)]
    prompts = ["--forget_prompts", "a photo of a cat", "--retain_prompts", "a photo of a dog"]
    sizes = ["--resolution", str(resolution(family)), "--max_sequence_length", str(MAX_SEQUENCE_LENGTH)]
    _script().main([*argv, *prompts, *sizes, "--use_lora", "--lora_rank", "2", "--max_steps", "1", *TINY])
    assert (out / "pytorch_lora_weights.safetensors").is_file()
    pipe = tiny_pipeline(family)
    pipe.load_lora_weights(str(out))
    denoiser = pipe.unet if family == "sdxl" else pipe.transformer
    assert _lora_weights(denoiser)


def test_a_family_without_text_refuses_prompts_by_name():
    from types import SimpleNamespace

    from diffusers_ext.pipelines.denoiser_families import ClassUNetFamily
    from diffusers_ext.testing import get_tiny_pixel_unet

    family = ClassUNetFamily(SimpleNamespace(unet=get_tiny_pixel_unet(), vae=None))
    with pytest.raises(
        TypeError, match=r"`forget_prompts` holds prompts, but the 'pack' family's denoiser takes no text"
    ):
        family.encode_prompts(["a cat"], "forget_prompts")
