"""SOARScheduler: the diffusers scheduler contract, config errors, and the commit rules on hand-built logits."""

import math

import pytest
import torch

from diffusers_ext import SOARScheduler, SOARSchedulerOutput
from diffusers_ext.testing import SchedulerConformanceTests


M = 9  # mask token of the hand-built examples
V = 10


def logits_from(table: list[tuple[int, float]]) -> torch.Tensor:
    """Logits of shape (1, len(table), V): at position i, token table[i][0] has probability table[i][1] and the
    other V - 1 tokens share the rest equally."""
    rows = []
    for token, p in table:
        probs = torch.full((V,), (1 - p) / (V - 1), dtype=torch.float64)
        probs[token] = p
        rows.append(probs.log())
    return torch.stack(rows).float().unsqueeze(0)


def masked(length: int, prefix=()) -> torch.Tensor:
    x = torch.full((1, length), M)
    x[0, : len(prefix)] = torch.tensor(prefix, dtype=torch.long)
    return x


class TestSOARSchedulerConformance(SchedulerConformanceTests):
    scheduler_class = SOARScheduler
    # one beam keeps the number of rows fixed, as the suite feeds `prev_sample` back without beam bookkeeping
    scheduler_config = {"block_length": 12, "confidence_threshold": 0.5, "max_parallel_tokens": 3}
    sample_shape = (2, 12)
    step_kwargs = {"mask_token_id": 31}
    sample_shaped_outputs = ("prev_sample", "transfer_index", "sampled_tokens", "sampled_probs", "confidence")

    def get_sample(self, seed: int = 0) -> torch.Tensor:
        return torch.full(self.sample_shape, 31, dtype=torch.long)

    def model_output(self, scaled_sample, timestep):
        # deterministic, position-dependent logits over a vocabulary of 32 that never propose the mask token
        g = torch.Generator().manual_seed(int(float(timestep) * 1000))
        logits = 3 * torch.randn(*scaled_sample.shape, 32, generator=g)
        logits[..., 31] = -1e4
        return logits

    def test_denoising_loop_leaves_no_mask(self):
        outputs = self.run_denoising_loop()
        assert not (outputs[-1].prev_sample == 31).any()


def test_threshold_the_measure_cannot_reach_is_a_config_error():
    with pytest.raises(ValueError, match="confidence_threshold"):
        SOARScheduler(confidence_threshold=1.5, confidence_measure="prob")
    with pytest.raises(ValueError, match="confidence_threshold"):
        SOARScheduler(confidence_threshold=1.01, confidence_measure="margin")
    with pytest.raises(ValueError, match="negative entropy"):
        SOARScheduler(confidence_threshold=0.9, confidence_measure="neg_entropy")
    with pytest.raises(ValueError, match="confidence_threshold"):
        SOARScheduler(confidence_threshold=float("nan"))
    # the test is strict (`confidence > tau`, as in the references): the maximum itself can never be passed
    with pytest.raises(ValueError, match="confidence_threshold"):
        SOARScheduler(confidence_threshold=1.0, confidence_measure="prob")
    SOARScheduler(confidence_threshold=0.999, confidence_measure="prob")
    SOARScheduler(confidence_threshold=-0.3, confidence_measure="neg_entropy")


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"confidence_measure": "logit"}, "confidence_measure"),
        ({"score": "max"}, "score"),
        ({"transfer_schedule": "cosine"}, "transfer_schedule"),
        ({"max_beam_size": 0}, "max_beam_size"),
        ({"min_parallel_tokens": 0}, "min_parallel_tokens"),
        ({"min_parallel_tokens": 3, "max_parallel_tokens": 2}, "max_parallel_tokens"),
        ({"block_length": 0}, "block_length"),
    ],
)
def test_bad_config_raises(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        SOARScheduler(**kwargs)


def test_step_needs_a_known_timestep_and_mask_token():
    scheduler = SOARScheduler()
    scheduler.set_timesteps(4)
    logits = logits_from([(0, 0.5)] * 4)
    with pytest.raises(ValueError, match="mask_token_id"):
        scheduler.step(logits, scheduler.timesteps[0], masked(4))
    with pytest.raises(ValueError, match="timestep"):
        scheduler.step(logits, 0.123, masked(4), mask_token_id=M)


@pytest.mark.parametrize("n, steps", [(8, 4), (7, 3), (3, 5), (32, 32), (13, 4)])
def test_uniform_quota_equals_llada_split(n, steps):
    # LLaDA: n // steps tokens per step, one more in the first n % steps steps.
    expected = [n // steps + (1 if i < n % steps else 0) for i in range(steps)]
    scheduler = SOARScheduler()
    scheduler.set_timesteps(steps)
    remaining, quotas = n, []
    for t in scheduler.timesteps:
        quota = int(scheduler.num_transfer_tokens(torch.tensor([remaining]), t))
        quotas.append(quota)
        remaining -= quota
    assert quotas == expected


def test_linear_quota_follows_dream_times():
    steps, eps, n = 5, 1e-3, 16
    times = torch.linspace(1, eps, steps + 1)
    scheduler = SOARScheduler(transfer_schedule="linear", final_eps=eps)
    scheduler.set_timesteps(steps)
    remaining = n
    for i, t in enumerate(scheduler.timesteps):
        quota = int(scheduler.num_transfer_tokens(torch.tensor([remaining]), t))
        expected = remaining if i == steps - 1 else int(remaining * (1 - times[i + 1] / times[i]))
        assert quota == expected
        remaining -= quota
    assert remaining == 0


def test_low_confidence_commits_the_quota_most_confident_and_breaks_ties_by_position():
    scheduler = SOARScheduler()
    scheduler.set_timesteps(2)  # 4 masks, 2 steps -> quota 2
    logits = logits_from([(0, 0.3), (1, 0.6), (2, 0.6), (3, 0.6)])
    out = scheduler.step(logits, scheduler.timesteps[0], masked(4), mask_token_id=M)
    assert isinstance(out, SOARSchedulerOutput)
    # three positions tie at 0.6: the two lowest positions win
    assert out.prev_sample.tolist() == [[M, 1, 2, M]]
    assert out.transfer_index.tolist() == [[False, True, True, False]]
    assert out.beam_lengths.tolist() == [2]
    assert out.beam_scores.item() == pytest.approx(1.2, abs=1e-6)


def test_committed_positions_are_never_changed_and_transfer_mask_limits_the_block():
    scheduler = SOARScheduler()
    scheduler.set_timesteps(1)
    x = torch.tensor([[5, M, M, M]])
    logits = logits_from([(0, 0.99), (1, 0.5), (2, 0.5), (3, 0.99)])
    block = torch.tensor([[False, True, True, False]])
    out = scheduler.step(logits, scheduler.timesteps[0], x, mask_token_id=M, transfer_mask=block)
    # last step of the block: every masked position inside the block, nothing outside
    assert out.prev_sample.tolist() == [[5, 1, 2, M]]


def test_fast_dllm_threshold_commits_top1_and_everything_above_tau():
    logits = logits_from([(0, 0.5), (1, 0.2), (2, 0.7), (3, 0.49), (4, 0.9)])
    tau = float(logits.softmax(-1)[0, 0, 0])  # exactly the confidence at position 0
    scheduler = SOARScheduler(confidence_threshold=tau)
    scheduler.set_timesteps(8)  # quota 1
    x = masked(5)
    out = scheduler.step(logits, 1.0, x, mask_token_id=M)
    # the test is strict like the references' (`confidence > tau`): a confidence equal to tau does not count
    assert out.prev_sample.tolist() == [[M, M, 2, M, 4]]
    below = SOARScheduler(confidence_threshold=tau - 1e-6)
    below.set_timesteps(8)
    out = below.step(logits, 1.0, x, mask_token_id=M)
    assert out.prev_sample.tolist() == [[0, M, 2, M, 4]]
    assert out.accelerated.tolist() == [True]
    out = scheduler.step(logits_from([(0, 0.3), (1, 0.2), (2, 0.4), (3, 0.1), (4, 0.1)]), 1.0, x, mask_token_id=M)
    assert out.prev_sample.tolist() == [[M, M, 2, M, M]]  # nothing confident: the top-1 only
    assert out.accelerated.tolist() == [False]


def test_threshold_with_a_larger_quota_needs_as_many_confident_positions():
    # LLaDA2 / BlockRefinement rule: with a quota of 2, one confident position is not enough to accelerate
    scheduler = SOARScheduler(confidence_threshold=0.8)
    scheduler.set_timesteps(2)  # 4 masks -> quota 2
    out = scheduler.step(logits_from([(0, 0.9), (1, 0.5), (2, 0.6), (3, 0.1)]), 1.0, masked(4), mask_token_id=M)
    assert out.prev_sample.tolist() == [[0, M, 2, M]]
    assert out.accelerated.tolist() == [False]


def test_accelerate_is_capped_by_max_parallel_tokens():
    scheduler = SOARScheduler(confidence_threshold=0.8, max_parallel_tokens=2, max_beam_size=2)
    scheduler.set_timesteps(8)
    logits = logits_from([(0, 0.85), (1, 0.95), (2, 0.9), (3, 0.1)])
    out = scheduler.step(logits, 1.0, masked(4), mask_token_id=M)
    assert out.prev_sample.tolist() == [[M, 1, 2, M]]
    assert out.accelerated.tolist() == [True]
    assert len(out.prev_sample) == 1


def test_min_parallel_tokens_gates_acceleration():
    scheduler = SOARScheduler(confidence_threshold=0.8, min_parallel_tokens=2, max_beam_size=2)
    scheduler.set_timesteps(8)
    logits = logits_from([(0, 0.85), (1, 0.5), (2, 0.4), (3, 0.1)])
    out = scheduler.step(logits, 1.0, masked(4), mask_token_id=M)
    # one confident position < min_parallel_tokens: search, two children
    assert out.accelerated.tolist() == [False, False]
    assert out.prev_sample.tolist() == [[0, M, M, M], [M, 1, M, M]]


def test_search_expands_top_positions_and_ranks_children_across_beams():
    scheduler = SOARScheduler(max_beam_size=2)
    scheduler.set_timesteps(8)
    x = torch.cat([masked(3, prefix=(7,)), masked(3, prefix=(8,))])
    logits = torch.cat(
        [
            logits_from([(7, 0.9), (1, 0.3), (2, 0.2)]),
            logits_from([(8, 0.9), (4, 0.6), (5, 0.5)]),
        ]
    )
    scores = torch.tensor([1.0, 0.5], dtype=torch.float64)
    out = scheduler.step(logits, 1.0, x, mask_token_id=M, beam_scores=scores, beam_groups=torch.tensor([0, 0]))
    # candidates: row0 -> 1.3, 1.2; row1 -> 1.1, 1.0: the two best come from row 0
    assert out.parent_index.tolist() == [0, 0]
    assert out.prev_sample.tolist() == [[7, 1, M], [7, M, 2]]
    assert out.beam_scores.tolist() == pytest.approx([1.3, 1.2])
    assert out.beam_groups.tolist() == [0, 0]


def test_duplicate_sequences_are_dropped():
    scheduler = SOARScheduler(max_beam_size=2)
    scheduler.set_timesteps(8)
    # both beams hold the same tokens in different orders of commitment: their children coincide
    x = torch.tensor([[3, M, M], [3, M, M]])
    logits = torch.cat([logits_from([(3, 0.9), (1, 0.6), (2, 0.5)])] * 2)
    out = scheduler.step(logits, 1.0, x, mask_token_id=M, beam_groups=torch.tensor([0, 0]))
    assert out.prev_sample.tolist() == [[3, 1, M], [3, M, 2]]
    assert out.parent_index.tolist() == [0, 0]


def test_beam_collapses_when_any_beam_of_the_prompt_accelerates():
    scheduler = SOARScheduler(max_beam_size=2, confidence_threshold=0.9)
    scheduler.set_timesteps(8)
    x = torch.tensor([[M, M, M], [M, M, M], [M, M, M]])
    logits = torch.cat(
        [
            logits_from([(0, 0.3), (1, 0.2), (2, 0.1)]),  # group 0, beam 0: search
            logits_from([(0, 0.95), (1, 0.2), (2, 0.1)]),  # group 0, beam 1: accelerates
            logits_from([(0, 0.3), (1, 0.2), (2, 0.1)]),  # group 1: search, keeps two beams
        ]
    )
    scores = torch.tensor([2.0, 0.0, 0.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 1])
    out = scheduler.step(logits, 1.0, x, mask_token_id=M, beam_scores=scores, beam_groups=groups)
    # group 0 collapses to its best child (a search child of beam 0, score 2.3), group 1 keeps two
    assert out.beam_groups.tolist() == [0, 1, 1]
    assert out.parent_index.tolist() == [0, 2, 2]
    assert out.prev_sample[0].tolist() == [0, M, M]


@pytest.mark.parametrize("rule", ["sum", "mean", "logprob"])
def test_score_rules(rule):
    scheduler = SOARScheduler(max_beam_size=2, score=rule)
    scheduler.set_timesteps(8)
    x = torch.tensor([[5, M, M], [6, M, M]])  # different prefixes: no child duplicates another
    logits = torch.cat([logits_from([(5, 0.9), (0, 0.5), (1, 0.4)]), logits_from([(6, 0.9), (0, 0.45), (1, 0.1)])])
    scores = torch.tensor([0.2, 0.5], dtype=torch.float64)
    lengths = torch.tensor([1, 3])
    groups = torch.tensor([0, 0])
    out = scheduler.step(logits, 1.0, x, mask_token_id=M, beam_scores=scores, beam_lengths=lengths, beam_groups=groups)
    sums = {"sum": [0.7, 0.6, 0.95, 0.6], "mean": [0.7, 0.6, 0.95, 0.6]}
    if rule == "logprob":
        sums = {"logprob": [0.2 + math.log(0.5), 0.2 + math.log(0.4), 0.5 + math.log(0.45), 0.5 + math.log(0.1)]}
    candidates = sums[rule]
    key = candidates if rule != "mean" else [c / n for c, n in zip(candidates, [2, 2, 4, 4])]
    best_two = sorted(range(4), key=lambda i: -key[i])[:2]
    assert out.beam_scores.tolist() == pytest.approx([candidates[i] for i in best_two], abs=1e-6)
    assert out.parent_index.tolist() == [i // 2 for i in best_two]


def test_margin_and_neg_entropy_measures():
    logits = logits_from([(0, 0.5), (1, 0.9)])
    x = masked(2)
    margin = SOARScheduler(confidence_measure="margin")
    margin.set_timesteps(1)
    out = margin.step(logits, 1.0, x, mask_token_id=M)
    assert out.confidence[0].tolist() == pytest.approx([0.5 - 0.5 / 9, 0.9 - 0.1 / 9], abs=1e-5)
    entropy = SOARScheduler(confidence_measure="neg_entropy", confidence_threshold=-0.6)
    entropy.set_timesteps(8)
    out = entropy.step(logits, 1.0, x, mask_token_id=M)
    p = logits.softmax(-1)[0].double()
    expected = (p * p.log()).sum(-1)
    assert out.confidence[0].tolist() == pytest.approx(expected.tolist(), abs=1e-5)
    # -1.79 and -0.55: only the sharper position reaches -0.6, and it is committed by acceleration
    assert out.accelerated.tolist() == [True]
    assert out.prev_sample.tolist() == [[M, 1]]


def test_temperature_sampling_is_seeded_by_the_generator():
    scheduler = SOARScheduler()
    scheduler.set_timesteps(1)
    logits = torch.zeros(1, 16, V)
    x = masked(16)
    first = scheduler.step(
        logits, 1.0, x, mask_token_id=M, temperature=1.0, generator=torch.Generator().manual_seed(0)
    )
    again = scheduler.step(
        logits, 1.0, x, mask_token_id=M, temperature=1.0, generator=torch.Generator().manual_seed(0)
    )
    other = scheduler.step(
        logits, 1.0, x, mask_token_id=M, temperature=1.0, generator=torch.Generator().manual_seed(1)
    )
    assert torch.equal(first.prev_sample, again.prev_sample)
    assert not torch.equal(first.prev_sample, other.prev_sample)
    assert len(set(first.prev_sample[0].tolist())) > 1


def test_step_rejects_misshaped_beam_state():
    scheduler = SOARScheduler(max_beam_size=2)
    scheduler.set_timesteps(4)
    logits, x = torch.cat([logits_from([(0, 0.5)] * 3)] * 2), torch.full((2, 3), M)
    with pytest.raises(ValueError, match="beam_scores"):
        scheduler.step(logits, 1.0, x, mask_token_id=M, beam_scores=torch.zeros(3))
    with pytest.raises(ValueError, match="beam_groups"):
        scheduler.step(logits, 1.0, x, mask_token_id=M, beam_groups=torch.tensor([1, 0]))
    with pytest.raises(ValueError, match="transfer_mask"):
        scheduler.step(logits, 1.0, x, mask_token_id=M, transfer_mask=torch.ones(2, 4, dtype=torch.bool))
