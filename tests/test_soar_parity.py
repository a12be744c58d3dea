"""Parity with the reference decoding options, each against a re-derived reference on the tiny stand-ins.

The references are re-derived from the published rules (LLaDA `generate` / `generate_soar`, Dream
`diffusion_generate` / `_sample_soar`, diffusers' `LLaDA2Pipeline`), written step by step here, not taken from the
library. Noise is drawn row by row over the generated positions (the pipeline's layout, which keeps a prompt's
result independent of its batch); the rules are the references'.
"""

import pytest
import torch
import torch.nn.functional as F

from diffusers_ext import DiffusionLMPipeline, SOARScheduler
from diffusers_ext.testing import get_tiny_dream_like_lm, get_tiny_llada_like_lm


def _prompts(batch: int, length: int, seed: int) -> torch.LongTensor:
    return torch.randint(6, 262, (batch, length), generator=torch.Generator().manual_seed(seed))


def _sharpened(factory, seed: int, factor: float):
    model, tokenizer = factory(seed=seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(factor)
    return model, tokenizer


def _confident_at_some_positions(model, modulus: int = 7, boost: float = 6.0):
    """A forward hook that makes a few positions confident, which ones depending on the sequence's content (so
    beams differ); a random tiny model alone is never confident enough to take SOAR's accelerate branch."""

    def hook(module, args, kwargs, output):
        x = args[0] if args else kwargs["input_ids"]
        key = x.sum(-1, keepdim=True)
        position = torch.arange(x.shape[1]).unsqueeze(0)
        chosen = ((position + key) % modulus == 0).to(output.logits.dtype)
        token = (position * 7 + key) % 200 + 6
        output.logits.scatter_add_(-1, token.unsqueeze(-1), boost * chosen.unsqueeze(-1))
        return output

    return model.register_forward_hook(hook, with_kwargs=True)


def _pipe(model, tokenizer, scheduler, adapter):
    pipe = DiffusionLMPipeline(model, scheduler, tokenizer, adapter=adapter)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _row_noise(shape, prompt_length, dtype=torch.float64):
    noise = torch.full(shape, 0.5, dtype=dtype)
    for row in range(shape[0]):
        noise[row, prompt_length:] = torch.rand(shape[1] - prompt_length, *shape[2:], dtype=dtype)
    return noise


# ---------------------------------------------------------------------------------------------------------------------
# SOAR loops (LLaDA `generate_soar`, Dream `_sample_soar`)
# ---------------------------------------------------------------------------------------------------------------------


def soar_reference(model, prompt, steps, gen_length, block_length, tau, mask_id, dream=False, max_par=5, width=2):
    """One prompt. LLaDA: sum score, global step cap, the beam collapses when any beam accelerated, blocks.
    Dream: shifted logits, mean score, loop until no mask, collapse only when the best child committed >= 2."""
    prompt_length = prompt.shape[1]
    x = torch.cat([prompt, torch.full((1, gen_length), mask_id)], 1)[0]
    beams = [(x, 0.0, 0)]  # sequence, score sum, committed count
    step = 0
    while any(bool((b[0] == mask_id).any()) for b in beams) and (dream or step < steps):
        step += 1
        logits = model(torch.stack([b[0] for b in beams])).logits
        if dream:
            logits = torch.cat([logits[:, :1], logits[:, :-1]], 1)
        probs = F.softmax(logits.float(), -1)
        conf_all, tokens = probs.max(-1)
        children, parallel = [], False
        for (seq, score, count), conf, tok in zip(beams, conf_all, tokens):
            masked = seq == mask_id
            masked[:prompt_length] = False
            first = int(masked.nonzero()[0]) - prompt_length
            block = first // block_length
            in_block = masked.clone()
            in_block[: prompt_length + block * block_length] = False
            in_block[prompt_length + (block + 1) * block_length :] = False
            conf = torch.where(in_block, conf, torch.tensor(-1.0))
            confident = (conf > tau).nonzero(as_tuple=True)[0]
            if len(confident) >= 1:
                chosen = confident[torch.argsort(-conf[confident], stable=True)][:max_par]
                child = seq.clone()
                child[chosen] = tok[chosen]
                children.append((child, score + float(conf[chosen].double().sum()), count + len(chosen)))
                parallel = True
            else:
                order = torch.argsort(-conf, stable=True)[: min(width, int(in_block.sum()))]
                for j in order.tolist():
                    child = seq.clone()
                    child[j] = tok[j]
                    children.append((child, score + float(conf[j]), count + 1))
        key = (lambda c: c[1] / c[2]) if dream else (lambda c: c[1])
        children.sort(key=key, reverse=True)
        unique = []
        for child in children:
            if not any(torch.equal(child[0], u[0]) for u in unique):
                unique.append(child)
        best_multi = unique[0][2] - beams[0][2] >= 2 if dream else False
        collapse = best_multi if dream else parallel
        beams = unique[:1] if collapse else unique[:width]
    return beams[0][0][prompt_length:]


@pytest.mark.parametrize("steps", [12, 5])
@torch.no_grad()
def test_llada_soar_matches_reference_with_a_global_step_budget(steps):
    model, tokenizer = get_tiny_llada_like_lm(seed=1)
    hook = _confident_at_some_positions(model, modulus=2, boost=9.0)
    mask_id = tokenizer.mask_token_id
    scheduler = SOARScheduler.from_preset("soar-llada", block_length=4, confidence_threshold=0.5)
    pipe = _pipe(model, tokenizer, scheduler, "llada")
    nfe, masks_left = [], []
    try:
        for seed in range(3):
            prompt = _prompts(1, 5, seed=seed)
            expected = soar_reference(model, prompt, steps, 12, 4, 0.5, mask_id)
            out = pipe(
                input_ids=prompt,
                gen_length=12,
                num_inference_steps=steps,
                step_budget="global",
                eos_early_stop=False,
                output_type="seq",
            )
            assert torch.equal(out.sequences[0], expected), seed
            nfe.append(int(out.nfe[0]))
            masks_left.append(int((out.sequences == mask_id).sum()))
    finally:
        hook.remove()
    assert max(nfe) <= steps
    if steps == 12:  # both branches ran: some prompts accelerated (fewer steps than tokens)
        assert min(nfe) < 12 and max(masks_left) == 0
    else:  # with 5 steps for 12 tokens the budget runs out: masks are returned, as by the reference
        assert max(masks_left) > 0


def test_global_budget_returns_masks_where_the_per_block_budget_fills_everything():
    model, tokenizer = get_tiny_llada_like_lm(seed=0)
    mask_id = tokenizer.mask_token_id
    pipe = _pipe(model, tokenizer, SOARScheduler(block_length=8, max_beam_size=2), "llada")
    kwargs = {"prompt": "ab", "gen_length": 8, "num_inference_steps": 4, "eos_early_stop": False, "output_type": "seq"}
    glob = pipe(**kwargs, step_budget="global")
    assert int((glob.sequences == mask_id).sum()) == 4 and glob.nfe.tolist() == [4]  # one token per step
    per_block = pipe(**kwargs)
    assert not bool((per_block.sequences == mask_id).any()) and per_block.nfe.tolist() == [4]
    with pytest.raises(ValueError, match="step_budget"):
        pipe(**kwargs, step_budget="total")


@torch.no_grad()
def test_dream_soar_preset_matches_reference_collapse_rule_and_single_block():
    model, tokenizer = get_tiny_dream_like_lm(seed=2)
    hook = _confident_at_some_positions(model)
    mask_id = tokenizer.mask_token_id
    scheduler = SOARScheduler.from_preset("soar-dream", confidence_threshold=0.5)
    assert scheduler.config.block_length is None and scheduler.config.collapse_rule == "best_multi_token"
    pipe = _pipe(model, tokenizer, scheduler, "dream")
    differs = 0
    for seed in range(4):
        prompt = _prompts(1, 6, seed=seed)
        expected = soar_reference(model, prompt, None, 10, 10, 0.5, mask_id, dream=True)
        out = pipe(input_ids=prompt, gen_length=10, eos_early_stop=False, output_type="seq")
        assert torch.equal(out.sequences[0], expected), seed
        pipe.scheduler = SOARScheduler.from_preset(
            "soar-dream", confidence_threshold=0.5, collapse_rule="any_accelerated"
        )
        other = pipe(input_ids=prompt, gen_length=10, eos_early_stop=False, output_type="seq")
        differs += int(not torch.equal(other.sequences[0], expected)) + int(
            other.row_forwards[0] != out.row_forwards[0]
        )
        pipe.scheduler = scheduler
    hook.remove()
    assert differs > 0  # the collapse rule matters on these prompts


def test_collapse_rules_on_hand_built_logits():
    M, V = 9, 10

    def logits_from(table):
        rows = []
        for token, p in table:
            probs = torch.full((V,), (1 - p) / (V - 1), dtype=torch.float64)
            probs[token] = p
            rows.append(probs.log())
        return torch.stack(rows).float().unsqueeze(0)

    def masked(length):
        return torch.full((1, length), M)

    # beam 0 has one confident position (accelerates with one token), beam 1 searches
    logits = torch.cat([logits_from([(0, 0.95), (1, 0.3), (2, 0.2)]), logits_from([(0, 0.4), (1, 0.3), (2, 0.2)])])
    x = torch.cat([masked(3), masked(3)])
    x[1, 2] = 2
    groups = torch.tensor([0, 0])
    for rule, kept in (("any_accelerated", 1), ("best_multi_token", 2)):
        scheduler = SOARScheduler(confidence_threshold=0.9, max_beam_size=2, collapse_rule=rule)
        scheduler.set_timesteps(8)
        out = scheduler.step(logits, 1.0, x, mask_token_id=M, beam_groups=groups)
        assert len(out.prev_sample) == kept, rule


# ---------------------------------------------------------------------------------------------------------------------
# LLaDA options
# ---------------------------------------------------------------------------------------------------------------------


def llada_reference(
    model,
    prompt,
    steps,
    gen_length,
    block_length,
    temperature,
    mask_id,
    remasking="low_confidence",
    eos_id=None,
    eot_id=None,
    logits_eos_inf=False,
    confidence_eos_eot_inf=False,
):
    batch, prompt_length = prompt.shape
    x = torch.cat([prompt, torch.full((batch, gen_length), mask_id)], 1)
    num_blocks = gen_length // block_length
    per_block = steps // num_blocks
    for block in range(num_blocks):
        end = prompt_length + (block + 1) * block_length
        counts = (x[:, end - block_length : end] == mask_id).sum(1)
        quota = [[int(c) // per_block + (i < int(c) % per_block) for i in range(per_block)] for c in counts]
        for i in range(per_block):
            mask_index = x == mask_id
            logits = model(x).logits
            if logits_eos_inf:
                logits[:, :, eos_id] = float("-inf")
            if temperature > 0:
                noise = _row_noise(logits.shape, prompt_length)
                x0 = torch.argmax(logits.double().exp() / (-torch.log(noise)) ** temperature, -1)
            else:
                x0 = torch.argmax(logits, -1)
            if confidence_eos_eot_inf:
                logits[:, :, eot_id] = float("-inf")  # (the reference's EOS assignment goes to an unused tensor)
            if remasking == "random":
                p = _row_noise(x0.shape, prompt_length, torch.float32)
            else:
                p = F.softmax(logits, -1).gather(-1, x0.unsqueeze(-1)).squeeze(-1)
            p[:, end:] = float("-inf")
            confidence = torch.where(mask_index, p, torch.tensor(float("-inf")))
            for row in range(batch):
                chosen = torch.topk(confidence[row], quota[row][i]).indices
                x[row, chosen] = x0[row, chosen]
    return x[:, prompt_length:]


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_llada_random_remasking_matches_reference(temperature):
    model, tokenizer = get_tiny_llada_like_lm(seed=1)
    prompt = _prompts(2, 5, seed=4)
    torch.manual_seed(7)
    expected = llada_reference(model, prompt, 8, 16, 8, temperature, tokenizer.mask_token_id, remasking="random")
    pipe = _pipe(model, tokenizer, SOARScheduler(block_length=8, confidence_measure="random"), "llada")
    out = pipe(
        input_ids=prompt,
        gen_length=16,
        num_inference_steps=8,
        temperature=temperature,
        generator=torch.Generator().manual_seed(7),
        eos_early_stop=False,
        output_type="seq",
    )
    assert torch.equal(out.sequences, expected)
    greedy = _pipe(model, tokenizer, SOARScheduler(block_length=8), "llada")(
        input_ids=prompt, gen_length=16, num_inference_steps=8, eos_early_stop=False, output_type="seq"
    )
    assert not torch.equal(greedy.sequences, out.sequences)
    with pytest.raises(ValueError, match="random"):
        SOARScheduler(confidence_measure="random", confidence_threshold=0.9)


def test_llada_eos_options_match_reference():
    model, tokenizer = get_tiny_llada_like_lm(seed=3)
    eos, eot = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():  # make EOS and EoT likely proposals, so that both options change the result
        model.lm_head.weight[eos] *= 0
        model.lm_head.weight[eot] *= 0
        model.lm_head.weight.mul_(4.0)

    def likely_end_tokens(module, args, output):
        position = torch.arange(output.logits.shape[1])
        output.logits[:, position % 3 == 1, eos] = 3.0
        output.logits[:, position % 2 == 0, eot] = 3.0
        return output

    hook = model.register_forward_hook(likely_end_tokens)
    try:
        prompt = _prompts(1, 5, seed=1)
        pipe = _pipe(model, tokenizer, SOARScheduler(block_length=12), "llada")
        results = {}
        for flags in ((False, False), (True, False), (False, True)):
            expected = llada_reference(
                model,
                prompt,
                12,
                12,
                12,
                0.0,
                tokenizer.mask_token_id,
                eos_id=eos,
                eot_id=eot,
                logits_eos_inf=flags[0],
                confidence_eos_eot_inf=flags[1],
            )
            out = pipe(
                input_ids=prompt,
                gen_length=12,
                num_inference_steps=12,
                eos_early_stop=False,
                logits_eos_inf=flags[0],
                confidence_eos_eot_inf=flags[1],
                eot_token_id=eot,
                output_type="seq",
            )
            assert torch.equal(out.sequences, expected), flags
            results[flags] = expected
        assert bool((results[(False, False)] == eos).any()) and not bool((results[(True, False)] == eos).any())
        assert not torch.equal(results[(False, False)], results[(False, True)])
    finally:
        hook.remove()
    with pytest.raises(ValueError, match="eot_token_id"):
        _pipe(model, tokenizer, SOARScheduler(), "hf")(prompt="ab", gen_length=4, confidence_eos_eot_inf=True)


# ---------------------------------------------------------------------------------------------------------------------
# Dream options
# ---------------------------------------------------------------------------------------------------------------------


def dream_reference(
    model,
    input_ids,
    max_new_tokens,
    steps,
    mask_id,
    alg="maskgit_plus",
    alg_temp=None,
    top_p=None,
    top_k=None,
    eps=1e-3,
):
    x = F.pad(input_ids, (0, max_new_tokens), value=mask_id)
    times = torch.linspace(1, eps, steps + 1)
    for i in range(steps):
        mask_index = x == mask_id
        logits = model(x).logits
        logits = torch.cat([logits[:, :1], logits[:, :-1]], 1)[mask_index]
        if top_p is not None and top_p < 1:
            sorted_logits, sorted_index = torch.sort(logits, descending=True)
            drop = torch.cumsum(F.softmax(sorted_logits, -1), -1) > top_p
            drop[..., 1:] = drop[..., :-1].clone()
            drop[..., 0] = False
            logits = logits.masked_fill(
                torch.zeros_like(drop).scatter_(-1, sorted_index, drop), torch.finfo(logits.dtype).min
            )
        if top_k is not None:
            logits = logits.masked_fill(
                logits < torch.topk(logits, top_k)[0][..., -1, None], torch.finfo(logits.dtype).min
            )
        confidence, x0 = torch.softmax(logits, -1).max(-1)
        t, s = times[i], times[i + 1]
        if alg == "origin":
            p = 1 - s / t if i < steps - 1 else 1
            reveal = torch.rand(x0.shape) < p
            proposal = torch.full_like(x0, mask_id)
            proposal[reveal] = x0[reveal]
            x[mask_index] = proposal
            continue
        k = int(mask_index.sum() / x.shape[0] * (1 - s / t)) if i < steps - 1 else int(mask_index.sum() / x.shape[0])
        full = torch.full(x.shape, float("-inf"))
        full[mask_index] = confidence
        if k == 0:
            continue
        if alg_temp:
            chosen = torch.multinomial(F.softmax(full / alg_temp, -1), k)
        else:
            chosen = torch.topk(full, k).indices
        proposal = torch.full_like(x, mask_id)
        proposal[mask_index] = x0
        rows = torch.arange(x.shape[0]).unsqueeze(1).expand_as(chosen)
        x[rows, chosen] = proposal[rows, chosen]
    return x[:, input_ids.shape[1] :]


@pytest.mark.parametrize(
    "options, config",
    [
        ({"alg": "origin"}, {"transfer_schedule": "origin"}),
        ({"alg_temp": 0.5}, {"transfer_schedule": "linear", "selection_temperature": 0.5}),
        ({"top_p": 0.02}, {"transfer_schedule": "linear"}),
        ({"top_k": 3}, {"transfer_schedule": "linear"}),
    ],
)
def test_dream_options_match_reference(options, config):
    model, tokenizer = _sharpened(get_tiny_dream_like_lm, seed=2, factor=3.0)
    mask_id = tokenizer.mask_token_id
    prompt = _prompts(1, 6, seed=3)
    torch.manual_seed(11)
    expected = dream_reference(model, prompt, 12, 6, mask_id, **options)
    pipe = _pipe(model, tokenizer, SOARScheduler(block_length=12, **config), "dream")
    call = {k: v for k, v in options.items() if k in ("top_p", "top_k")}
    out = pipe(
        input_ids=prompt,
        gen_length=12,
        num_inference_steps=6,
        generator=torch.Generator().manual_seed(11),
        eos_early_stop=False,
        output_type="seq",
        **call,
    )
    assert torch.equal(out.sequences, expected)
    plain = dream_reference(model, prompt, 12, 6, mask_id)
    if "top_k" not in options:  # top-k renormalises too, but may keep the same order on this model
        assert not torch.equal(plain, expected)


# ---------------------------------------------------------------------------------------------------------------------
# precision, the mask token, batches
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.support_cell("diffusion_lm", "llada", dtype="bfloat16")
def test_reference_precision_on_a_bf16_model():
    model, tokenizer = _sharpened(get_tiny_llada_like_lm, seed=1, factor=20.0)
    model = model.to(torch.bfloat16)
    mask_id = tokenizer.mask_token_id
    prompt = _prompts(1, 5, seed=2)
    captured = {}

    def keep(pipe, step, timestep, kwargs):
        captured.setdefault("confidence", kwargs["confidence"])
        return {}

    outs = {}
    for precision in ("float32", "model"):
        scheduler = SOARScheduler(block_length=12, confidence_threshold=0.5, confidence_precision=precision)
        out = _pipe(model, tokenizer, scheduler, "llada")(
            input_ids=prompt,
            gen_length=12,
            num_inference_steps=12,
            eos_early_stop=False,
            output_type="seq",
            callback_on_step_end=keep,
            callback_on_step_end_tensor_inputs=["confidence"],
        )
        outs[precision] = (out.sequences, captured.pop("confidence"))
    x = torch.cat([prompt, torch.full((1, 12), mask_id)], 1)
    logits = model(x).logits
    ref_bf16 = F.softmax(logits, -1).max(-1).values  # the references' softmax, in the logits' dtype
    ref_f32 = F.softmax(logits.float(), -1).max(-1).values
    assert outs["model"][1].dtype == torch.bfloat16 and torch.equal(outs["model"][1][0], ref_bf16[0])
    assert outs["float32"][1].dtype == torch.float32 and torch.equal(outs["float32"][1][0], ref_f32[0])
    assert not torch.equal(ref_bf16.float(), ref_f32)  # bf16 rounds: the two precisions are different options
    # the strict threshold is compared in bf16, where 0.95 itself is 0.9492
    bf16 = torch.tensor([0.9492, 0.9531], dtype=torch.bfloat16)
    assert (bf16 > 0.95).tolist() == [False, True]


def test_the_mask_token_is_never_sampled():
    model, tokenizer = get_tiny_llada_like_lm(seed=0)
    mask_id = tokenizer.mask_token_id
    hook = model.register_forward_hook(lambda m, a, o: o.logits.__setitem__((Ellipsis, mask_id), 5.0) or o)
    try:
        pipe = _pipe(model, tokenizer, SOARScheduler(block_length=8), "llada")
        out = pipe(
            prompt="ab",
            gen_length=8,
            temperature=1.0,
            generator=torch.Generator().manual_seed(0),
            eos_early_stop=False,
            output_type="seq",
        )
    finally:
        hook.remove()
    assert not bool((out.sequences == mask_id).any()) and out.nfe.tolist() == [8]


@pytest.mark.parametrize("scheduler_config", [{}, {"confidence_threshold": 0.02, "max_beam_size": 2}])
def test_a_batch_gives_each_prompt_what_it_gives_alone(scheduler_config):
    model, tokenizer = get_tiny_llada_like_lm(seed=4)
    pipe = _pipe(model, tokenizer, SOARScheduler(block_length=4, **scheduler_config), "hf")
    prompts = ["ab", "hello", "xyz!"]  # different lengths: the batch is left-padded
    kwargs = {"gen_length": 8, "temperature": 1.0, "eos_early_stop": False, "output_type": "seq"}
    batch = pipe(prompt=prompts, generator=[torch.Generator().manual_seed(s) for s in range(3)], **kwargs)
    for i, prompt in enumerate(prompts):
        alone = pipe(prompt=prompt, generator=torch.Generator().manual_seed(i), **kwargs)
        assert torch.equal(batch.sequences[i], alone.sequences[0]), prompt
        assert batch.nfe[i] == alone.nfe[0] and batch.row_forwards[i] == alone.row_forwards[0]


# ---------------------------------------------------------------------------------------------------------------------
# presets, LLaDA2
# ---------------------------------------------------------------------------------------------------------------------


def test_named_presets_hold_the_paper_settings():
    llada = SOARScheduler.from_preset("soar-llada")
    assert (llada.config.confidence_threshold, llada.config.max_beam_size, llada.config.max_parallel_tokens) == (
        0.95,
        2,
        5,
    )
    assert llada.config.score == "sum" and llada.config.collapse_rule == "any_accelerated"
    assert llada.config.step_budget == "global"
    dream = SOARScheduler.from_preset("soar-dream", block_length=16)
    assert (dream.config.confidence_threshold, dream.config.score, dream.config.block_length) == (0.9, "mean", 16)
    assert dream.config.collapse_rule == "best_multi_token" and dream.config.step_budget == "unbounded"
    with pytest.raises(ValueError, match="name") as error:
        SOARScheduler.from_preset("fast")
    for name in ("llada", "fast-dllm", "dream", "soar-llada", "soar-dream", "pbs"):
        assert repr(name) in str(error.value)


def test_llada2_adapter_matches_diffusers_llada2_pipeline():
    from diffusers import BlockRefinementScheduler, LLaDA2Pipeline
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config).eval()  # causal: the window each call sees changes its logits
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
        model.lm_head.weight[63].zero_()  # the mask token is never the argmax, in either pipeline
    prompt = torch.randint(0, 60, (1, 6), generator=torch.Generator().manual_seed(1))
    theirs = LLaDA2Pipeline(model=model, scheduler=BlockRefinementScheduler(block_length=4, threshold=0.6))
    theirs.set_progress_bar_config(disable=True)
    expected = theirs(
        input_ids=prompt,
        gen_length=10,
        block_length=4,
        num_inference_steps=2,
        threshold=0.6,
        mask_token_id=63,
        eos_early_stop=False,
        output_type="seq",
    ).sequences
    ours = DiffusionLMPipeline(
        model, SOARScheduler(block_length=4, confidence_threshold=0.6, transfer_schedule="block"), adapter="llada2"
    )
    ours.set_progress_bar_config(disable=True)
    # 6 prompt tokens, blocks [4, 8), [8, 12), [12, 16): the first block holds two generated positions
    out = ours(
        input_ids=prompt,
        gen_length=10,
        block_length=4,
        num_inference_steps=6,
        mask_token_id=63,
        eos_early_stop=False,
        output_type="seq",
    )
    assert torch.equal(out.sequences, expected)


# ---------------------------------------------------------------------------------------------------------------------
# beam_score="pll": rescoring completed beams
# ---------------------------------------------------------------------------------------------------------------------


@torch.no_grad()
def test_pll_rescoring_picks_the_complete_beam_with_the_highest_pseudo_log_likelihood():
    model, tokenizer = get_tiny_llada_like_lm(seed=5)
    mask_id = tokenizer.mask_token_id
    prompt = _prompts(1, 4, seed=6)
    kwargs = {"input_ids": prompt, "gen_length": 6, "eos_early_stop": False, "output_type": "seq"}
    last = {}

    def keep(pipe, step, timestep, callback_kwargs):
        last["rows"] = callback_kwargs["sequences"].clone()
        return {}

    path = _pipe(model, tokenizer, SOARScheduler(block_length=6, max_beam_size=2), "llada")(**kwargs)
    pipe = _pipe(model, tokenizer, SOARScheduler(block_length=6, max_beam_size=2, beam_score="pll"), "llada")
    out = pipe(**kwargs, callback_on_step_end=keep, callback_on_step_end_tensor_inputs=["sequences"])
    rows = last["rows"]
    assert len(rows) == 2 and not bool((rows == mask_id).any())  # two complete candidates at the end

    def pll(sequence):
        total = 0.0
        for j in range(4, 10):
            probe = sequence.clone()
            probe[j] = mask_id
            total += float(torch.log_softmax(model(probe[None]).logits[0, j].float(), -1)[sequence[j]])
        return total

    scores = [pll(r) for r in rows]
    assert torch.equal(out.sequences[0], rows[int(torch.tensor(scores).argmax())][4:])
    assert torch.equal(path.sequences[0], rows[0][4:])  # the path score keeps the first (best-ranked) beam
    # cost: one more batched forward, one row per candidate and generated position
    assert out.nfe.tolist() == [int(path.nfe[0]) + 1]
    assert out.row_forwards.tolist() == [int(path.row_forwards[0]) + 2 * 6]


# ---------------------------------------------------------------------------------------------------------------------
# the step budget and the softmax precision as scheduler settings (what the presets carry)
# ---------------------------------------------------------------------------------------------------------------------


def test_the_scheduler_step_budget_is_the_pipeline_default():
    model, tokenizer = get_tiny_llada_like_lm(seed=2)
    mask_id = tokenizer.mask_token_id
    kwargs = {"prompt": "ab", "gen_length": 8, "num_inference_steps": 4, "eos_early_stop": False, "output_type": "seq"}
    beam = {"block_length": 4, "max_beam_size": 2}
    explicit = _pipe(model, tokenizer, SOARScheduler(**beam), "llada")(**kwargs, step_budget="global")
    configured = _pipe(model, tokenizer, SOARScheduler(**beam, step_budget="global"), "llada")
    assert torch.equal(configured(**kwargs).sequences, explicit.sequences)
    assert bool((explicit.sequences == mask_id).any())  # a global budget of 4 steps leaves masks
    # an explicit argument still wins over the scheduler's setting
    per_block = configured(**kwargs, step_budget="per_block")
    assert not bool((per_block.sequences == mask_id).any())
    # schedulers saved before the setting existed keep the per-block default
    assert SOARScheduler.from_config({"block_length": 4}).config.step_budget == "per_block"
    with pytest.raises(ValueError, match="step_budget"):
        SOARScheduler(step_budget="total")


def test_an_unbounded_step_budget_decodes_until_no_mask_is_left():
    model, tokenizer = get_tiny_llada_like_lm(seed=2)
    hook = _confident_at_some_positions(model, modulus=2, boost=9.0)
    try:
        kwargs = {"prompt": "ab", "gen_length": 8, "block_length": 4, "eos_early_stop": False, "output_type": "seq"}
        scheduler = SOARScheduler(block_length=4, confidence_threshold=0.9, step_budget="unbounded")
        pipe = _pipe(model, tokenizer, scheduler, "llada")
        few = pipe(**kwargs, num_inference_steps=2)  # not a cap
        full = pipe(**kwargs, num_inference_steps=8, step_budget="global")
        assert torch.equal(few.sequences, full.sequences) and few.nfe.tolist() == full.nfe.tolist()
        assert not bool((few.sequences == tokenizer.mask_token_id).any())
        assert int(few.nfe[0]) < 8  # the threshold committed several tokens in some step
    finally:
        hook.remove()


def test_float64_confidence_precision_is_fast_dllms_softmax():
    logits = torch.randn(1, 6, 10, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    sample = torch.full((1, 6), 9)
    outs = {}
    for precision in ("float32", "float64", "model"):
        scheduler = SOARScheduler(block_length=6, confidence_precision=precision)
        scheduler.set_timesteps(6)
        outs[precision] = scheduler.step(logits, scheduler.timesteps[0], sample, mask_token_id=9).confidence
    expected = F.softmax(logits.to(torch.float64), -1)
    expected[..., 9] = 0.0  # the mask token is never proposed
    assert outs["float64"].dtype == torch.float64
    assert torch.equal(
        outs["float64"], F.softmax(logits.to(torch.float64), -1).gather(-1, expected.argmax(-1, keepdim=True))[..., 0]
    )
    assert outs["float32"].dtype == torch.float32 and outs["model"].dtype == torch.bfloat16
