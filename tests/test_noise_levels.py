"""The shared noise levels and prediction conversions of `pipelines/pipeline_utils.py`, which every method reads."""

import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler, EulerDiscreteScheduler, FlowMatchEulerDiscreteScheduler

from diffusers_ext.pipelines.doob_guidance.guidance import NoiseLevels as DoobNoiseLevels
from diffusers_ext.pipelines.pipeline_utils import (
    PREDICTION_TYPES,
    NoiseLevels,
    alpha_bar_at,
    ddim_move,
    is_flow_matching,
    prediction_to_epsilon,
    timestep_index,
    vp_coefficients,
)


class RenamedFlowScheduler(FlowMatchEulerDiscreteScheduler):
    """A flow-matching scheduler whose own name says nothing about flow matching."""


def _vp(prediction_type="epsilon"):
    return DDPMScheduler(num_train_timesteps=1000, prediction_type=prediction_type)


def test_a_renamed_flow_matching_subclass_is_flow_matching_everywhere():
    scheduler = RenamedFlowScheduler(num_train_timesteps=1000)
    assert is_flow_matching(scheduler) and not is_flow_matching(DDIMScheduler())
    assert NoiseLevels(scheduler).kind == "flow" and DoobNoiseLevels(scheduler).kind == "flow"
    assert NoiseLevels(scheduler).prediction_type == "flow"
    with pytest.raises(TypeError, match="`scheduler` must have"):
        NoiseLevels(object())


def test_vp_coefficients_are_the_square_roots_of_the_level_and_its_complement():
    assert vp_coefficients(0.36) == (0.6, 0.8)
    alpha_bar = torch.tensor([0.25, 0.64], dtype=torch.float64)
    signal, noise = vp_coefficients(alpha_bar)
    torch.testing.assert_close(signal, torch.tensor([0.5, 0.8], dtype=torch.float64))
    torch.testing.assert_close(signal**2 + noise**2, torch.ones(2, dtype=torch.float64))


def test_coefficients_read_alphas_cumprod_at_the_nearest_timestep():
    scheduler = _vp()
    levels = NoiseLevels(scheduler)
    signal, noise = levels.coefficients(torch.tensor([10.4, 500.0, 2000.0]))
    expected = scheduler.alphas_cumprod.double()[[10, 500, 999]]
    torch.testing.assert_close(signal, expected.sqrt())
    torch.testing.assert_close(noise, (1 - expected).sqrt())
    torch.testing.assert_close(alpha_bar_at(scheduler.alphas_cumprod, 10.6), scheduler.alphas_cumprod[11])
    signal, noise = levels.coefficients(7, batch_size=3, dtype=torch.float32)
    assert signal.shape == noise.shape == (3,) and signal.dtype == torch.float32
    signal, noise = levels.coefficients(None, batch_size=2)
    assert signal.tolist() == [1.0, 1.0] and noise.tolist() == [0.0, 0.0]


def test_flow_matching_coefficients_read_sigmas_on_the_schedule_and_timestep_over_T_between():
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    scheduler.set_timesteps(5)
    levels = NoiseLevels(scheduler)
    signal, noise = levels.coefficients(scheduler.timesteps[2], dtype=torch.float32)
    assert noise == scheduler.sigmas[2] and signal == 1 - scheduler.sigmas[2]
    assert levels.coefficients(scheduler.timesteps[2], step_index=2, dtype=torch.float32)[1] == scheduler.sigmas[2]
    signal, noise = levels.coefficients(torch.tensor([250.0]))
    torch.testing.assert_close(noise, torch.tensor([0.25], dtype=torch.float64))
    assert timestep_index(scheduler, scheduler.timesteps[3]) == 3
    with pytest.raises(ValueError, match="not in `scheduler.timesteps`"):
        timestep_index(scheduler, 123.0)


@pytest.mark.parametrize("prediction_type", ["epsilon", "v_prediction", "sample", "flow"])
def test_split_and_merge_are_inverse_and_recover_the_noisy_sample(prediction_type):
    scheduler = FlowMatchEulerDiscreteScheduler() if prediction_type == "flow" else _vp(prediction_type)
    levels = NoiseLevels(scheduler)
    generator = torch.Generator().manual_seed(0)
    sample, output = torch.randn(2, 3, generator=generator), torch.randn(2, 3, generator=generator)
    signal, noise = levels.coefficients(torch.tensor(scheduler.timesteps[300].item()), dtype=torch.float32)
    eps, x0 = levels.split(output, sample, signal, noise)
    torch.testing.assert_close(signal * x0 + noise * eps, sample)
    torch.testing.assert_close(levels.merge(eps, x0, signal, noise), output)


def test_epsilon_from_a_prediction_refuses_types_outside_the_supported_ones():
    sample = torch.ones(2)
    with pytest.raises(ValueError, match="a noise estimate needs `prediction_type`"):
        prediction_to_epsilon(sample, sample, 0.6, 0.8, "sample")
    torch.testing.assert_close(prediction_to_epsilon(sample, sample, 0.6, 0.8, "sample", PREDICTION_TYPES), sample / 2)


def test_ddim_move_is_ddim_sampling_between_any_two_levels():
    scheduler = DDIMScheduler(num_train_timesteps=1000, clip_sample=False, set_alpha_to_one=False)
    scheduler.set_timesteps(10)
    t, previous = scheduler.timesteps[2], scheduler.timesteps[3]
    generator = torch.Generator().manual_seed(0)
    sample, eps = torch.randn(2, 4, generator=generator), torch.randn(2, 4, generator=generator)
    expected = scheduler.step(eps, t, sample, eta=0.0).prev_sample
    moved = ddim_move(sample, eps, scheduler.alphas_cumprod[t], scheduler.alphas_cumprod[previous])
    torch.testing.assert_close(moved, expected)
    back = ddim_move(moved, eps, scheduler.alphas_cumprod[previous], scheduler.alphas_cumprod[t])
    torch.testing.assert_close(back, sample)


def test_euler_timesteps_are_rounded_to_the_nearest_training_step():
    scheduler = EulerDiscreteScheduler(num_train_timesteps=1000)
    scheduler.set_timesteps(7)
    t = scheduler.timesteps[1]
    assert t != t.round()  # "linspace" spacing: a timestep between two training steps
    signal, _ = NoiseLevels(scheduler).coefficients(t, dtype=torch.float32)
    assert signal == scheduler.alphas_cumprod[int(t.round())].sqrt()
