"""Perplexity bounds of discrete flows: upper bounds on the exact NLL where that NLL is known, losses, couplings."""

import itertools

import pytest
import torch

from diffusers_ext import DiscreteFlowMatchingScheduler, DiscreteFlowTransformerModel
from diffusers_ext.data.random_hmm import RandomHMM
from diffusers_ext.evaluation.discrete_flow import HMMJudge, exact_nll_bounds
from diffusers_ext.losses.discrete_flow import discrete_flow_loss, estimate_nll_bounds
from diffusers_ext.losses.discrete_flow_couplings import couple, coupling_cost


SOURCES = [("mask", None), ("multimask", 2), ("uniform", None)]


@pytest.mark.parametrize("source,num_mask_tokens", SOURCES)
def test_bounds_are_upper_bounds_on_the_exact_nll_of_every_sequence(source, num_mask_tokens):
    # A flow whose model is the exact posterior of a known HMM generates that HMM, so its NLL is known exactly.
    # Data HMM ("oracle") and a different Markov chain (a misspecified model): every one of the 27 sequences.
    scheduler = DiscreteFlowMatchingScheduler(vocab_size=3, source=source, num_mask_tokens=num_mask_tokens)
    x1 = torch.tensor(list(itertools.product(range(3), repeat=3)))
    models = [
        RandomHMM.random(3, 3, 3, seed=1, transition_concentration=0.5, emission_concentration=0.5),
        RandomHMM.random_markov_chain(3, 3, seed=7, concentration=0.3),
    ]
    for hmm in models:
        judge = HMMJudge(hmm)
        nll = -judge.log_prob(x1)
        bounds = exact_nll_bounds(judge.denoiser(scheduler), scheduler, x1, num_nodes=24)
        assert (bounds["kl"] >= nll - 1e-9).all(), (bounds["kl"] - nll).min()
        assert (bounds["entropy"] >= bounds["kl"] - 1e-9).all()
        if source == "uniform":
            assert (bounds["kl"] - nll).min() > 0.1  # the uniform path's conditional paths are not the model's
        else:
            # masked paths: with the exact denoiser the bound is tight (the any-order chain rule)
            assert torch.allclose(bounds["kl"], nll, atol=1e-9) and torch.allclose(bounds["entropy"], nll, atol=1e-9)


def test_a_wrong_rate_would_break_the_bound():
    # the check above can fail: halving the jump rate turns the masked bound into half the NLL
    scheduler = DiscreteFlowMatchingScheduler(vocab_size=3, source="mask")
    judge = HMMJudge(RandomHMM.random(3, 3, 3, seed=1))
    x1 = torch.tensor([[0, 1, 2], [2, 2, 1]])
    scheduler.jump_rate = lambda t, rate=scheduler.jump_rate: rate(t) / 2
    bounds = exact_nll_bounds(judge.denoiser(scheduler), scheduler, x1, num_nodes=8)
    assert (bounds["kl"] < -judge.log_prob(x1) - 0.1).all()


@pytest.mark.parametrize("source,num_mask_tokens", SOURCES)
def test_monte_carlo_estimate_matches_the_exact_bound(source, num_mask_tokens):
    scheduler = DiscreteFlowMatchingScheduler(vocab_size=3, source=source, num_mask_tokens=num_mask_tokens)
    torch.manual_seed(0)
    model = DiscreteFlowTransformerModel(
        vocab_size=3,
        num_embeddings=scheduler.num_embeddings,
        sequence_length=3,
        hidden_size=16,
        num_layers=1,
        num_heads=2,
    ).eval()
    x1 = torch.tensor([[0, 1, 2]])
    exact = exact_nll_bounds(model, scheduler, x1, num_nodes=32)
    many = x1.expand(2000, 3)
    estimate = estimate_nll_bounds(model, scheduler, many, num_samples=4, generator=torch.Generator().manual_seed(0))
    for kind in ("kl", "entropy"):
        mean = estimate[kind]["mean"].mean()
        stderr = estimate[kind]["mean"].std() / 2000**0.5
        assert abs(mean - exact[kind][0]) < 4 * stderr + 1e-3, (kind, float(mean), float(exact[kind][0]))


@pytest.mark.parametrize("loss_type", ["cross_entropy", "kl", "entropy"])
@pytest.mark.parametrize("coupling", ["independent", "hamming_ot", "embedding_ot"])
def test_losses_are_finite_and_train(loss_type, coupling):
    scheduler = DiscreteFlowMatchingScheduler(vocab_size=4, source="multimask", num_mask_tokens=3)
    torch.manual_seed(0)
    model = DiscreteFlowTransformerModel(
        vocab_size=4, num_embeddings=7, sequence_length=6, hidden_size=16, num_layers=1, num_heads=2
    )
    x1 = torch.randint(0, 4, (16, 6), generator=torch.Generator().manual_seed(0))
    loss = discrete_flow_loss(model, scheduler, x1, loss_type, coupling, torch.Generator().manual_seed(0))
    assert loss.ndim == 0 and torch.isfinite(loss) and loss > 0
    loss.backward()
    assert all(p.grad is not None for p in model.head.parameters())


def test_ot_couplings_permute_sources_and_lower_the_cost():
    g = torch.Generator().manual_seed(0)
    x0 = torch.randint(0, 4, (32, 10), generator=g)
    x1 = torch.randint(0, 4, (32, 10), generator=g)
    paired = couple(x0, x1, "hamming_ot")
    assert sorted(map(tuple, paired.tolist())) == sorted(map(tuple, x0.tolist()))
    independent_cost = (x0 != x1).sum()
    ot_cost = (paired != x1).sum()
    assert ot_cost < independent_cost
    # optimal: no single swap of two pairs lowers the cost
    cost = coupling_cost(paired, x1, "hamming_ot")
    diag = cost.diagonal()
    assert ((diag[:, None] + diag[None, :]) <= (cost + cost.T) + 1e-6).all()
    weight = torch.randn(4, 3, generator=g)
    emb = coupling_cost(x0[:3], x1[:2].repeat(2, 1)[:3], "embedding_ot", weight)
    brute = ((weight[x0[:3]][None] - weight[x1[:2].repeat(2, 1)[:3]][:, None]) ** 2).sum((-1, -2))
    assert torch.allclose(emb, brute, atol=1e-4)
    with pytest.raises(ValueError, match="coupling"):
        couple(x0, x1, "sinkhorn")
