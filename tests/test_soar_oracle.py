"""The Markov-chain oracle: exact marginals (checked by enumeration) and, on it, search beating greedy."""

import itertools

import torch

from diffusers_ext import DiffusionLMPipeline, SOARScheduler
from diffusers_ext.evaluation.soar import MarkovChainOracleLM


def test_marginals_match_enumeration():
    oracle = MarkovChainOracleLM.random(num_chains=2, num_states=3, seed=0)
    mask = oracle.config.mask_token_id
    x = torch.tensor([[oracle.chain_token(torch.tensor(1)), mask, 2, mask, mask]])
    logits = oracle(x).logits
    chain = 1
    weights = torch.zeros(4, 3, dtype=torch.float64)
    for states in itertools.product(range(3), repeat=4):
        if states[1] != 2:
            continue
        p = oracle.initial[chain, states[0]]
        for a, b in zip(states, states[1:]):
            p = p * oracle.transitions[chain, a, b]
        for i, s in enumerate(states):
            weights[i, s] += p
    expected = weights / weights.sum(-1, keepdim=True)
    actual = logits[0, 1:, :3].double().softmax(-1)
    torch.testing.assert_close(actual[[0, 2, 3]], expected[[0, 2, 3]], atol=1e-6, rtol=0)
    assert actual[1].argmax() == 2


def test_viterbi_is_the_best_completion():
    oracle = MarkovChainOracleLM.random(num_chains=1, num_states=3, seed=1)
    x = torch.tensor([[3] + [oracle.config.mask_token_id] * 4])
    best = oracle.viterbi(x)
    brute = max(
        (torch.tensor([[3, *states]]) for states in itertools.product(range(3), repeat=4)),
        key=lambda s: float(oracle.joint_log_likelihood(s)),
    )
    assert torch.equal(best, brute)


def test_search_beats_greedy_on_the_oracle():
    oracle = MarkovChainOracleLM.random(num_chains=40, num_states=6, seed=0)
    mask = oracle.config.mask_token_id
    initial_states = torch.multinomial(oracle.initial.float(), 1, generator=torch.Generator().manual_seed(0))
    prompts = torch.cat([oracle.chain_token(torch.arange(40)).unsqueeze(1), initial_states], dim=1)
    kwargs = {"input_ids": prompts, "gen_length": 10, "num_inference_steps": 10, "eos_early_stop": False}
    loglik = {}
    for name, scheduler in {
        "greedy": SOARScheduler(block_length=10),
        "pbs": SOARScheduler(block_length=10, max_beam_size=3),
    }.items():
        pipe = DiffusionLMPipeline(oracle, scheduler)
        pipe.set_progress_bar_config(disable=True)
        out = pipe(**kwargs, output_type="seq")
        assert not (out.sequences == mask).any()
        loglik[name] = oracle.joint_log_likelihood(torch.cat([prompts, out.sequences], 1)).mean().item()
    assert loglik["pbs"] > loglik["greedy"]
