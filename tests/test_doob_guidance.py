"""DoobGuidance on closed-form cases: Gaussian data, where h_t and grad log h_t are analytic."""

import math

import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler, FlowMatchEulerDiscreteScheduler

from diffusers_ext.pipelines.doob_guidance.guidance import DoobGuidance, NoiseLevels, guided_sample


MU, STD = 0.0, 1.0  # data: N(MU, STD^2) in every coordinate
W = torch.tensor([1.0, 0.0])  # constraint direction
THRESHOLD = 1.0  # hard constraint: w . x0 >= THRESHOLD


class GaussianModel:
    """The exact model of Gaussian data in the scheduler's parameterisation, counting calls."""

    def __init__(self, scheduler):
        self.levels = NoiseLevels(scheduler)
        self.calls = 0

    def posterior(self, x, t):
        a, b = self.levels.coefficients(t, x.shape[0], x.device)
        a, b = a.view(-1, 1).float(), b.view(-1, 1).float()
        gain = a * STD**2 / (a**2 * STD**2 + b**2)
        return a, b, MU + gain * (x - a * MU)

    def __call__(self, x, t):
        self.calls += x.shape[0]
        a, b, x0 = self.posterior(x, t)
        eps = (x - a * x0) / b.clamp_min(1e-8)
        return self.levels.merge(eps, x0, a.view(-1).double(), b.view(-1).double()).to(x.dtype)


def exact_hard_gradient(model, x, t):
    """grad_x log P(w . X0 >= THRESHOLD | X_t = x) for the Gaussian posterior."""
    a, b, mean = model.posterior(x, t)
    var = STD**2 * b**2 / (a**2 * STD**2 + b**2)
    z = ((mean @ W) - THRESHOLD) / (W.norm() * var.view(-1).sqrt())
    normal = torch.distributions.Normal(0.0, 1.0)
    ratio = normal.log_prob(z).exp() / normal.cdf(z)
    gain = (a * STD**2 / (a**2 * STD**2 + b**2)).view(-1)
    return (ratio * gain / (W.norm() * var.view(-1).sqrt())).view(-1, 1) * W


def satisfied(x0):
    return x0 @ W >= THRESHOLD


def linear_cost(x0):
    return x0 @ W


def hinge(x0):
    return torch.relu(THRESHOLD - x0 @ W)


def ddpm():
    return DDPMScheduler(num_train_timesteps=1000, clip_sample=False)


def flow():
    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000)


@pytest.mark.parametrize("make", [ddpm, flow], ids=["ddpm", "flow"])
def test_split_merge_round_trip_and_zero_guidance_is_identity(make):
    scheduler = make()
    levels = NoiseLevels(scheduler)
    x = torch.randn(4, 2)
    out = torch.randn(4, 2)
    a, b = levels.coefficients(torch.tensor(400.0), 4, "cpu")
    eps, x0 = levels.split(out, x, a, b)
    assert torch.allclose(levels.merge(eps, x0, a, b), out, atol=1e-5)
    assert torch.allclose(a.view(-1, 1).float() * x0 + b.view(-1, 1).float() * eps, x, atol=1e-5)


@pytest.mark.parametrize("make", [ddpm, flow], ids=["ddpm", "flow"])
def test_tweedie_is_exact_for_a_linear_soft_cost(make):
    # h_t(x) = E[exp(-lam w.x0) | x] = exp(-lam w.m(x) + const): grad log h = -lam * gain * w, which DPS recovers.
    scheduler = make()
    scheduler.set_timesteps(10)
    model = GaussianModel(scheduler)
    lam = 2.0
    guidance = DoobGuidance(cost=linear_cost, temperature=1 / lam, estimator="tweedie")
    x = torch.randn(5, 2)
    t = scheduler.timesteps[3]
    levels = NoiseLevels(scheduler)
    a, b = levels.coefficients(t, 5, "cpu")
    with torch.enable_grad():
        xg = x.clone().requires_grad_(True)
        x0 = levels.split(model(xg, t.expand(5)), xg, a, b)[1]
    grad, _ = guidance.estimate(model, levels, x, t, x0.detach(), x0_graph=(xg, x0))
    gain = float(a[0] * STD**2 / (a[0] ** 2 * STD**2 + b[0] ** 2))
    assert torch.allclose(grad, (-lam * gain * W).expand(5, 2), atol=1e-5)


@pytest.mark.parametrize("make", [ddpm, flow], ids=["ddpm", "flow"])
@pytest.mark.parametrize("estimator", ["mc", "path_integral"])
@pytest.mark.parametrize("prior", ["std", "covariance"])
def test_rollout_estimators_match_the_exact_hard_gradient(make, estimator, prior):
    scheduler = make()
    scheduler.set_timesteps(10)
    model = GaussianModel(scheduler)
    levels = NoiseLevels(scheduler)
    # the covariance path (eigenbasis sampling and whitening) with a rotated basis of the same isotropic prior
    covariance = {"data_covariance": STD**2 * torch.eye(2)} if prior == "covariance" else {"data_std": STD}
    guidance = DoobGuidance(constraint=satisfied, estimator=estimator, num_rollouts=40000, **covariance)
    x = torch.tensor([[0.3, -0.2], [-0.5, 0.4]])
    t = scheduler.timesteps[4]
    a, b = levels.coefficients(t, 2, "cpu")
    with torch.enable_grad():
        xg = x.clone().requires_grad_(True)
        x0 = levels.split(model(xg, t.expand(2)), xg, a, b)[1]
    generator = torch.Generator().manual_seed(0)
    grad, used = guidance.estimate(model, levels, x, t, x0.detach(), x0_graph=(xg, x0), generator=generator)
    exact = exact_hard_gradient(model, x, t)
    assert used == (2 if estimator == "path_integral" else 0)  # one jump: no extra forwards; PI: one backward
    assert torch.allclose(grad[:, 0], exact[:, 0], rtol=0.05), (grad, exact)
    assert grad[:, 1].abs().max() < 0.05 * exact[:, 0].abs().min()


@pytest.mark.parametrize("make", [ddpm, lambda: DDIMScheduler(num_train_timesteps=1000, clip_sample=False), flow])
def test_guided_loop_satisfies_the_constraint_and_the_bound_holds(make):
    # Base P(X0_1 >= 1) = 0.159; the exact-model h-transform makes it 1.
    scheduler = make()
    model = GaussianModel(scheduler)
    generator = torch.Generator().manual_seed(0)
    base = guided_sample(model, scheduler, (512, 2), 20, generator=generator)
    base_rate = satisfied(base).float().mean().item()
    assert abs(base_rate - 0.159) < 0.05
    guidance = DoobGuidance(
        constraint=satisfied, cost=hinge, estimator="mc", num_rollouts=16, compute_bound=True, reference_rollouts=64
    )
    guided = guided_sample(model, scheduler, (512, 2), 20, guidance=guidance, generator=generator)
    rate = satisfied(guided).float().mean().item()
    bound = guidance.satisfaction_lower_bound()
    assert rate > 0.8 and rate > base_rate + 0.5
    assert 0.0 <= bound <= rate, (bound, rate)
    assert guidance.kl_estimate > 0
    assert guidance.num_model_evaluations == 20 * 512  # one jump: the rollouts need no extra forward
    assert guidance.num_reference_evaluations == 0


def test_multi_step_rollouts_count_their_forwards():
    scheduler = ddpm()
    model = GaussianModel(scheduler)
    guidance = DoobGuidance(constraint=satisfied, estimator="mc", num_rollouts=4, rollout_steps=3)
    guided_sample(model, scheduler, (8, 2), 5, guidance=guidance, generator=torch.Generator().manual_seed(0))
    # t = 800, 600, 400, 200: every rollout takes 2 extra forwards; at t = 0 the rollout is a single jump
    assert guidance.num_model_evaluations == 5 * 8 + 4 * 8 * 4 * 2
    assert model.calls == guidance.num_model_evaluations


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="`constraint` \\(hard\\) or `cost`"):
        DoobGuidance()
    with pytest.raises(ValueError, match="`estimator` must be one of"):
        DoobGuidance(constraint=satisfied, estimator="dps")
    with pytest.raises(ValueError, match="needs `cost`"):
        DoobGuidance(constraint=satisfied, estimator="tweedie")
    with pytest.raises(ValueError, match="`temperature` must be a positive number"):
        DoobGuidance(cost=hinge, temperature=0)
    with pytest.raises(ValueError, match="`num_rollouts` must be a positive int"):
        DoobGuidance(cost=hinge, num_rollouts=0)
    with pytest.raises(TypeError, match="`constraint` must be a callable"):
        DoobGuidance(constraint=3)
    with pytest.raises(ValueError, match="`data_covariance` must be a square"):
        DoobGuidance(cost=hinge, data_covariance=torch.ones(3))
    with pytest.raises(TypeError, match="`scheduler` must have"):
        NoiseLevels(object())


def test_soft_constraint_has_no_probability_bound():
    scheduler = ddpm()
    model = GaussianModel(scheduler)
    guidance = DoobGuidance(cost=hinge, estimator="mc", num_rollouts=4, compute_bound=True, reference_rollouts=8)
    guided_sample(model, scheduler, (8, 2), 4, guidance=guidance, generator=torch.Generator().manual_seed(0))
    assert guidance.kl_estimate is not None and math.isfinite(guidance.kl_estimate)
    assert guidance.satisfaction_lower_bound() is None
