"""ManifoldFlowPipeline and ManifoldFlowTransformerModel: the conformance suite, the two-head decomposition against
the exact velocity, the sign convention shared by the loss and diffusers' FlowMatchEulerDiscreteScheduler, the
sigma -> 0 end, the fitted and the learned subspace, save/load, bad input."""

import math

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from diffusers_ext import (
    ManifoldFlowPipeline,
    ManifoldFlowTransformerModel,
    ManifoldFlowTransformerOutput,
)
from diffusers_ext.data.manifolds import make_manifold, random_orthonormal_map
from diffusers_ext.evaluation.manifold_flow import GaussianMixtureVelocityModel, off_manifold_rms, train_velocity_model
from diffusers_ext.losses.manifold_flow import manifold_flow_loss
from diffusers_ext.testing import PipelineConformanceTests


class TestManifoldFlowPipeline(PipelineConformanceTests):
    pipeline_class = ManifoldFlowPipeline


def tiny_model(ambient_dim=8, latent_dim=2, **kwargs):
    torch.manual_seed(0)
    options = {"num_tokens": 2, "hidden_size": 8, "num_layers": 1, "num_attention_heads": 2, "time_embedding_dim": 8}
    return ManifoldFlowTransformerModel(ambient_dim=ambient_dim, latent_dim=latent_dim, **{**options, **kwargs})


def principal_angle(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest principal angle between the column spans of two orthonormal matrices (by its sine, which is
    accurate near 0: the spectral norm of `(I - B B^T) A`)."""
    a, b = a.double(), b.double()
    return float(torch.arcsin(torch.linalg.matrix_norm(a - b @ (b.T @ a), ord=2).clamp(max=1.0)))


def pipe_of(model):
    pipe = ManifoldFlowPipeline(model=model, scheduler=FlowMatchEulerDiscreteScheduler())
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("noise_std", [0.0, 0.2])
def test_orthogonal_head_is_the_exact_velocity_across_the_subspace(noise_std):
    manifold = make_manifold("ring_mixture", 7, noise_std=noise_std, seed=1)
    oracle = GaussianMixtureVelocityModel.from_manifold(manifold)
    model = tiny_model(7).double()
    model.set_subspace(manifold.basis)
    model.set_orthogonal_noise_std(noise_std)
    generator = torch.Generator().manual_seed(0)
    x = oracle.sample_data(64, generator)
    sigma = torch.rand(64, generator=generator, dtype=torch.float64) * 0.99 + 0.005
    y = (1 - sigma[:, None]) * x + sigma[:, None] * torch.randn(x.shape, generator=generator, dtype=torch.float64)
    exact = oracle.velocity(y, sigma)
    basis = manifold.basis
    perp = y - (y @ basis) @ basis.T
    exact_perp = exact - (exact @ basis) @ basis.T
    torch.testing.assert_close(exact_perp, model.orthogonal_coefficient(sigma[:, None]) * perp)
    # the exact velocity along the subspace is a function of B^T y alone: moving y across it changes nothing there
    moved = y + perp * 3.0
    torch.testing.assert_close(exact @ basis, oracle.velocity(moved, sigma) @ basis)
    # the model's output splits the same way: its tangent part does not see the orthogonal part of the input
    ours = model(y, sigma * 1000).sample
    ours_moved = model(moved, sigma * 1000).sample
    torch.testing.assert_close(ours @ basis, ours_moved @ basis)


class PointMassTangent(torch.nn.Module):
    """The exact d-dim velocity of a point mass `z0`: `(w - z0) / sigma`."""

    def __init__(self, point):
        super().__init__()
        self.register_buffer("point", point)

    def forward(self, w, timestep):
        sigma = (timestep.to(w.dtype) / 1000).unsqueeze(-1)
        return (w - self.point) / sigma


def test_loss_and_sampler_share_one_sign_convention():
    model = tiny_model(5).double()
    basis = random_orthonormal_map(2, 5, 3)
    model.set_subspace(basis)
    point = torch.tensor([0.7, -1.3], dtype=torch.float64)
    model.tangent_head = PointMassTangent(point)
    data = (point @ basis.T).expand(128, 5)
    generator = torch.Generator().manual_seed(0)
    assert manifold_flow_loss(model, data, generator) < 1e-16
    pipe = pipe_of(model)
    out = pipe(batch_size=6, num_inference_steps=4, generator=generator).samples
    torch.testing.assert_close(out, data[:6], atol=1e-6, rtol=0)  # the scheduler steps in float32 sigmas


@pytest.mark.support_cell("manifold_flow", "pack")
def test_euler_samples_land_exactly_on_the_subspace():
    model = tiny_model(12)
    basis = random_orthonormal_map(2, 12, 0).float()
    model.set_subspace(basis)
    samples = pipe_of(model)(batch_size=16, num_inference_steps=5, generator=torch.Generator().manual_seed(0)).samples
    assert off_manifold_rms(samples, basis) < 1e-5
    assert samples.abs().max() > 0.1  # not collapsed to the origin


def test_the_sigma_to_zero_end_is_finite_and_exact_above_the_floor():
    model = tiny_model(6).double()
    basis = random_orthonormal_map(2, 6, 1)
    model.set_subspace(basis)
    on_subspace = torch.randn(4, 2, dtype=torch.float64) @ basis.T
    off = on_subspace + torch.randn(4, 6, dtype=torch.float64) * 0.1
    for x in (on_subspace, off):
        velocity = model(x, 0.0).sample
        assert torch.isfinite(velocity).all()
    perp = off - (off @ basis) @ basis.T
    tangent = model(on_subspace, 0.0).sample
    torch.testing.assert_close(model(on_subspace + 0 * perp, 0.0).sample, tangent)  # zero orthogonal head there
    # above the floor the orthogonal head is exactly (I - B B^T) x / sigma, at every sigma the scheduler evaluates
    sigma = 1e-3
    velocity = model(off, sigma * 1000).sample
    tangent = model(off - perp, sigma * 1000).sample
    torch.testing.assert_close(velocity - tangent, perp / sigma)
    tau_model = tiny_model(6, orthogonal_noise_std=0.3).double()
    coefficient = tau_model.orthogonal_coefficient(torch.tensor([0.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(coefficient, torch.tensor([-1.0, 1.0], dtype=torch.float64), atol=2e-3, rtol=0)


def test_fit_subspace_is_uncentred_pca():
    manifold = make_manifold("ring_mixture", 20, seed=4)
    x = manifold.sample(50, 0)
    model = tiny_model(20)
    fit = model.fit_subspace(x.float())
    assert principal_angle(model.basis, manifold.basis) < 1e-3
    assert fit.explained_fraction > 1 - 1e-6 and fit.residual_std < 1e-5
    assert model.config.orthogonal_noise_std == 0.0
    # uncentred: a subspace through 0 fits points offset from the origin along it (a centred PCA would tilt)
    shifted = x + manifold.basis[:, 0] * 5.0
    model.fit_subspace(shifted)
    assert principal_angle(model.basis, manifold.basis) < 1e-6
    torch.testing.assert_close(model.basis.T @ model.basis, torch.eye(2), atol=1e-6, rtol=0)
    noisy = make_manifold("ring_mixture", 20, noise_std=0.05, seed=4).sample(4000, 1)
    fit = model.fit_subspace(noisy, estimate_noise=True)
    assert (
        abs(model.config.orthogonal_noise_std - 0.05) < 0.005 and fit.residual_std == model.config.orthogonal_noise_std
    )
    # the swiss roll spans R^3: 3 uncentred principal directions hold all of it
    roll = make_manifold("swiss_roll", 10, seed=2)
    model3 = tiny_model(10, latent_dim=3)
    assert model3.fit_subspace(roll.sample(200, 0)).explained_fraction > 1 - 1e-9
    assert principal_angle(model3.basis, roll.basis) < 1e-6


def test_bad_input_is_refused_before_any_work():
    with pytest.raises(ValueError, match="latent_dim"):
        ManifoldFlowTransformerModel(ambient_dim=4, latent_dim=4)
    with pytest.raises(ValueError, match="latent_dim"):
        ManifoldFlowTransformerModel(ambient_dim=4, latent_dim=6)
    with pytest.raises(ValueError, match="orthogonal_noise_std"):
        ManifoldFlowTransformerModel(orthogonal_noise_std=-1.0)
    model = tiny_model(6)
    with pytest.raises(
        ValueError, match=r"`subspace` must be a tensor of shape \(ambient_dim, latent_dim\) = \(6, 2\)"
    ):
        model.set_subspace(torch.eye(5, 2))
    with pytest.raises(ValueError, match="orthonormal"):
        model.set_subspace(2 * torch.eye(6, 2))
    with pytest.raises(ValueError, match=r"`x` must be a tensor of shape \(\.\.\., 6\)"):
        model.fit_subspace(torch.randn(10, 5))
    with pytest.raises(ValueError, match="latent_dim"):
        model.fit_subspace(torch.randn(10, 6), latent_dim=3)
    with pytest.raises(ValueError, match="latent_dim"):
        model.fit_subspace(torch.randn(10, 6), latent_dim=6)
    with pytest.raises(ValueError, match="`sample`"):
        model(torch.randn(3, 7), 500.0)
    with pytest.raises(ValueError, match="`timestep`"):
        model(torch.randn(3, 6), torch.ones(4))
    before = model.subspace.clone()
    with pytest.raises(ValueError):
        model.fit_subspace(torch.full((10, 6), float("nan")))
    assert torch.equal(model.subspace, before)  # nothing half-done


def test_save_load_round_trip_keeps_the_subspace(tmp_path):
    for learn in (False, True):
        model = tiny_model(9, learn_subspace=learn, orthogonal_noise_std=0.1)
        model.fit_subspace(make_manifold("ring_mixture", 9, seed=5).sample(30, 0).float())
        folder = tmp_path / f"learn_{learn}"
        model.save_pretrained(folder)
        loaded = ManifoldFlowTransformerModel.from_pretrained(folder)
        assert isinstance(loaded.subspace, torch.nn.Parameter) == learn
        torch.testing.assert_close(loaded.basis, model.basis)
        assert loaded.config.orthogonal_noise_std == 0.1
        x = torch.randn(4, 9)
        out = loaded(x, 300.0)
        assert isinstance(out, ManifoldFlowTransformerOutput)
        torch.testing.assert_close(out.sample, model(x, 300.0).sample)
    loaded = ManifoldFlowTransformerModel.from_pretrained(tmp_path / "learn_False", torch_dtype=torch.float64)
    assert loaded.dtype == torch.float64 and loaded.subspace.dtype == torch.float64


def test_a_learned_subspace_stays_orthonormal_and_finds_the_data():
    manifold = make_manifold("ring_mixture", 6, seed=3)
    data = manifold.sample(256, 0).float()
    model = tiny_model(6, learn_subspace=True, hidden_size=16)
    assert principal_angle(model.basis.detach(), manifold.basis) > 0.5
    train_velocity_model(model, data, steps=200, learning_rate=1e-2, batch_size=128, seed=0)
    basis = model.basis.detach()
    torch.testing.assert_close(basis.T @ basis, torch.eye(2), atol=1e-5, rtol=0)
    assert principal_angle(basis, manifold.basis) < 0.05


def test_training_the_tangent_head_moves_samples_toward_the_data():
    manifold = make_manifold("ring_mixture", 16, seed=0, num_components=1, radius=2.0, component_std=0.3)
    data = manifold.sample(512, 0).float()
    model = tiny_model(16, hidden_size=16)
    model.fit_subspace(data)
    train_velocity_model(model, data, steps=150, learning_rate=5e-3, batch_size=128, seed=0)
    samples = pipe_of(model)(batch_size=400, num_inference_steps=10, generator=torch.Generator().manual_seed(0))
    coordinates = samples.samples.double() @ manifold.basis
    assert (coordinates.mean(0) - torch.tensor([2.0, 0.0], dtype=torch.float64)).norm() < 0.3
    assert off_manifold_rms(samples.samples, manifold.basis) < 1e-4
    assert math.isclose(float(coordinates.std(0).mean()), 0.3, rel_tol=0.5)
