"""DiscreteFlowMatchingScheduler: the conformance suite, the path, the Euler sampler's limit and bad configs."""

import itertools

import pytest
import torch

from diffusers_ext import DiscreteFlowMatchingScheduler
from diffusers_ext.data.random_hmm import RandomHMM
from diffusers_ext.evaluation.discrete_flow import HMMJudge
from diffusers_ext.testing import SchedulerConformanceTests


class TestDiscreteFlowMatchingSchedulerConformance(SchedulerConformanceTests):
    scheduler_class = DiscreteFlowMatchingScheduler
    scheduler_config = {"vocab_size": 5, "source": "multimask", "num_mask_tokens": 3}
    sample_shape = (2, 6)
    sample_shaped_outputs = ("prev_sample", "pred_original_sample", "jumped")

    def get_sample(self, seed: int = 0) -> torch.Tensor:
        return self.get_scheduler().sample_source(self.sample_shape, torch.Generator().manual_seed(seed))

    def model_output(self, scaled_sample, timestep):
        g = torch.Generator().manual_seed(int(float(timestep) * 1000))
        return 2 * torch.randn(*scaled_sample.shape, 5, generator=g)

    def test_denoising_loop_ends_on_data_tokens(self):
        outputs = self.run_denoising_loop()
        assert outputs[-1].prev_sample.max() < 5


@pytest.mark.parametrize("source,num_mask_tokens", [("mask", None), ("multimask", 4), ("uniform", None)])
def test_add_noise_keeps_data_with_probability_kappa(source, num_mask_tokens):
    scheduler = DiscreteFlowMatchingScheduler(
        vocab_size=6, source=source, num_mask_tokens=num_mask_tokens, kappa_exponent=2.0
    )
    g = torch.Generator().manual_seed(0)
    x1 = torch.randint(0, 6, (4000, 8), generator=g)
    x0 = scheduler.sample_source(x1.shape, g)
    t = torch.full((4000,), 0.6)
    x_t = scheduler.add_noise(x1, x0, t, generator=g)
    expected = 0.36 + (0.64 / 6 if source == "uniform" else 0.0)  # uniform sources hit x1 by chance too
    assert abs((x_t == x1).float().mean() - expected) < 0.01
    assert ((x_t == x1) | (x_t == x0)).all()  # every position is on the path between x0 and x1
    if source != "uniform":
        assert x0.min() >= 6 and x0.max() < 6 + scheduler.num_mask_tokens


@pytest.mark.parametrize("source", ["mask", "uniform"])
def test_many_euler_steps_with_the_exact_denoiser_sample_the_data_distribution(source):
    # A flow whose model is the exact posterior of a known HMM generates that HMM; 64 Euler steps come close.
    import numpy as np

    sticky = np.array([[0.9, 0.1], [0.15, 0.85]])  # strongly correlated neighbours
    hmm = RandomHMM(np.array([0.5, 0.5]), sticky, np.eye(2), 3)
    judge = HMMJudge(hmm)
    scheduler = DiscreteFlowMatchingScheduler(vocab_size=2, source=source)
    model = judge.denoiser(scheduler)
    g = torch.Generator().manual_seed(0)
    x = scheduler.sample_source((6000, 3), g)
    scheduler.set_timesteps(64)
    for t in scheduler.timesteps:
        x = scheduler.step(model(x, t).logits, t, x, generator=g).prev_sample
    space = torch.tensor(list(itertools.product(range(2), repeat=3)))
    truth = judge.log_prob(space).exp()
    empirical = torch.stack([(x == row).all(-1).double().mean() for row in space])
    assert 0.5 * (truth - empirical).abs().sum() < 0.03
    # one step samples every position independently: visibly off the joint distribution
    x = scheduler.sample_source((6000, 3), g)
    scheduler.set_timesteps(1)
    x = scheduler.step(model(x, 0.0).logits, 0.0, x, generator=g).prev_sample
    one_step = torch.stack([(x == row).all(-1).double().mean() for row in space])
    assert 0.5 * (truth - one_step).abs().sum() > 0.2


def test_list_of_generators_reproduces_single_rows():
    scheduler = DiscreteFlowMatchingScheduler(vocab_size=4, source="uniform")
    scheduler.set_timesteps(3)
    logits = torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(0))
    sample = torch.randint(0, 4, (2, 5), generator=torch.Generator().manual_seed(1))
    both = scheduler.step(logits, 0.0, sample, generator=[torch.Generator().manual_seed(s) for s in (7, 8)])
    for row, seed in enumerate((7, 8)):
        scheduler.set_timesteps(3)
        single = scheduler.step(
            logits[row : row + 1], 0.0, sample[row : row + 1], generator=torch.Generator().manual_seed(seed)
        )
        assert torch.equal(single.prev_sample[0], both.prev_sample[row])


def test_masked_denoiser_keeps_revealed_tokens():
    scheduler = DiscreteFlowMatchingScheduler(vocab_size=3, source="multimask", num_mask_tokens=2)
    sample = torch.tensor([[0, 3, 2, 4]])
    log_probs = scheduler.denoiser_log_probs(torch.randn(1, 4, 3), sample, 0.5)
    assert torch.equal(log_probs[0, 0].exp(), torch.tensor([1.0, 0.0, 0.0]))
    assert torch.equal(log_probs[0, 2].exp(), torch.tensor([0.0, 0.0, 1.0]))
    assert torch.allclose(log_probs.exp().sum(-1), torch.ones(1, 4))


@pytest.mark.parametrize(
    "kwargs,argument",
    [
        ({"source": "absorbing"}, "source"),
        ({"source": "multimask"}, "num_mask_tokens"),
        ({"source": "multimask", "num_mask_tokens": 1}, "num_mask_tokens"),
        ({"source": "mask", "num_mask_tokens": 2}, "num_mask_tokens"),
        ({"source": "uniform", "num_mask_tokens": 1}, "num_mask_tokens"),
        ({"vocab_size": 1}, "vocab_size"),
        ({"kappa_exponent": 0.0}, "kappa_exponent"),
    ],
)
def test_bad_config_names_the_argument(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        DiscreteFlowMatchingScheduler(**kwargs)


def test_step_rejects_bad_logits_and_unknown_timestep():
    scheduler = DiscreteFlowMatchingScheduler(vocab_size=3, source="mask")
    scheduler.set_timesteps(4)
    sample = torch.full((1, 4), 3)
    with pytest.raises(ValueError, match="model_output"):
        scheduler.step(torch.randn(1, 4, 5), 0.0, sample)
    with pytest.raises(ValueError, match="timestep"):
        scheduler.step(torch.randn(1, 4, 3), 0.3, sample)
