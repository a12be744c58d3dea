"""The exact judge of flow matching on a Gaussian-mixture manifold (`evaluation.manifold_flow`): the structured
closed form against the plain D-dim mixture formula, the oracle's sampling, and the judges' zeros."""

import pytest
import torch

from diffusers_ext.data.manifolds import make_manifold, random_orthonormal_map
from diffusers_ext.evaluation.manifold_flow import (
    GaussianMixtureVelocityModel,
    PlainFlowTransformerModel,
    manifold_sliced_wasserstein,
    model_velocity_fn,
    off_manifold_rms,
    sample_latent_flow,
    sample_pipeline,
    velocity_errors,
    velocity_errors_along,
)
from diffusers_ext.losses.manifold_flow import manifold_flow_loss


def dense_velocity(weights, means, covariances, y, sigma):
    """`E[eps - x | y]` for a Gaussian mixture in R^D with full `(K, D, D)` covariances, written out directly."""
    s = sigma.reshape(-1, 1)
    d = means.shape[1]
    eye = torch.eye(d, dtype=torch.float64)
    cov = (1 - s).reshape(-1, 1, 1, 1) ** 2 * covariances + s.reshape(-1, 1, 1, 1) ** 2 * eye
    centred = y.unsqueeze(1) - (1 - s).unsqueeze(1) * means
    density = torch.distributions.MultivariateNormal(torch.zeros(d, dtype=torch.float64), covariance_matrix=cov)
    resp = torch.softmax(weights.log() + density.log_prob(centred), dim=-1)
    solved = torch.linalg.solve(cov, centred.unsqueeze(-1))
    x0 = (resp.unsqueeze(-1) * (means + (1 - s).unsqueeze(1) * (covariances @ solved).squeeze(-1))).sum(1)
    return (y - x0) / s


@pytest.mark.parametrize("noise_std", [0.0, 0.15])
def test_closed_form_matches_the_dense_mixture_formula(noise_std):
    generator = torch.Generator().manual_seed(0)
    basis = random_orthonormal_map(2, 6, 1)
    weights = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    means = torch.randn(3, 2, generator=generator, dtype=torch.float64) * 2
    factors = torch.randn(3, 2, 2, generator=generator, dtype=torch.float64) * 0.4
    covariances = factors @ factors.transpose(1, 2) + 0.05 * torch.eye(2, dtype=torch.float64)
    oracle = GaussianMixtureVelocityModel.from_mixture(weights, means, covariances, basis, noise_std)
    dense_cov = basis @ covariances @ basis.T + noise_std**2 * torch.eye(6, dtype=torch.float64)
    y = torch.randn(40, 6, generator=generator, dtype=torch.float64) * 1.5
    sigma = torch.rand(40, generator=generator, dtype=torch.float64) * 0.98 + 0.01
    expected = dense_velocity(weights, means @ basis.T, dense_cov, y, sigma)
    torch.testing.assert_close(oracle.velocity(y, sigma), expected, rtol=1e-7, atol=1e-8)
    # as a model: timestep = sigma * 1000, the pipeline's call
    torch.testing.assert_close(oracle(y, sigma * 1000).sample, expected, rtol=1e-7, atol=1e-8)


def test_the_oracle_minimises_the_flow_matching_loss():
    manifold = make_manifold("ring_mixture", 5, seed=0)
    oracle = GaussianMixtureVelocityModel.from_manifold(manifold)
    data = oracle.sample_data(20000, torch.Generator().manual_seed(1))

    class Scaled(torch.nn.Module):
        config = oracle.config

        def __init__(self, factor):
            super().__init__()
            self.factor = factor

        def forward(self, sample, timestep):
            out = oracle(sample, timestep)
            out.sample = out.sample * self.factor
            return out

    losses = [float(manifold_flow_loss(Scaled(f), data, torch.Generator().manual_seed(2))) for f in (1.0, 0.9, 1.1)]
    assert losses[0] < min(losses[1:])


def test_oracle_samples_match_fresh_draws_on_the_manifold():
    manifold = make_manifold("ring_mixture", 10, seed=2)
    oracle = GaussianMixtureVelocityModel.from_manifold(manifold)
    noise = torch.randn(4000, 10, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    samples = sample_pipeline(oracle, noise, 50)
    reference = oracle.sample_data(4000, torch.Generator().manual_seed(1))
    other = oracle.sample_data(4000, torch.Generator().manual_seed(2))
    floor = manifold_sliced_wasserstein(other, reference, manifold.basis)
    assert manifold_sliced_wasserstein(samples, reference, manifold.basis) < 1.5 * floor
    assert off_manifold_rms(samples, manifold.basis) < 1e-6
    shrunk = reference * 0.8
    assert manifold_sliced_wasserstein(shrunk, reference, manifold.basis) > 3 * floor


def test_judges_score_the_truth_zero():
    manifold = make_manifold("ring_mixture", 8, seed=3)
    oracle = GaussianMixtureVelocityModel.from_manifold(manifold)
    errors = velocity_errors(model_velocity_fn(oracle), oracle, 512, torch.Generator().manual_seed(0))
    assert errors["total"] < 1e-20 and errors["along"] < 1e-20
    basis = manifold.basis

    def latent_oracle(w, sigma):  # the true velocity along the subspace is a function of B^T y only
        return oracle.velocity(w @ basis.T, sigma) @ basis

    along = velocity_errors_along(latent_oracle, basis, oracle, 512, torch.Generator().manual_seed(0))
    assert along["along"] < 1e-20
    zero = velocity_errors(lambda y, s: torch.zeros_like(y), oracle, 512, torch.Generator().manual_seed(0))
    assert zero["total"] > 1 and zero["orthogonal"] > 0 and zero["total_se"] > 0
    # the same generator seed gives the same triples, so methods are judged on the same points (paired)
    again = velocity_errors(lambda y, s: torch.zeros_like(y), oracle, 512, torch.Generator().manual_seed(0))
    assert again == zero
    points = manifold.sample(100, 0)
    assert off_manifold_rms(points, basis) < 1e-12
    noisy = make_manifold("ring_mixture", 8, noise_std=0.2, seed=3).sample(4000, 0)
    assert abs(off_manifold_rms(noisy, basis) - 0.2 * 6**0.5) < 0.02


def test_latent_flow_is_mapped_back_and_paired_with_the_ambient_noise():
    torch.manual_seed(0)
    flow = PlainFlowTransformerModel(ambient_dim=2, num_tokens=2, hidden_size=8, num_layers=1, time_embedding_dim=8)
    basis = random_orthonormal_map(2, 9, 0)
    noise = torch.randn(5, 9, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    samples = sample_latent_flow(flow, basis, noise, 3)
    assert samples.shape == (5, 9) and off_manifold_rms(samples, basis) < 1e-6
    direct = sample_pipeline(flow, (noise @ basis).float(), 3)
    torch.testing.assert_close(samples @ basis, direct, atol=1e-6, rtol=0)


def test_oracle_arguments_are_checked():
    basis = random_orthonormal_map(2, 4, 0)
    eye = torch.eye(2, dtype=torch.float64).expand(2, 2, 2)
    with pytest.raises(ValueError, match="weights"):
        GaussianMixtureVelocityModel.from_mixture([0.5, 0.6], torch.zeros(2, 2), eye, basis)
    with pytest.raises(ValueError, match="covariances"):
        GaussianMixtureVelocityModel.from_mixture([0.5, 0.5], torch.zeros(2, 2), torch.eye(3).expand(2, 3, 3), basis)
    with pytest.raises(ValueError, match="orthonormal"):
        GaussianMixtureVelocityModel.from_mixture([0.5, 0.5], torch.zeros(2, 2), eye, basis * 2)
    with pytest.raises(ValueError, match="Gaussian-mixture"):
        GaussianMixtureVelocityModel.from_manifold(make_manifold("swiss_roll", 4))
