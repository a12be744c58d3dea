"""The lrRNN simulators and ground truths (diffusers_ext.data.lrrnn), their attractors, and the ridge read-out."""

import math

import pytest
import torch

from diffusers_ext import ridge_readout
from diffusers_ext.data.lrrnn import GROUND_TRUTHS, initial_state_grid, make_ground_truth, simulate_latents
from diffusers_ext.evaluation.connectivity import (
    attractor_summary,
    limit_cycle_summary,
    reproduces_attractor,
    ring_summary,
    stable_fixed_points,
)
from diffusers_ext.metrics import mmd_squared, sliced_wasserstein


@pytest.mark.parametrize("name", GROUND_TRUTHS)
def test_ground_truths_are_seeded_and_max_entropy(name):
    truth = make_ground_truth(name)
    m, n = truth.sample_loadings(4000, 3)
    again, _ = truth.sample_loadings(4000, 3)
    assert torch.equal(m, again) and not torch.equal(m, truth.sample_loadings(4000, 4)[0])
    residual = n - truth.conditional_mean(m)
    assert residual.mean(0).abs().max() < 0.06 and (residual.std(0) - 1).abs().max() < 0.05


def test_quadstable_has_four_stable_fixed_points():
    net = make_ground_truth("quadstable").network(1000, 0)
    points = stable_fixed_points(net)
    assert points.shape == (4, 2)
    assert ((points.norm(dim=-1) - 1.87).abs() < 0.2).all()
    assert (net.velocity(points).norm(dim=-1) < 1e-6).all()


@pytest.mark.parametrize("name", ["limit_cycle", "heavy_tailed_limit_cycle"])
def test_limit_cycles(name):
    net = make_ground_truth(name).network(1000, 0)
    summary = limit_cycle_summary(net)
    assert summary["moving_fraction"] == 1.0 and summary["radial_cv"] < 0.05
    assert 55 < summary["period"] < 80 and summary["radius"] > 0.5
    assert stable_fixed_points(net).shape[0] == 0  # nothing settles: the origin is an unstable spiral


def test_heavy_tailed_loadings_are_heavy_tailed():
    m, _ = make_ground_truth("heavy_tailed_limit_cycle").sample_loadings(20000, 0)
    kurtosis = (m[:, 0] ** 4).mean() / (m[:, 0] ** 2).mean() ** 2
    assert kurtosis > 6  # a Gaussian's is 3


def test_ring_attractor():
    net = make_ground_truth("ring").network(1000, 0)
    summary = ring_summary(net)
    assert summary["coverage"] >= 0.75 and summary["radial_cv"] < 0.05 and 1.2 < summary["radius"] < 1.5
    assert reproduces_attractor("ring", summary, summary)


def test_simulate_batches_networks_like_single_runs():
    truth = make_ground_truth("ring")
    nets = [truth.network(50, s) for s in (0, 1)]
    starts = initial_state_grid(3, 1.0)
    batch = simulate_latents(
        torch.stack([n.input_loadings for n in nets]), torch.stack([n.output_loadings for n in nets]), starts, 7
    )
    assert batch.shape == (2, 9, 8, 2)
    for i, net in enumerate(nets):
        torch.testing.assert_close(batch[i], net.simulate(starts, 7))
    with pytest.raises(ValueError, match="initial_states"):
        simulate_latents(nets[0].input_loadings, nets[0].output_loadings, torch.zeros(3, 3), 2)


def test_reproduces_attractor_rejects_a_wrong_count():
    reference = attractor_summary("fixed_points", make_ground_truth("quadstable").network(1000, 0))
    assert reproduces_attractor("fixed_points", reference, reference)
    assert not reproduces_attractor("fixed_points", {"fixed_points": reference["fixed_points"][:3]}, reference)


def test_ridge_readout_fits_the_dynamics_and_keeps_the_prior_elsewhere():
    net = make_ground_truth("limit_cycle").network(300, 0)
    states, next_states = net.transitions(initial_state_grid(8, 2.4), 40)
    readout = ridge_readout(net.input_loadings, states, next_states, alpha=0.1, num_samples=50)
    assert readout.residual_rms < 2e-3  # next - (1 - alpha) z has std ~0.1
    resampled = type(net)(net.input_loadings, readout.samples[0], net.alpha)
    assert reproduces_attractor("limit_cycle", limit_cycle_summary(resampled), limit_cycle_summary(net))
    # the unconstrained directions keep the prior variance 1 / lam (a few are identified)
    variance = readout.samples.var(0).mean()
    assert 0.9 < float(variance) < 1.01
    with pytest.raises(ValueError, match="noise_std"):
        ridge_readout(net.input_loadings, states, next_states, noise_std=0.0)


@pytest.mark.parametrize("bias", [False, True])
def test_ridge_mean_is_the_reference_closed_form(bias):
    """Parity with AllenInstitute/connector@eac77f7 (train.py, stage B): `N_hat = N solve(X^T X + reg I, X^T Y) /
    alpha` with `reg = regularizer N^2 / alpha^2`. Our posterior mean is that solution with `regularizer = lam *
    noise_std^2` (the reference folds the noise level into its regulariser)."""
    net = make_ground_truth("quadstable").network(200, 3)
    states, next_states = net.transitions(initial_state_grid(6, 2.4), 30)
    loadings = net.input_loadings.double()
    if bias:
        loadings = torch.cat([loadings, 0.3 * torch.randn(len(loadings), 1, dtype=torch.float64)], -1)
    alpha, lam, noise_std = net.alpha, 2.0, 0.05
    ours = ridge_readout(loadings, states, next_states, alpha=alpha, lam=lam, noise_std=noise_std).mean
    n = loadings.shape[0]
    z, z_next = states.double(), next_states.double()
    x = torch.tanh(z @ loadings[:, :2].T + (loadings[:, 2] if bias else 0.0))
    y = z_next + (alpha - 1) * z
    regularizer = lam * noise_std**2
    reference = n * torch.linalg.solve(x.T @ x + regularizer * n**2 / alpha**2 * torch.eye(n, dtype=x.dtype), x.T @ y)
    torch.testing.assert_close(ours, reference / alpha, rtol=1e-7, atol=1e-9)


def test_sample_distances_separate_distributions():
    g = torch.Generator().manual_seed(0)
    a, b, c = torch.randn(500, 2, generator=g), torch.randn(500, 2, generator=g), torch.randn(500, 2, generator=g) + 1
    assert abs(mmd_squared(a, b, 1.0)) < 0.01 < mmd_squared(a, c, 1.0)
    w_same = sliced_wasserstein(a, b, generator=torch.Generator().manual_seed(0))
    w_far = sliced_wasserstein(a, c, generator=torch.Generator().manual_seed(0))
    assert w_same < 0.2 and abs(w_far - 1.0) < 0.2 and not math.isnan(w_far)
