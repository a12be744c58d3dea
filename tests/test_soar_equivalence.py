"""Token-for-token equivalence with the reference decoders on the tiny stand-ins.

`llada_reference_generate` and `dream_reference_generate` re-derive, step by step, the published rules of LLaDA's
`generate` (block semi-autoregressive low-confidence remasking with a precomputed per-step quota, Gumbel-max in
float64, unsupervised classifier-free guidance) and of Dream's `diffusion_generate` (AR-shifted logits, 4-D mask and
position ids for padded batches, `linspace(1, eps, steps + 1)` times, batch-averaged quota, `maskgit_plus` /
`topk_margin` / `entropy` confidences, `torch.topk` over the whole row). The pipeline with the matching
`SOARScheduler` configuration must produce exactly the same tokens.

Exact confidence ties are the one place the references are not defined: `torch.topk` does not specify which of
equal values it returns (the scheduler breaks ties towards the lower position, see its tests). A freshly
initialised tiny model predicts almost uniform distributions, whose entropies tie exactly in float32 at many
positions; the Dream tests therefore sharpen the output layer so that confidences differ, as in a trained model.
"""

import pytest
import torch
import torch.nn.functional as F

from diffusers_ext import DiffusionLMPipeline, SOARScheduler
from diffusers_ext.testing import get_tiny_dream_like_lm, get_tiny_llada_like_lm


def llada_reference_generate(model, prompt, steps, gen_length, block_length, temperature, cfg_scale, mask_id):
    batch, prompt_length = prompt.shape
    x = torch.full((batch, prompt_length + gen_length), mask_id, dtype=torch.long)
    x[:, :prompt_length] = prompt
    prompt_index = x != mask_id
    num_blocks = gen_length // block_length
    steps_per_block = steps // num_blocks
    for block in range(num_blocks):
        start, end = prompt_length + block * block_length, prompt_length + (block + 1) * block_length
        counts = (x[:, start:end] == mask_id).sum(1)
        quota = (counts // steps_per_block).unsqueeze(1).repeat(1, steps_per_block)
        for row in range(batch):
            quota[row, : int(counts[row] % steps_per_block)] += 1
        for i in range(steps_per_block):
            mask_index = x == mask_id
            if cfg_scale > 0:
                unconditional = x.clone()
                unconditional[prompt_index] = mask_id
                conditional, unconditional = model(torch.cat([x, unconditional])).logits.chunk(2)
                logits = unconditional + (cfg_scale + 1) * (conditional - unconditional)
            else:
                logits = model(x).logits
            if temperature > 0:
                # LLaDA draws one noise tensor over the whole padded batch; the pipeline draws it row by row over
                # the generated positions (so that a prompt's result does not depend on its batch): same rule,
                # that noise layout
                noise = torch.full(logits.shape, 0.5, dtype=torch.float64)
                for row in range(batch):
                    noise[row, prompt_length:] = torch.rand(
                        logits.shape[1] - prompt_length, logits.shape[2], dtype=torch.float64
                    )
                x0 = torch.argmax(logits.to(torch.float64).exp() / (-torch.log(noise)) ** temperature, dim=-1)
            else:
                x0 = torch.argmax(logits, dim=-1)
            p = F.softmax(logits, dim=-1).gather(-1, x0.unsqueeze(-1)).squeeze(-1)
            p[:, end:] = float("-inf")
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, p, torch.tensor(float("-inf")))
            for row in range(batch):
                chosen = torch.topk(confidence[row], k=int(quota[row, i])).indices
                x[row, chosen] = x0[row, chosen]
    return x[:, prompt_length:]


def dream_reference_generate(model, input_ids, attention_mask, max_new_tokens, steps, alg, mask_id, eps=1e-3):
    x = F.pad(input_ids, (0, max_new_tokens), value=mask_id)
    if attention_mask is not None and bool((attention_mask == 0).any()):
        attention_mask = F.pad(attention_mask, (0, max_new_tokens), value=1)
        position_ids = attention_mask.long().cumsum(-1) - 1
        position_ids.masked_fill_(attention_mask == 0, 1)
        real = attention_mask.bool()
        attention_mask = real[:, None, None, :] & real[:, None, :, None]
    else:
        attention_mask, position_ids = None, None
    times = torch.linspace(1, eps, steps + 1)
    for i in range(steps):
        mask_index = x == mask_id
        logits = model(x, attention_mask=attention_mask, position_ids=position_ids).logits
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        probs = torch.softmax(logits[mask_index], dim=-1)
        confidence, x0 = probs.max(dim=-1)
        if alg == "topk_margin":
            top = torch.sort(probs, dim=-1, descending=True).values
            confidence = top[:, 0] - top[:, 1]
        elif alg == "entropy":
            confidence = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
        t, s = times[i], times[i + 1]
        num_mask = mask_index.sum() / mask_index.shape[0]
        k = int(num_mask * (1 - s / t)) if i < steps - 1 else int(num_mask)
        full_confidence = torch.full(x.shape, float("-inf"))
        full_confidence[mask_index] = confidence
        if k > 0:
            chosen = torch.topk(full_confidence, k).indices
            proposal = torch.full_like(x, mask_id)
            proposal[mask_index] = x0
            rows = torch.arange(x.shape[0]).unsqueeze(1).expand_as(chosen)
            x[rows, chosen] = proposal[rows, chosen]
    return x[:, input_ids.shape[1] :]


def _sharpened_dream_like_lm(seed: int):
    model, tokenizer = get_tiny_dream_like_lm(seed=seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    ties = _ties_among_masked(model, tokenizer)
    assert ties == 0, f"the sharpened model still has {ties} tied entropies"
    return model, tokenizer


def _ties_among_masked(model, tokenizer) -> int:
    x = torch.cat([_prompts(1, 6, seed=0), torch.full((1, 12), tokenizer.mask_token_id)], dim=1)
    probs = model(x).logits.softmax(-1)[0, 5:-1]
    entropy = (probs * torch.log(probs + 1e-10)).sum(-1)
    return len(entropy) - len(torch.unique(entropy))


def _prompts(batch: int, length: int, seed: int) -> torch.LongTensor:
    return torch.randint(6, 262, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    "steps, gen_length, block_length, temperature, cfg_scale",
    [(16, 16, 16, 0.0, 0.0), (8, 16, 8, 0.0, 0.0), (6, 12, 4, 0.0, 0.0), (8, 16, 4, 0.0, 1.5), (8, 16, 8, 0.8, 0.0)],
)
@pytest.mark.support_cell("diffusion_lm", "llada")
def test_llada_low_confidence_matches_reference(steps, gen_length, block_length, temperature, cfg_scale):
    model, tokenizer = get_tiny_llada_like_lm(seed=1)
    prompt = _prompts(2, 5, seed=steps)
    mask_id = tokenizer.mask_token_id
    torch.manual_seed(123)
    expected = llada_reference_generate(
        model, prompt, steps, gen_length, block_length, temperature, cfg_scale, mask_id
    )
    pipe = DiffusionLMPipeline(model, SOARScheduler(block_length=block_length), tokenizer, adapter="llada")
    pipe.set_progress_bar_config(disable=True)
    out = pipe(
        input_ids=prompt,
        gen_length=gen_length,
        block_length=block_length,
        num_inference_steps=steps,
        temperature=temperature,
        guidance_scale=cfg_scale + 1.0,  # diffusers convention: LLaDA's cfg_scale w is guidance_scale w + 1
        generator=torch.Generator().manual_seed(123),
        eos_early_stop=False,
        output_type="seq",
    )
    assert torch.equal(out.sequences, expected)
    assert out.nfe.tolist() == [steps, steps]
    assert out.row_forwards.tolist() == [steps * (2 if cfg_scale else 1)] * 2


@pytest.mark.parametrize(
    "alg, measure", [("maskgit_plus", "prob"), ("topk_margin", "margin"), ("entropy", "neg_entropy")]
)
@pytest.mark.parametrize("steps", [12, 5])
@pytest.mark.support_cell("diffusion_lm", "dream")
def test_dream_sampler_matches_reference(alg, measure, steps):
    model, tokenizer = _sharpened_dream_like_lm(seed=2)
    mask_id = tokenizer.mask_token_id
    input_ids = _prompts(2, 6, seed=steps)
    attention_mask = torch.ones_like(input_ids)
    input_ids[1, :2] = tokenizer.pad_token_id  # a left-padded row: 4-D mask and position ids
    attention_mask[1, :2] = 0
    expected = dream_reference_generate(model, input_ids, attention_mask, 12, steps, alg, mask_id)
    scheduler = SOARScheduler(block_length=12, confidence_measure=measure, transfer_schedule="linear")
    pipe = DiffusionLMPipeline(model, scheduler, tokenizer, adapter="dream")
    pipe.set_progress_bar_config(disable=True)
    out = pipe(
        input_ids=input_ids,
        attention_mask=attention_mask,
        gen_length=12,
        block_length=12,
        num_inference_steps=steps,
        eos_early_stop=False,
        output_type="seq",
    )
    assert torch.equal(out.sequences, expected)


def test_unsharpened_tiny_model_has_tied_entropies():
    # why the Dream tests sharpen the model: without it, exact ties make the reference's choice unspecified
    model, tokenizer = get_tiny_dream_like_lm(seed=2)
    assert _ties_among_masked(model, tokenizer) > 0


def test_reference_rules_differ_so_the_equivalence_is_not_vacuous():
    # the three Dream confidences give different outputs on the same model and prompt
    model, tokenizer = _sharpened_dream_like_lm(seed=2)
    input_ids = _prompts(1, 6, seed=1)
    outputs = {
        alg: dream_reference_generate(model, input_ids, None, 12, 5, alg, tokenizer.mask_token_id)
        for alg in ("maskgit_plus", "topk_margin", "entropy")
    }
    assert len({tuple(o[0].tolist()) for o in outputs.values()}) == 3
