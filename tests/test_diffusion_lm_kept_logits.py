"""The output head runs only where a token can be committed (issue 28): a model taking transformers' `logits_to_keep`
computes the logits of the current block's masked positions alone, and every decoder commits exactly the tokens it
commits from the full logits."""

import pytest
import torch

from diffusers_ext import DiffusionLMPipeline, SOARScheduler
from diffusers_ext.pipelines.diffusion_lm.adapters import can_keep_logits
from diffusers_ext.testing import get_tiny_dream_like_lm, get_tiny_llada_like_lm


FAMILIES = {"llada": get_tiny_llada_like_lm, "dream": get_tiny_dream_like_lm}

# (family, preset, call options): every decoder configuration, beams included
CASES = [
    ("llada", "llada", {}),
    ("llada", "llada", {"temperature": 0.7, "seed": 3}),
    ("llada", "llada", {"guidance_scale": 2.0}),
    ("llada", "fast-dllm", {"scheduler": {"confidence_threshold": 0.02}}),
    ("llada", "soar-llada", {"scheduler": {"confidence_threshold": 0.02}}),
    ("llada", "pbs", {}),
    ("llada", "pbs", {"scheduler": {"beam_score": "pll"}}),
    ("llada", "llada", {"adapter": "llada2", "prompt": ["ab"], "num_inference_steps": 6}),
    ("dream", "dream", {}),
    ("dream", "dream", {"temperature": 0.9, "top_p": 0.9, "top_k": 20, "seed": 1}),
    ("dream", "dream", {"scheduler": {"confidence_measure": "margin"}}),
    ("dream", "dream", {"scheduler": {"confidence_measure": "neg_entropy"}}),
    ("dream", "soar-dream", {"scheduler": {"confidence_threshold": 0.02}}),
    ("dream", "llada", {"scheduler": {"confidence_measure": "random"}, "seed": 2}),
]


def _decode(family: str, preset: str, options: dict, full_logits: bool):
    """The sequences of one decode and the number of positions the output head saw at each forward."""
    model, tokenizer = FAMILIES[family]()
    options = dict(options)
    scheduler = SOARScheduler.from_preset(preset, **{"block_length": 4, **options.pop("scheduler", {})})
    pipe = DiffusionLMPipeline(model, scheduler, tokenizer, adapter=options.pop("adapter", None))
    pipe.set_progress_bar_config(disable=True)
    seed = options.pop("seed", None)
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    head_positions = []
    handles = [model.lm_head.register_forward_pre_hook(lambda m, args: head_positions.append(args[0].shape[1]))]
    if full_logits:  # a forward hook on the model gets the full logits (it may read them by position)
        handles.append(model.register_forward_hook(lambda module, args, output: output))
    try:
        out = pipe(
            **{"prompt": ["ab", "cdef"], "gen_length": 8, "num_inference_steps": 8, **options},
            eos_early_stop=False,
            output_type="seq",
            generator=generator,
        )
    finally:
        for handle in handles:
            handle.remove()
    return out.sequences, head_positions


@pytest.mark.parametrize("family, preset, options", CASES)
def test_logits_at_the_eligible_positions_give_the_tokens_of_the_full_logits(family, preset, options):
    kept, kept_positions = _decode(family, preset, options, full_logits=False)
    full, full_positions = _decode(family, preset, options, full_logits=True)
    assert torch.equal(kept, full)
    assert len(kept_positions) == len(full_positions)
    # blocks of 4 in 8 generated tokens: the head saw at most the masked positions of the rows' current blocks
    # (a prompt's rows may be a block apart), never the prompt; the full run saw whole sequences or windows
    decode = kept_positions
    if options.get("scheduler", {}).get("beam_score") == "pll":  # the rescoring forwards read every position
        decode = [n for n, m in zip(kept_positions, full_positions) if n < m]
        assert decode
    assert max(decode) <= 8 and sum(kept_positions) < sum(full_positions)


class _NoLogitsToKeep(torch.nn.Module):
    """A model whose forward takes no `logits_to_keep` (e.g. remote modeling code): it gets full logits."""

    def __init__(self, model):
        super().__init__()
        self.inner, self.config = model, model.config

    @property
    def device(self):
        return self.inner.device

    @property
    def dtype(self):
        return self.inner.dtype

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        return self.inner(input_ids, attention_mask=attention_mask, position_ids=position_ids)


def test_a_model_without_logits_to_keep_gets_full_logits_and_the_same_tokens():
    model, tokenizer = get_tiny_llada_like_lm()
    wrapped = _NoLogitsToKeep(model)
    assert can_keep_logits(model) and not can_keep_logits(wrapped)
    head_positions = []
    handle = model.lm_head.register_forward_pre_hook(lambda m, args: head_positions.append(args[0].shape[1]))
    kwargs = {
        "prompt": ["ab", "c"],
        "gen_length": 8,
        "num_inference_steps": 8,
        "eos_early_stop": False,
        "output_type": "seq",
    }
    try:
        scheduler = SOARScheduler.from_preset("soar-llada", block_length=4, confidence_threshold=0.02)
        pipe = DiffusionLMPipeline(wrapped, scheduler, tokenizer, adapter="hf")
        pipe.set_progress_bar_config(disable=True)
        fallback = pipe(**kwargs).sequences
    finally:
        handle.remove()
    assert min(head_positions) > 8  # the padded prompt and the generated region: every position
    reference, _ = _decode(
        "llada", "soar-llada", {"scheduler": {"confidence_threshold": 0.02}, "prompt": ["ab", "c"]}, True
    )
    assert torch.equal(fallback, reference)


def test_a_forward_hook_on_the_model_or_its_head_keeps_full_logits():
    model, _ = get_tiny_llada_like_lm()
    assert can_keep_logits(model)
    for module in (model, model.lm_head):
        handle = module.register_forward_hook(lambda m, args, output: output)
        assert not can_keep_logits(model)
        handle.remove()
    assert can_keep_logits(model)


def _step_inputs():
    torch.manual_seed(0)
    rows, length, vocab, mask = 3, 12, 50, 7
    logits = 3 * torch.randn(rows, length, vocab)
    sample = torch.randint(10, 40, (rows, length))
    sample[:, 4:] = mask
    sample[1, 5] = 11  # a committed position inside the block
    transfer = torch.zeros(rows, length, dtype=torch.bool)
    transfer[:, 4:8] = True
    return logits, sample, transfer, mask


@pytest.mark.parametrize("preset", ["llada", "fast-dllm", "soar-llada", "dream"])
def test_step_on_the_kept_positions_equals_the_step_on_the_full_logits(preset):
    logits, sample, transfer, mask = _step_inputs()
    scheduler = SOARScheduler.from_preset(preset, block_length=4)
    scheduler.set_timesteps(4)
    t = scheduler.timesteps[0]
    common = {"mask_token_id": mask, "transfer_mask": transfer, "beam_groups": torch.tensor([0, 0, 1])}
    full = scheduler.step(logits, t, sample, **common)
    kept = torch.arange(4, 8)
    part = scheduler.step(logits[:, kept].clone(), t, sample, logits_positions=kept, **common)
    for name in ("prev_sample", "transfer_index", "sampled_tokens", "sampled_probs", "confidence", "beam_scores"):
        assert torch.equal(getattr(part, name), getattr(full, name)), name


def test_step_refuses_kept_positions_that_miss_an_eligible_one():
    logits, sample, transfer, mask = _step_inputs()
    scheduler = SOARScheduler(block_length=4)
    scheduler.set_timesteps(4)
    t = scheduler.timesteps[0]
    kept = torch.arange(4, 7)
    with pytest.raises(ValueError, match="logits_positions"):
        scheduler.step(logits[:, kept], t, sample, mask_token_id=mask, transfer_mask=transfer, logits_positions=kept)
    kept = torch.tensor([5, 4, 6, 7])
    with pytest.raises(ValueError, match="increasing"):
        scheduler.step(logits[:, kept], t, sample, mask_token_id=mask, transfer_mask=transfer, logits_positions=kept)
    kept = torch.arange(4, 8)
    with pytest.raises(ValueError, match="proposal_positions"):
        scheduler.step(
            logits[:, kept],
            t,
            sample,
            mask_token_id=mask,
            transfer_mask=transfer,
            logits_positions=kept,
            proposal_positions="all",
        )
    with pytest.raises(ValueError, match="model_output"):
        scheduler.step(logits, t, sample, mask_token_id=mask, transfer_mask=transfer, logits_positions=kept)
