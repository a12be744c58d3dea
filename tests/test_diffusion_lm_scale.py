"""Diffusion-LM decoding at the vocabulary sizes of real checkpoints: proposals only where a token can be committed,
PLL rescoring in chunks, and what that saves in memory and time (issues 28 and 38)."""

import time

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from diffusers_ext import DiffusionLMPipeline, SOARScheduler
from diffusers_ext.metrics import peak_memory_bytes
from diffusers_ext.pipelines.diffusion_lm.pll_rescoring import pseudo_log_likelihoods
from diffusers_ext.schedulers.scheduling_utils import draw_uniform, draw_uniform_at
from diffusers_ext.schedulers.token_proposal import propose_tokens
from diffusers_ext.testing import get_tiny_llada_like_lm


MASK = 7


def _wide_vocab_lm(vocab_size: int = 8192, seed: int = 0) -> LlamaForCausalLM:
    """A 2-layer bidirectional Llama (hidden 32) with a vocabulary of `vocab_size`: the logits dominate memory."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        use_cache=False,
        is_causal=False,
        mask_token_id=MASK,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def _logits(rows: int, length: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return 4 * torch.randn(rows, length, vocab, generator=torch.Generator().manual_seed(seed))


def _block_masked(rows: int, length: int, prompt: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences with a prompt, the generated region all masks, and the transfer mask of the first block."""
    x = torch.randint(10, 200, (rows, length), generator=torch.Generator().manual_seed(1))
    x[:, prompt:] = MASK
    transfer = torch.zeros(rows, length, dtype=torch.bool)
    transfer[:, prompt : prompt + block] = True
    return x, transfer


# ---------------------------------------------------------------------------------------------------------------------
# the same numbers, computed only where they are needed
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("one_draw", [False, True])
@pytest.mark.parametrize("generators", ["one", "list", "global"])
def test_gathered_noise_is_the_noise_at_those_positions(one_draw, generators, monkeypatch):
    import diffusers_ext.schedulers.scheduling_utils as utils

    monkeypatch.setattr(utils, "_DRAW_CHUNK_NUMEL", 10)  # rows drawn in chunks of 2 positions of 5 values
    groups = torch.tensor([0, 0, 1])
    positions = torch.rand(3, 9, generator=torch.Generator().manual_seed(3)) > 0.5
    positions[:, 1] = True  # before the offset: the 0.5 fill

    def gen():
        if generators == "one":
            return torch.Generator().manual_seed(0)
        if generators == "list":
            return [torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)]
        torch.manual_seed(0)
        return None

    full = draw_uniform((9, 5), gen(), groups, "cpu", torch.float64, offset=2, one_draw=one_draw)
    gathered = draw_uniform_at(positions, (5,), gen(), groups, "cpu", torch.float64, offset=2, one_draw=one_draw)
    assert torch.equal(gathered, full[positions])
    # and the generators end in the same state
    after_full, after_gathered = gen(), gen()
    draw_uniform((9, 5), after_full, groups, "cpu", torch.float64, offset=2, one_draw=one_draw)
    draw_uniform_at(positions, (5,), after_gathered, groups, "cpu", torch.float64, offset=2, one_draw=one_draw)
    first = after_full if generators != "list" else after_full[1]
    second = after_gathered if generators != "list" else after_gathered[1]
    if generators == "global":
        torch.manual_seed(0)
        draw_uniform((9, 5), None, groups, "cpu", torch.float64, offset=2, one_draw=one_draw)
        state = torch.get_rng_state()
        torch.manual_seed(0)
        draw_uniform_at(positions, (5,), None, groups, "cpu", torch.float64, offset=2, one_draw=one_draw)
        assert torch.equal(state, torch.get_rng_state())
    else:
        assert torch.equal(first.get_state(), second.get_state())


@pytest.mark.parametrize(
    "options",
    [
        {"measure": "prob", "temperature": 0.0},
        {"measure": "margin", "temperature": 0.0, "top_k": 50},
        {"measure": "neg_entropy", "temperature": 0.7, "top_p": 0.9},
        {"measure": "prob", "temperature": 1.0, "suppress": (3,), "confidence_suppress": (4,)},
        {"measure": "random", "temperature": 0.5},
        {"measure": "prob", "temperature": 0.0, "precision": "model", "dtype": torch.bfloat16},
    ],
)
def test_proposals_at_the_eligible_positions_equal_those_over_every_position(options):
    logits = _logits(3, 20, 300).to(options.get("dtype", torch.float32))
    logits[..., MASK] += 6  # the mask token would win the argmax
    before = logits.clone()
    positions = torch.rand(3, 20, generator=torch.Generator().manual_seed(5)) > 0.6
    groups = torch.arange(3)

    def run(where):
        return propose_tokens(
            options["measure"],
            options.get("precision", "float32"),
            logits,
            options["temperature"],
            torch.Generator().manual_seed(9),
            groups,
            MASK,
            top_p=options.get("top_p"),
            top_k=options.get("top_k"),
            suppress_token_ids=options.get("suppress", ()),
            confidence_suppress_token_ids=options.get("confidence_suppress", ()),
            offset=2,
            positions=where,
        )

    full = run(None)
    gathered = run(positions)
    for everywhere, selected in zip(full, gathered):
        assert torch.equal(selected[positions], everywhere[positions])
    tokens, probs, confidence = gathered
    assert (tokens[~positions] == MASK).all() and (probs[~positions] == 0).all()
    assert (confidence[~positions] == torch.finfo(confidence.dtype).min).all()
    assert not (tokens[positions] == MASK).any()
    assert torch.equal(logits, before)  # the caller's logits are never written


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_soar_step_commits_the_same_whichever_positions_it_proposes_at(temperature):
    scheduler = SOARScheduler(confidence_threshold=0.3, max_beam_size=2)
    scheduler.set_timesteps(4)
    x, transfer = _block_masked(2, 24, prompt=6, block=8)
    logits = _logits(2, 24, 500, seed=2)
    outs = {
        where: scheduler.step(
            logits,
            scheduler.timesteps[0],
            x,
            mask_token_id=MASK,
            transfer_mask=transfer,
            temperature=temperature,
            generator=torch.Generator().manual_seed(0),
            proposal_positions=where,
        )
        for where in ("eligible", "all")
    }
    for field in ("prev_sample", "transfer_index", "beam_scores", "beam_lengths", "parent_index", "accelerated"):
        assert torch.equal(getattr(outs["eligible"], field), getattr(outs["all"], field)), field
    with pytest.raises(ValueError, match="proposal_positions"):
        scheduler.step(logits, scheduler.timesteps[0], x, mask_token_id=MASK, proposal_positions="masked")


# ---------------------------------------------------------------------------------------------------------------------
# memory and time at a visible shape
# ---------------------------------------------------------------------------------------------------------------------


@torch.no_grad()
def test_sampled_proposals_hold_no_float64_tensor_over_every_position():
    # 4 rows x 64 positions x 8192 tokens, one block of 8 eligible positions per row: the old code held several
    # float64 (rows, L, V) tensors (the noise, its log, the Gumbel weights; 16 MiB each); now the noise of one row
    # (3 MiB) is alive at a time, and the rest is (32, V)
    scheduler = SOARScheduler()
    scheduler.set_timesteps(8)
    x, transfer = _block_masked(4, 64, prompt=16, block=8)
    logits = _logits(4, 64, 8192, seed=3)
    full_float64 = 4 * 64 * 8192 * 8

    def step():
        scheduler.step(
            logits,
            scheduler.timesteps[0],
            x,
            mask_token_id=MASK,
            transfer_mask=transfer,
            temperature=0.7,
            top_p=0.9,
            generator=torch.Generator().manual_seed(0),
            sample_offset=16,
        )

    peak = peak_memory_bytes(step)
    assert peak < 0.5 * full_float64, f"peak {peak / 2**20:.1f} MiB"


@torch.no_grad()
def test_pll_rescoring_memory_is_one_chunk_of_probes():
    model = _wide_vocab_lm()
    scheduler = SOARScheduler(block_length=16, max_beam_size=2, beam_score="pll")
    pipe = DiffusionLMPipeline(model, scheduler, None, adapter="llada")
    pipe.set_progress_bar_config(disable=True)
    prompt = torch.randint(10, 200, (1, 4), generator=torch.Generator().manual_seed(0))
    gen_length, vocab = 32, model.config.vocab_size
    # the old code: all 2 x 32 probes in one forward, then a float32 log-softmax over the full (64, 36, V) logits
    all_probes_logits = 2 * gen_length * (4 + gen_length) * vocab * 4
    out = {}

    def generate():
        out["result"] = pipe(
            input_ids=prompt,
            gen_length=gen_length,
            temperature=1.0,  # the two beams draw different tokens, so two distinct candidates complete
            generator=torch.Generator().manual_seed(0),
            eos_early_stop=False,
            output_type="seq",
        )

    peak = peak_memory_bytes(generate)
    # the rescoring ran: 2 x 32 probe rows on top of the decoding's 1 + 31 x 2 rows
    assert int(out["result"].row_forwards[0]) == 1 + (gen_length - 1) * 2 + 2 * gen_length
    assert peak < 0.5 * all_probes_logits, f"peak {peak / 2**20:.1f} MiB"


@torch.no_grad()
def test_pll_is_the_same_in_any_chunk_size():
    model, tokenizer = get_tiny_llada_like_lm(seed=5)
    from diffusers_ext.pipelines.diffusion_lm.adapters import LLaDAAdapter

    adapter = LLaDAAdapter()
    mask_id = tokenizer.mask_token_id
    sequences = torch.randint(6, 262, (3, 10), generator=torch.Generator().manual_seed(1))
    attention = torch.ones_like(sequences)
    expected = []
    for row in sequences:
        total = 0.0
        for j in range(4, 10):
            probe = row.clone()
            probe[j] = mask_id
            total += float(torch.log_softmax(model(probe[None]).logits[0, j].float(), -1)[row[j]])
        expected.append(total)
    for chunk in (1, 5, 18, 64):
        pll = pseudo_log_likelihoods(adapter, model, sequences, attention, 4, mask_id, chunk)
        torch.testing.assert_close(pll, torch.tensor(expected), atol=1e-4, rtol=1e-5)
    with pytest.raises(ValueError, match="pll_chunk_size"):
        pseudo_log_likelihoods(adapter, model, sequences, attention, 4, mask_id, 0)
    pipe = DiffusionLMPipeline(model, SOARScheduler(max_beam_size=2, beam_score="pll"), tokenizer, adapter="llada")
    with pytest.raises(ValueError, match="pll_chunk_size"):
        pipe(input_ids=sequences[:1, :4], gen_length=6, output_type="seq", pll_chunk_size=0)


def _best_time(fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


@torch.no_grad()
def test_proposing_at_the_current_block_is_faster_than_over_every_position():
    # 2 rows x 128 positions x 16k tokens, 16 eligible per row: the softmax, top-p sort and Gumbel weights run on
    # 1/8 of the positions (the noise is still drawn everywhere, for the same numbers); loose bound, best of three
    scheduler = SOARScheduler()
    scheduler.set_timesteps(8)
    x, transfer = _block_masked(2, 128, prompt=32, block=16)
    logits = _logits(2, 128, 16384, seed=4)

    def step(where):
        return lambda: scheduler.step(
            logits,
            scheduler.timesteps[0],
            x,
            mask_token_id=MASK,
            transfer_mask=transfer,
            temperature=0.7,
            top_p=0.9,
            generator=torch.Generator().manual_seed(0),
            sample_offset=32,
            proposal_positions=where,
        )

    step("eligible")()  # warm-up
    eligible, everywhere = _best_time(step("eligible")), _best_time(step("all"))
    assert eligible < 0.6 * everywhere, f"eligible {eligible * 1e3:.0f} ms vs all {everywhere * 1e3:.0f} ms"
