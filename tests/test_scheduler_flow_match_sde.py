import math

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from diffusers_ext import FlowMatchSDEScheduler
from diffusers_ext.testing import SchedulerConformanceTests


class TestFlowMatchSDEConformance(SchedulerConformanceTests):
    scheduler_class = FlowMatchSDEScheduler
    scheduler_config = {"shift": 3.0, "noise_level": 0.7}
    sample_shaped_outputs = ("prev_sample", "prev_sample_mean")


class TestFlowMatchSDECPSConformance(SchedulerConformanceTests):
    scheduler_class = FlowMatchSDEScheduler
    scheduler_config = {"shift": 3.0, "noise_level": 0.5, "sde_type": "cps", "sde_window": (2, 6)}
    sample_shaped_outputs = ("prev_sample", "prev_sample_mean")


def _run(scheduler, steps=6, seed=0, **step_kwargs):
    scheduler.set_timesteps(steps)
    sample = torch.randn(2, 4, 4, 4, generator=torch.Generator().manual_seed(seed))
    generator = torch.Generator().manual_seed(seed + 1)
    outputs = []
    for t in scheduler.timesteps:
        velocity = 0.5 * sample - 0.2
        out = scheduler.step(velocity, t, sample, generator=generator, **step_kwargs)
        outputs.append(out)
        sample = out.prev_sample
    return sample, outputs


@pytest.mark.parametrize("sde_type", ["sde", "cps"])
def test_noise_level_zero_is_the_euler_ode_step(sde_type):
    ours, outputs = _run(FlowMatchSDEScheduler(shift=3.0, noise_level=0.0, sde_type=sde_type))
    euler, _ = _run(FlowMatchEulerDiscreteScheduler(shift=3.0))
    torch.testing.assert_close(ours, euler, rtol=0, atol=1e-6)
    assert all(o.log_prob is None and not o.std_dev.any() for o in outputs)


def test_from_config_of_an_euler_scheduler_keeps_its_schedule():
    euler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=False)
    sde = FlowMatchSDEScheduler.from_config(euler.config)
    euler.set_timesteps(8)
    sde.set_timesteps(8)
    torch.testing.assert_close(sde.sigmas, euler.sigmas)
    assert sde.config.noise_level == 0.7 and sde.config.sde_type == "sde"


@pytest.mark.parametrize("sde_type", ["sde", "cps"])
def test_log_prob_matches_a_direct_gaussian_density(sde_type):
    scheduler = FlowMatchSDEScheduler(shift=3.0, noise_level=0.6, sde_type=sde_type)
    scheduler.set_timesteps(5)
    sample = torch.randn(3, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    velocity = torch.randn(3, 2, 4, 4, generator=torch.Generator().manual_seed(1))
    scheduler._step_index = 2
    out = scheduler.step(velocity, scheduler.timesteps[2], sample, generator=torch.Generator().manual_seed(2))
    normal = torch.distributions.Normal(out.prev_sample_mean.double(), out.std_dev[0].double())
    direct = normal.log_prob(out.prev_sample.double()).flatten(1).mean(1)
    torch.testing.assert_close(out.log_prob.double(), direct, rtol=1e-6, atol=1e-6)
    assert (out.std_dev > 0).all()


def test_sde_transition_matches_the_formula_by_hand():
    scheduler = FlowMatchSDEScheduler(noise_level=0.7)
    scheduler.set_timesteps(4)
    sigma, sigma_next = float(scheduler.sigmas[1]), float(scheduler.sigmas[2])
    x, v = torch.tensor([[0.3, -1.2]]), torch.tensor([[0.5, 0.1]])
    mean, std = scheduler.transition(v, x, 1)
    dt = sigma_next - sigma
    sigma_t = 0.7 * math.sqrt(sigma / (1 - sigma))
    expected = x * (1 + sigma_t**2 / (2 * sigma) * dt) + v * (1 + sigma_t**2 * (1 - sigma) / (2 * sigma)) * dt
    torch.testing.assert_close(mean, expected)
    assert float(std) == pytest.approx(sigma_t * math.sqrt(-dt), rel=1e-6)


def test_scoring_a_stored_sample_draws_no_noise_and_reproduces_the_log_prob():
    scheduler = FlowMatchSDEScheduler(noise_level=0.7)
    _, first = _run(scheduler, seed=3)
    scheduler.set_timesteps(6)
    sample = torch.randn(2, 4, 4, 4, generator=torch.Generator().manual_seed(3))
    for t, stored in zip(scheduler.timesteps, first):
        rescored = scheduler.step(0.5 * sample - 0.2, t, sample, prev_sample=stored.prev_sample)
        torch.testing.assert_close(rescored.log_prob, stored.log_prob)
        sample = stored.prev_sample


def test_window_limits_the_stochastic_steps():
    _, outputs = _run(FlowMatchSDEScheduler(noise_level=0.7, sde_window=(1, 3)))
    assert [o.log_prob is not None for o in outputs] == [False, True, True, False, False, False]


def test_sde_sampling_keeps_the_marginal_of_a_gaussian_target():
    # Data x0 ~ N(0, 1) and noise N(0, 1): the exact velocity is v(x, s) = x * (2s - 1) / (s^2 + (1 - s)^2) ... at
    # every s the marginal is N(0, (1 - s)^2 + s^2). Many SDE samples must end with variance ~1.
    scheduler = FlowMatchSDEScheduler(noise_level=0.7)
    scheduler.set_timesteps(40)
    x = torch.randn(20000, 1, generator=torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(1)
    for i, t in enumerate(scheduler.timesteps):
        s = float(scheduler.sigmas[i])
        velocity = x * (2 * s - 1) / (s**2 + (1 - s) ** 2) if s < 1 else x
        x = scheduler.step(velocity, t, x, generator=generator).prev_sample
    assert float(x.var()) == pytest.approx(1.0, abs=0.08)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"sde_type": "ode"}, "sde_type"),
        ({"noise_level": -0.1}, "noise_level"),
        ({"sde_type": "cps", "noise_level": 1.5}, "noise_level"),
        ({"sde_window": (3, 1)}, "sde_window"),
        ({"stochastic_sampling": True}, "stochastic_sampling"),
    ],
)
def test_bad_configuration(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FlowMatchSDEScheduler(**kwargs)


def test_integer_timestep_is_rejected():
    scheduler = FlowMatchSDEScheduler()
    scheduler.set_timesteps(4)
    with pytest.raises(ValueError, match="timestep"):
        scheduler.step(torch.zeros(1, 2), 0, torch.zeros(1, 2))


def test_compatible_both_ways_and_sde_window_stays_a_tuple(tmp_path):
    from diffusers_ext import compatible_schedulers

    assert FlowMatchSDEScheduler in compatible_schedulers(FlowMatchEulerDiscreteScheduler)
    assert FlowMatchSDEScheduler in compatible_schedulers(FlowMatchEulerDiscreteScheduler(shift=3.0))
    assert set(FlowMatchSDEScheduler().compatibles) >= {FlowMatchSDEScheduler, FlowMatchEulerDiscreteScheduler}
    swapped = FlowMatchSDEScheduler.from_config(FlowMatchEulerDiscreteScheduler(shift=3.0).config, sde_window=[1, 4])
    assert swapped.config.shift == 3.0 and swapped.config.sde_window == (1, 4)
    swapped.save_pretrained(tmp_path)
    assert FlowMatchSDEScheduler.from_pretrained(tmp_path).config.sde_window == (1, 4)
    with pytest.raises(TypeError, match="scheduler"):
        compatible_schedulers("FlowMatchEulerDiscreteScheduler")
