"""`FlowMatchSDEScheduler` and the GRPO loss against the Flow-GRPO (`"sde"`) and Flow-CPS (`"cps"`) reference code.

The reference's outputs on fixed inputs are stored in `fixtures/flow_grpo.json` with the references' commits
(regenerate with `regenerate_flow_grpo.py`). Agreement is <= 1e-6 in float32 for the step's mean, standard deviation,
drawn sample, log-probability (`"sde"`), clipped loss and KL term. One deliberate difference: Flow-CPS's log-probability
drops the Gaussian's constants and its `1 / (2 std^2)` factor (`-mean((x - mean)^2)`), while the scheduler returns the
exact Gaussian log-density for both types; the test checks the exact affine relation between the two.
"""

import math

import pytest
import torch
from parity_utils import load_fixture
from regenerate_flow_grpo import build_inputs

from diffusers_ext import FlowMatchSDEScheduler
from diffusers_ext.trainers.diffusion_grpo_trainer import clipped_policy_loss


FIXTURE = load_fixture("flow_grpo")
CONFIG = FIXTURE["config"]
TOLERANCE = {"rtol": 1e-6, "atol": 1e-6}


def _scheduler(sde_type: str) -> FlowMatchSDEScheduler:
    scheduler = FlowMatchSDEScheduler(shift=CONFIG["shift"], noise_level=CONFIG["noise_level"], sde_type=sde_type)
    scheduler.set_timesteps(CONFIG["num_inference_steps"])
    return scheduler


def _tensor(values, like=None):
    tensor = torch.tensor(values, dtype=torch.float32)
    return tensor.view_as(like) if like is not None else tensor


def _cases():
    for sde_type in ("sde", "cps"):
        for record in FIXTURE[sde_type]["steps"]:
            yield pytest.param(sde_type, record, id=f"{sde_type}-step{record['step_index']}")


def test_fixture_names_the_reference_commits():
    assert FIXTURE["sde"]["reference"] == "yifan123/flow_grpo" and len(FIXTURE["sde"]["commit"]) == 40
    assert FIXTURE["cps"]["reference"] == "IamCreateAI/FlowCPS" and len(FIXTURE["cps"]["commit"]) == 40
    assert [r["step_index"] for r in FIXTURE["sde"]["steps"]] == list(range(CONFIG["num_inference_steps"]))


@pytest.mark.parametrize("sde_type, record", list(_cases()))
def test_step_matches_reference(sde_type, record):
    i = record["step_index"]
    inputs = build_inputs(i)
    scheduler = _scheduler(sde_type)
    sigma, sigma_next = scheduler.sigmas[i].item(), scheduler.sigmas[i + 1].item()

    mean, std = scheduler.transition(inputs["velocity"], inputs["sample"], i)
    torch.testing.assert_close(mean, _tensor(record["prev_sample_mean"], mean), **TOLERANCE)
    reference_std = _tensor(record["std_dev_t"])
    # Flow-GRPO reports the SDE's noise scale sigma_t, whose transition std is sigma_t * sqrt(sigma - sigma_next);
    # Flow-CPS reports the transition std itself.
    expected_std = reference_std * math.sqrt(sigma - sigma_next) if sde_type == "sde" else reference_std
    torch.testing.assert_close(std.expand_as(expected_std), expected_std, **TOLERANCE)

    generator = torch.Generator().manual_seed(int(inputs["noise_seed"]))
    drawn = scheduler.step(inputs["velocity"], scheduler.timesteps[i], inputs["sample"], generator=generator)
    torch.testing.assert_close(drawn.prev_sample, _tensor(record["drawn_prev_sample"], mean), **TOLERANCE)

    ours = {}
    for key, velocity in (("log_prob", inputs["velocity"]), ("old_log_prob", inputs["old_velocity"])):
        step_mean, step_std = scheduler.transition(velocity, inputs["sample"], i)
        if step_std > 0:
            ours[key] = scheduler.gaussian_log_prob(inputs["stored_prev_sample"], step_mean, step_std)
    if sde_type == "sde":
        for key in ("log_prob", "old_log_prob"):
            torch.testing.assert_close(ours[key], _tensor(record[key]), **TOLERANCE)
        torch.testing.assert_close(drawn.log_prob, _tensor(record["drawn_log_prob"]), **TOLERANCE)
    elif std > 0:
        # Exact Gaussian log-density = reference / (2 std^2) - log(std) - log(2 pi) / 2.
        for key in ("log_prob", "old_log_prob"):
            exact = _tensor(record[key]) / (2 * std**2) - torch.log(std) - 0.5 * math.log(2 * math.pi)
            torch.testing.assert_close(ours[key], exact, rtol=1e-5, atol=1e-5)

    reference_mean, _ = scheduler.transition(inputs["reference_velocity"], inputs["sample"], i)
    kl = scheduler.kl_penalty(mean, reference_mean, i).mean()
    for clip_range, losses in record["losses"].items():
        torch.testing.assert_close(kl, torch.tensor(losses["kl"]), **TOLERANCE)
        # The clipped loss on the reference's own log-probabilities, so that both types check the loss formula.
        ratio = torch.exp(_tensor(record["log_prob"]) - _tensor(record["old_log_prob"]))
        low, high = 1 - float(clip_range), 1 + float(clip_range)
        loss = clipped_policy_loss(ratio, inputs["advantages"], low, high)
        torch.testing.assert_close(loss, torch.tensor(losses["policy_loss"]), **TOLERANCE)


def test_kl_penalty_rejects_a_deterministic_step():
    scheduler = FlowMatchSDEScheduler(shift=3.0, noise_level=0.7, sde_window=(0, 2))
    scheduler.set_timesteps(4)
    latents = torch.zeros(1, 4, 2, 2)
    with pytest.raises(ValueError, match="step_index"):
        scheduler.kl_penalty(latents, latents, 3)
