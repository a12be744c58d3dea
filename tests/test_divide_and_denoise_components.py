"""Divide-and-Denoise building blocks: analytic and windowed experts, MultiDenoiserModel, utilities, detectors."""

import numpy as np
import pytest
import torch
from diffusers import DDPMScheduler

from diffusers_ext import ConvImageClassifier, DivideAndDenoisePipeline, MultiDenoiserModel, WindowedDenoiser
from diffusers_ext.evaluation import EmpiricalOptimalDenoiser
from diffusers_ext.evaluation.divide_and_denoise.composition import (
    BLUE,
    RED,
    detect_discs,
    digits_success,
    disc_templates,
    discs_success,
    score_digit_slots,
)
from diffusers_ext.pipelines.divide_and_denoise.utilities import guidance_delta, x0_saliency
from diffusers_ext.testing import get_dummy_components, get_dummy_inputs, get_tiny_pixel_unet


def test_empirical_optimal_denoiser_is_the_posterior_mean():
    templates = torch.randn(5, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    model = EmpiricalOptimalDenoiser.from_templates(templates, num_train_timesteps=100)
    alpha_bar = DDPMScheduler(num_train_timesteps=100).alphas_cumprod
    # almost no noise: the posterior mean is the template the sample came from
    t = 0
    sample = alpha_bar[t].sqrt() * templates[3:4] + (1 - alpha_bar[t]).sqrt() * 0.1 * torch.randn(1, 1, 4, 4)
    torch.testing.assert_close(model.posterior_mean(sample, t), templates[3:4], atol=1e-4, rtol=0)
    # brute force at a noisy step, with a (batch,) timestep tensor
    t = torch.tensor([60, 60])
    sample = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    a = alpha_bar[60]
    log_w = -((sample[:, None] - a.sqrt() * templates[None]) ** 2).flatten(2).sum(2) / (2 * (1 - a))
    x0 = torch.einsum("bk,kchw->bchw", log_w.softmax(1), templates)
    eps = model(sample, t).sample
    torch.testing.assert_close(eps, (sample - a.sqrt() * x0) / (1 - a).sqrt(), atol=1e-5, rtol=1e-5)


def test_empirical_optimal_denoiser_round_trips(tmp_path):
    templates = disc_templates(RED, (4, 12), (4, 12), num_templates=7, size=16)
    model = EmpiricalOptimalDenoiser.from_templates(templates, beta_schedule="squaredcos_cap_v2")
    model.save_pretrained(tmp_path)
    loaded = EmpiricalOptimalDenoiser.from_pretrained(tmp_path)
    torch.testing.assert_close(loaded.templates, templates)
    assert loaded.config.beta_schedule == "squaredcos_cap_v2" and "templates" not in loaded.config
    with pytest.raises(ValueError, match="templates"):
        EmpiricalOptimalDenoiser(num_templates=2, in_channels=1, sample_size=4, templates=torch.zeros(3, 1, 4, 4))


def test_windowed_denoiser_paints_only_its_window():
    unet = get_tiny_pixel_unet(seed=0, sample_size=8, in_channels=1, num_class_embeds=4)
    model = WindowedDenoiser.from_unet(unet, canvas_size=(8, 24), window_offset=(0, 8), num_train_timesteps=100)
    sample = torch.randn(2, 1, 8, 24, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([1, 2])
    with torch.no_grad():
        eps = model(sample, 40, class_labels=labels).sample
        inner = unet(sample[..., 8:16], 40, class_labels=labels).sample
    torch.testing.assert_close(eps[..., 8:16], inner)
    a = DDPMScheduler(num_train_timesteps=100).alphas_cumprod[40]
    background = (sample - a.sqrt() * -1.0) / (1 - a).sqrt()
    torch.testing.assert_close(eps[..., :8], background[..., :8])
    torch.testing.assert_close(eps[..., 16:], background[..., 16:])
    assert model.num_class_embeds == 4
    from_scheduler = WindowedDenoiser.from_unet(
        unet, (8, 24), (0, 8), scheduler=DDPMScheduler(num_train_timesteps=100, beta_schedule="squaredcos_cap_v2")
    )
    assert from_scheduler.config.num_train_timesteps == 100
    assert from_scheduler.config.beta_schedule == "squaredcos_cap_v2"
    with pytest.raises(ValueError, match="window_offset"):
        WindowedDenoiser.from_unet(unet, canvas_size=(8, 24), window_offset=(0, 20))


def test_multi_denoiser_model_saves_each_denoiser(tmp_path):
    unet = get_tiny_pixel_unet(seed=0)
    analytic = EmpiricalOptimalDenoiser.from_templates(torch.ones(2, 1, 8, 8))
    multi = MultiDenoiserModel([unet, analytic])
    multi.save_pretrained(tmp_path)
    loaded = MultiDenoiserModel.from_pretrained(tmp_path, dtype=torch.float64)
    assert [type(m).__name__ for m in loaded] == ["UNet2DModel", "EmpiricalOptimalDenoiser"]
    # an evaluation model keeps the name ["diffusers_ext", Class] that folders saved before the move hold
    assert loaded.config.denoiser_classes[1] == ["diffusers_ext", "EmpiricalOptimalDenoiser"]
    assert loaded[0].dtype == torch.float64
    for a, b in zip(unet.state_dict().values(), loaded[0].state_dict().values()):
        torch.testing.assert_close(a.double(), b)
    with pytest.raises(ValueError, match="denoisers"):
        MultiDenoiserModel([])
    with pytest.raises(TypeError, match="denoisers"):
        MultiDenoiserModel(unet)
    with pytest.raises(ValueError, match="only diffusers"):
        MultiDenoiserModel([torch.nn.Linear(2, 2)]).save_pretrained(tmp_path / "bad")


def test_utilities():
    x0 = torch.full((1, 3, 6, 6), -1.0)
    x0[:, 0, 1:3, 1:3] = 1.0  # a red square on black
    saliency = x0_saliency(x0)
    assert saliency.shape == (1, 6, 6)
    assert (saliency[0, 1:3, 1:3] == 2).all() and saliency.sum() == 8
    torch.testing.assert_close(
        x0_saliency(x0, background=1.0)[0, 0, 0], torch.tensor(12.0).sqrt()
    )  # 3 channels off by 2
    cond, uncond = torch.zeros(1, 2, 3, 3), torch.zeros(1, 2, 3, 3)
    cond[0, :, 1, 1] = torch.tensor([3.0, 4.0])
    delta = guidance_delta(cond, uncond)
    assert delta[0, 1, 1] == 5 and delta.sum() == 5


def test_disc_detector_counts_full_strength_discs():
    red = disc_templates(RED, (4, 4), (8, 8), num_templates=1)
    blue = disc_templates(BLUE, (12, 12), (8, 8), num_templates=1)
    both = torch.maximum(red, blue)  # two discs on black
    images = torch.cat([both, red, torch.maximum(red, red.roll(8, dims=3)), (both + 1) / 2 * 0.5 * 2 - 1]) / 2 + 0.5
    counts = detect_discs(images)
    assert counts["red"].tolist() == [1, 1, 2, 0] and counts["blue"].tolist() == [1, 0, 0, 0]
    assert discs_success(images).tolist() == [True, False, False, False]
    # the faded copy (half strength) counts for the lenient detector only
    assert discs_success(images, min_intensity=0.3).tolist() == [True, False, False, True]
    with pytest.raises(ValueError, match="images"):
        detect_discs(torch.zeros(1, 1, 4, 4))


def test_digit_slot_scoring():
    classifier = ConvImageClassifier(sample_size=8, in_channels=1, num_classes=10).eval()
    images = torch.full((2, 1, 8, 24), -1.0)
    images[0, :, 2:6, 2:6] = 1.0  # ink in slot 0 of image 0
    images[1, :, 2:6, 10:14] = 1.0  # ink in slot 1 of image 1
    images[1, :, 3, 18] = 1.0  # a speck in slot 2: not a digit
    present, labels = score_digit_slots(classifier, images)
    assert present.tolist() == [[True, False, False], [False, True, False]]
    assert labels.shape == (2, 3)
    label = int(labels[0, 0])
    assert digits_success(present, labels, [label]).tolist()[0]
    assert not digits_success(present, labels, [label, label]).tolist()[0]
    np.testing.assert_array_equal(digits_success(present, labels, []), [False, False])
    with pytest.raises(ValueError, match="images"):
        score_digit_slots(classifier, torch.zeros(1, 1, 8, 20))


def test_attention_recorders_install_on_the_text_layers_without_walking_the_model_each_call(monkeypatch):
    """The text-attention layers a recording installs on are found once per model, not at every installation."""
    from diffusers_ext.pipelines.divide_and_denoise.utilities import ConceptAttentionStore, record_cross_attention
    from diffusers_ext.testing import get_tiny_sd_components

    unet = get_tiny_sd_components(seed=0)["unet"]
    before = dict(unet.attn_processors)
    store = ConceptAttentionStore((8, 8))
    sample, states = torch.randn(1, 4, 8, 8), torch.randn(1, 77, unet.config.cross_attention_dim)
    with torch.no_grad(), record_cross_attention(unet, store):
        plain_ids = {name for name, p in unet.attn_processors.items() if p is before[name]}
        unet(sample, 10, encoder_hidden_states=states)
    assert plain_ids == {name for name in before if not name.endswith("attn2.processor")}
    assert store.num_layers == sum(name.endswith("attn2.processor") for name in before) > 0
    assert all(unet.attn_processors[name] is p for name, p in before.items())  # restored

    monkeypatch.setattr(unet, "named_modules", lambda *a, **k: pytest.fail("the model was walked again"))
    store.reset()
    with torch.no_grad(), record_cross_attention(unet, store):
        unet(sample, 10, encoder_hidden_states=states)
    assert store.num_layers > 0


def test_a_compiled_denoiser_is_classified_saved_and_run_as_the_module_it_compiles(tmp_path):
    from diffusers_ext.pipelines.divide_and_denoise.denoisers import denoiser_conditioning
    from diffusers_ext.testing import get_tiny_sd_components

    sd_unet = get_tiny_sd_components(seed=0)["unet"]
    compiled = torch.compile(sd_unet, backend="eager")
    assert denoiser_conditioning(compiled) == "text"  # was "none": isinstance on the compiled wrapper
    model = MultiDenoiserModel([compiled])
    assert model.config.denoiser_classes == [["diffusers", "UNet2DConditionModel"]]
    model.save_pretrained(tmp_path)
    loaded = MultiDenoiserModel.from_pretrained(tmp_path)
    assert type(loaded[0]).__name__ == "UNet2DConditionModel"

    pipe_plain = DivideAndDenoisePipeline(**get_dummy_components(DivideAndDenoisePipeline, seed=0))
    components = get_dummy_components(DivideAndDenoisePipeline, seed=0)
    components["denoisers"] = MultiDenoiserModel([torch.compile(components["denoisers"][0], backend="eager")])
    pipe_compiled = DivideAndDenoisePipeline(**components)
    assert pipe_compiled.conditioning == "class"
    outs = [pipe(**get_dummy_inputs(DivideAndDenoisePipeline, seed=0)).images for pipe in (pipe_plain, pipe_compiled)]
    np.testing.assert_allclose(outs[1], outs[0], atol=1e-5)
