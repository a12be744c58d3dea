"""SPADE: the offline tasks, the surrogate, its predictive pipeline, the kNN helper and the losses (parity with the
reference implementation)."""

import numpy as np
import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler

from diffusers_ext.data.offline_bbo import (
    ContinuousTask,
    EhrlichFunction,
    EhrlichTask,
    TFBindLikeTask,
    from_logits,
    to_logits,
)
from diffusers_ext.losses.spade import calibration_loss, denoising_loss, support_loss, support_transform
from diffusers_ext.models.scalar_diffusion_surrogate import ScalarDiffusionSurrogate
from diffusers_ext.pipelines.spade.pipeline_surrogate_predictive import SurrogatePredictivePipeline
from diffusers_ext.pipelines.spade.sampling import predictive_samples
from diffusers_ext.pipelines.spade.support import KnnSupport


# Numbers computed by HarryYoung2018/spade @586151bbb56e246f93ca97ce33f79887a13161bd (MIT) on the network,
# inputs and noise built below (weights copied into its CondEpsNet); only its outputs are stored here.
REFERENCE = {
    "denoising_loss": 0.731729,
    "mc10_samples": [
        [-1.814763, 1.424925, -2.253891, -1.932051, -2.112398, 1.843287],
        [-1.842237, -0.291328, -1.43749, 1.023102, -1.954384, -0.245296],
        [-0.308854, -0.550148, -0.483347, 0.061531, -1.319068, -2.151067],
        [-0.380485, 1.064101, -1.230753, 1.100298, 0.231639, 0.925366],
    ],
    "mc10_mean": [-1.086585, 0.411888, -1.35137, 0.06322, -1.288553, 0.093073],
    "mc10_std": [0.742411, 0.847298, 0.630471, 1.222499, 0.926548, 1.492198],
    "mc50_samples": [
        [-1.650472, 1.998958, -0.089301, -0.348846, 1.795117, -0.474981],
        [1.879851, 1.177491, -1.273355, 0.626647, -1.511822, -0.482359],
        [-0.789207, 1.311933, -1.216911, -1.658964, 3.503486, -2.037254],
    ],
    "calibration_loss": 2.059471,
    "calibration_loss_t2_p5": 1.874845,
    "knn_cached_mean": [-0.077177, -0.018637, -0.494141, -0.757153, -0.494141, -0.494141],
    "knn_cached_radius": [1.545471, 1.342547, 0.632747, 1.254503, 0.632747, 0.569394],
    "knn_query_mean": [-0.015084, 0.244375, -0.015084, -0.077177],
    "knn_query_radius": [1.467176, 1.363741, 1.056167, 1.007977],
    "support_loss": 0.306491,
    "support_loss_big": 0.308445,
    "log_radius_query": [0.383339, 0.310232, 0.054646, 0.007945],
    "support_transform": [
        [0.322157, 0.276992, 1.565179, -0.158023],
        [-2.629115, 0.020925, 0.965782, 0.065754],
        [-2.285148, 0.323061, 0.999466, -0.216005],
        [0.69088, 0.993627, 0.242876, 1.848989],
        [-1.857338, -0.881279, -0.139603, 1.596213],
    ],
}

SCHEDULER = {"num_train_timesteps": 100, "beta_schedule": "linear", "beta_start": 1e-4, "beta_end": 2e-2}


def tiny_model():
    torch.manual_seed(0)
    return ScalarDiffusionSurrogate(x_dim=3, hidden_size=8, time_embed_dim=8, num_train_timesteps=100).eval()


def inputs():
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(10))
    y = torch.randn(6, 1, generator=torch.Generator().manual_seed(11))
    return x, y


def pipeline(model=None):
    scheduler = DDIMScheduler(**SCHEDULER, timestep_spacing="linspace", clip_sample=False)
    return SurrogatePredictivePipeline(model=model or tiny_model(), scheduler=scheduler)


def close(actual, expected, atol=1e-5):
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64), np.asarray(expected), atol=atol, rtol=1e-5)


# --------------------------------------------------------------------------------------------------------------
# Parity with the reference
# --------------------------------------------------------------------------------------------------------------


def test_denoising_loss_matches_reference():
    model, (x, y) = tiny_model(), inputs()
    generator = torch.Generator().manual_seed(1)  # the reference draws the timesteps, then the noise
    timesteps = torch.randint(0, 100, (6,), generator=generator)
    noise = torch.randn(6, 1, generator=generator)
    loss = denoising_loss(model, DDPMScheduler(**SCHEDULER).alphas_cumprod, x, y, timesteps, noise)
    close(float(loss.detach()), REFERENCE["denoising_loss"])


def test_ddim_monte_carlo_statistics_match_reference():
    x, _ = inputs()
    out = pipeline()(x, num_samples=4, num_inference_steps=10, generator=torch.Generator().manual_seed(2))
    close(out.samples, REFERENCE["mc10_samples"])
    close(out.mean, REFERENCE["mc10_mean"])
    close(out.std, REFERENCE["mc10_std"])


def test_fifty_step_samples_match_reference_with_its_timesteps():
    x, _ = inputs()
    pipe = pipeline()
    # the reference truncates linspace(T - 1, 0, n); diffusers' "linspace" spacing rounds: they agree at 10 steps
    reference_steps = torch.linspace(99, 0, 50).long()
    pipe.scheduler.set_timesteps(50)
    assert not torch.equal(pipe.scheduler.timesteps, reference_steps)
    pipe.scheduler.set_timesteps(10)
    assert torch.equal(pipe.scheduler.timesteps, torch.linspace(99, 0, 10).long())
    generator = torch.Generator().manual_seed(4)
    out = pipe(x, num_samples=3, timesteps=reference_steps.tolist(), generator=generator)
    close(out.samples, REFERENCE["mc50_samples"])


def test_calibration_loss_matches_reference():
    _, y = inputs()
    mean = torch.tensor(REFERENCE["mc10_mean"])
    close(float(calibration_loss(mean, y, 32, 1.0, torch.Generator().manual_seed(3))), REFERENCE["calibration_loss"])
    loss = calibration_loss(mean, y, 5, 2.0, torch.Generator().manual_seed(3))
    close(float(loss), REFERENCE["calibration_loss_t2_p5"])


def test_knn_and_support_loss_match_reference():
    x, y = inputs()
    knn = KnnSupport(x, y.reshape(-1), k=3)
    cached_mean, cached_radius = knn.query(x, indices=torch.arange(6))
    close(cached_mean, REFERENCE["knn_cached_mean"])
    close(cached_radius, REFERENCE["knn_cached_radius"])
    searched = knn.query(x)  # a search finds the same statistics as the cache
    close(searched[0], REFERENCE["knn_cached_mean"])
    query = torch.randn(4, 3, generator=torch.Generator().manual_seed(12))
    query_mean, query_radius = knn.query(query)
    close(query_mean, REFERENCE["knn_query_mean"])
    close(query_radius, REFERENCE["knn_query_radius"])
    close(knn.log_radius(query), REFERENCE["log_radius_query"])
    mean, std = torch.tensor(REFERENCE["mc10_mean"]), torch.tensor(REFERENCE["mc10_std"])
    close(float(support_loss(mean, std, cached_mean, cached_radius)), REFERENCE["support_loss"])
    loss = support_loss(mean, std, cached_mean, cached_radius, tau_a=0.3, sigma_a0=0.5, sigma_a1=0.1)
    assert float(loss) > 0
    close(float(loss), REFERENCE["support_loss_big"])


def test_support_transform_matches_reference():
    samples = torch.randn(5, 4, generator=torch.Generator().manual_seed(13))
    log_radius = torch.tensor(REFERENCE["log_radius_query"])
    out = support_transform(samples, log_radius, tau_a=0.3, sigma_a0=0.5, sigma_a1=0.1)
    close(out, REFERENCE["support_transform"])
    assert bool((out.std(0, unbiased=False) >= 0.5 + 0.1 * log_radius - 1e-5).all())


# --------------------------------------------------------------------------------------------------------------
# Surrogate, pipeline, helpers
# --------------------------------------------------------------------------------------------------------------


def test_samples_are_differentiable_through_the_sampler():
    model, (x, _) = tiny_model(), inputs()
    scheduler = DDIMScheduler(**SCHEDULER, timestep_spacing="linspace", clip_sample=False)
    scheduler.set_timesteps(10)
    latents = torch.randn(4, 6, generator=torch.Generator().manual_seed(2))
    samples = predictive_samples(model, scheduler.alphas_cumprod, scheduler.timesteps, x, latents)
    close(samples.detach(), REFERENCE["mc10_samples"])
    samples.mean().backward()
    assert model.head[0].weight.grad is not None and model.head[0].weight.grad.abs().sum() > 0


@pytest.mark.support_cell("spade", "pack")
def test_pipeline_maps_data_units_through_the_stored_normalisation():
    model, (x, _) = tiny_model(), inputs()
    model.set_normalization(x_mean=[1.0, -2.0, 0.5], x_std=[2.0, 0.5, 3.0], y_mean=10.0, y_std=4.0)
    pipe = pipeline(model)
    raw_x = x * model.x_std + model.x_mean
    out = pipe(raw_x, num_samples=4, num_inference_steps=10, generator=torch.Generator().manual_seed(2))
    close(out.samples, np.asarray(REFERENCE["mc10_samples"]) * 4.0 + 10.0, atol=1e-4)
    close(out.std, np.asarray(REFERENCE["mc10_std"]) * 4.0, atol=1e-4)
    latent = pipe(
        raw_x, num_samples=4, num_inference_steps=10, generator=torch.Generator().manual_seed(2), output_type="latent"
    )
    close(latent.samples, REFERENCE["mc10_samples"], atol=1e-4)


def test_model_save_load_round_trip(tmp_path):
    model = tiny_model()
    model.set_normalization(x_mean=[1.0, 2.0, 3.0], x_std=[1.0, 1.0, 2.0], y_mean=-1.0, y_std=3.0)
    model.save_pretrained(tmp_path)
    loaded = ScalarDiffusionSurrogate.from_pretrained(tmp_path)
    assert torch.equal(loaded.x_std, model.x_std) and float(loaded.y_mean) == -1.0


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"x": torch.zeros(2, 4)}, "x"),
        ({"x": [[0.0, 0.0, 0.0]]}, "x"),
        ({"num_samples": 0}, "num_samples"),
        ({"num_inference_steps": 0}, "num_inference_steps"),
        ({"output_type": "pil"}, "output_type"),
        ({"latents": torch.zeros(3, 2)}, "latents"),
        ({"timesteps": [5, 10]}, "timesteps"),
        ({"timesteps": [100, 0]}, "timesteps"),
    ],
)
def test_pipeline_rejects_bad_inputs(kwargs, argument):
    call = {"x": torch.zeros(2, 3), "num_samples": 2, "num_inference_steps": 2, **kwargs}
    with pytest.raises((ValueError, TypeError), match=argument):
        pipeline()(**call)


def test_knn_rejects_bad_k():
    with pytest.raises(ValueError, match="k"):
        KnnSupport(np.zeros((3, 2)), np.zeros(3), k=4)


# --------------------------------------------------------------------------------------------------------------
# Offline tasks
# --------------------------------------------------------------------------------------------------------------


def test_logit_relaxation_round_trips():
    tokens = np.random.default_rng(0).integers(0, 4, size=(20, 8))
    logits = to_logits(tokens, 4)
    assert logits.shape == (20, 24)
    assert np.array_equal(from_logits(logits, 8, 4), tokens)


def test_tfbind_like_task_is_enumerated_and_offline_is_bottom_half():
    task = TFBindLikeTask(seed=0)
    assert task.all_y.shape == (65536,) and task.offline_x.shape == (32768, 24)
    assert task.offline_y.max() <= np.median(task.all_y) + 1e-6
    assert np.allclose(task.oracle(task.offline_x[:50]), task.offline_y[:50], atol=1e-5)
    best = to_logits(task.all_tokens[[task.all_y.argmax()]], 4)
    assert task.normalise(task.oracle(best))[0] == pytest.approx(1.0)
    scores = task.score_candidates(task.offline_x[:128])
    assert 0.0 <= scores["p50"] <= scores["p100"] <= 0.6


def test_ehrlich_function_optimum_and_feasibility():
    function = EhrlichFunction(seq_len=16, num_states=8, num_motifs=2, motif_length=4, quantization=4, seed=0)
    optimum = function.optimal_sequence()
    assert function(optimum[None])[0] == 1.0
    samples = function.sample_dmp(500, np.random.default_rng(0))
    assert function.is_feasible(samples).all()
    values = function(samples)
    assert values.max() < 1.0 and set(np.unique(values)) <= {i * j / 16 for i in range(5) for j in range(5)}
    infeasible = optimum.copy()
    a = infeasible[0]
    blocked = int(np.flatnonzero(~function.feasible[a])[0])
    infeasible[1] = blocked
    assert function(infeasible[None])[0] == 0.0


def test_ehrlich_task_and_continuous_task():
    task = EhrlichTask(seq_len=16, num_states=8, num_motifs=2, motif_length=4, num_samples=2000, offline_size=300)
    assert task.offline_x.shape == (300, 16 * 7) and task.y_max == 1.0
    assert np.allclose(task.oracle(task.offline_x), task.offline_y)
    cont = ContinuousTask("styblinski_tang", dim=20, num_samples=400, reference_size=10_000)
    assert cont.offline_x.shape == (200, 20)
    assert cont.normalise(cont.oracle(np.full((1, 20), -2.903534)))[0] == pytest.approx(1.0)
    assert cont.offline_best() < 0.8
    with pytest.raises(ValueError, match="x"):
        cont.oracle(np.zeros((2, 3)))
