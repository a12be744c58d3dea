"""DiffusionLMPipeline and the diffusers contract: guidance convention, saved adapter, latents, num_images_per_prompt."""

import inspect

import pytest
import torch

from diffusers_ext import DiffusionLMPipeline, DreamAdapter, LLaDAAdapter, load_pipeline
from diffusers_ext.schedulers.scheduling_utils import DIFFUSION_LM_STEP_KEYWORDS
from diffusers_ext.testing import get_dummy_components, get_dummy_inputs


@pytest.fixture(scope="module")
def pipe():
    pipe = DiffusionLMPipeline(**get_dummy_components(DiffusionLMPipeline, 0))
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("llada_value", [0.0, 0.5])
def test_llada_style_guidance_values_raise_naming_the_convention(pipe, llada_value):
    with pytest.raises(ValueError, match=r"guidance_scale.*diffusers convention.*w \+ 1"):
        pipe(**{**get_dummy_inputs(DiffusionLMPipeline, 0), "guidance_scale": llada_value})


def test_guidance_scale_one_is_off_and_above_one_changes_the_output(pipe):
    off = pipe(**get_dummy_inputs(DiffusionLMPipeline, 0))
    default = pipe(**{k: v for k, v in get_dummy_inputs(DiffusionLMPipeline, 0).items() if k != "guidance_scale"})
    on = pipe(**{**get_dummy_inputs(DiffusionLMPipeline, 0), "guidance_scale": 3.0})
    assert torch.equal(off.sequences, default.sequences)
    assert not torch.equal(on.sequences, off.sequences)


@pytest.mark.parametrize("adapter", [DreamAdapter(mask_token_id=5), LLaDAAdapter(mask_token_id=7), "hf"])
def test_adapter_survives_save_and_load(adapter, tmp_path):
    pipe = DiffusionLMPipeline(**get_dummy_components(DiffusionLMPipeline, 0), adapter=adapter)
    pipe.save_pretrained(tmp_path)
    for loaded in (DiffusionLMPipeline.from_pretrained(tmp_path), load_pipeline(tmp_path)):
        assert type(loaded.adapter) is type(pipe.adapter)
        assert loaded.adapter.mask_token_id == pipe.adapter.mask_token_id
        assert loaded.adapter.shift_logits == pipe.adapter.shift_logits


def test_latents_fix_the_given_tokens_and_default_to_all_masks(pipe):
    mask_id = pipe.tokenizer.mask_token_id
    baseline = pipe(**get_dummy_inputs(DiffusionLMPipeline, 0)).sequences
    all_masks = torch.full((1, 8), mask_id)
    assert torch.equal(pipe(**get_dummy_inputs(DiffusionLMPipeline, 0), latents=all_masks).sequences, baseline)
    infill = all_masks.clone()
    infill[0, [0, 5]] = torch.tensor([70, 71])
    out = pipe(**get_dummy_inputs(DiffusionLMPipeline, 0), latents=infill).sequences
    assert out[0, 0] == 70 and out[0, 5] == 71


def test_num_images_per_prompt_rows_follow_their_generators(pipe):
    singles = [pipe(**get_dummy_inputs(DiffusionLMPipeline, s)).sequences for s in (0, 1)]
    inputs = {**get_dummy_inputs(DiffusionLMPipeline, 0), "num_images_per_prompt": 2}
    inputs["generator"] = [torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)]
    out = pipe(**inputs).sequences
    assert out.shape[0] == 2 and torch.equal(out[:1], singles[0])
    second = {**get_dummy_inputs(DiffusionLMPipeline, 0), "generator": torch.Generator().manual_seed(1)}
    assert torch.equal(out[1:], pipe(**second).sequences)


def test_num_return_sequences_is_the_count_and_num_images_per_prompt_its_alias(pipe):
    inputs = get_dummy_inputs(DiffusionLMPipeline, 0)
    named = pipe(**{**inputs, "num_return_sequences": 2}).sequences
    alias = pipe(**{**get_dummy_inputs(DiffusionLMPipeline, 0), "num_images_per_prompt": 2}).sequences
    assert named.shape[0] == 2 and torch.equal(named, alias)
    with pytest.raises(ValueError, match="num_return_sequences"):
        pipe(**{**get_dummy_inputs(DiffusionLMPipeline, 0), "num_return_sequences": 0})
    with pytest.raises(ValueError, match="disagree"):
        pipe(**{**get_dummy_inputs(DiffusionLMPipeline, 0), "num_return_sequences": 2, "num_images_per_prompt": 3})


def test_schedulers_declare_their_optional_step_keywords():
    from diffusers_ext import OeMDMScheduler, SOARScheduler
    from diffusers_ext.schedulers.scheduling_utils import DiffusionLMSchedulerMixin

    for scheduler_class in (SOARScheduler, OeMDMScheduler):
        assert issubclass(scheduler_class, DiffusionLMSchedulerMixin)
        step_keywords = set(inspect.signature(scheduler_class.step).parameters)
        assert set(scheduler_class.step_options) <= step_keywords
        assert set(DIFFUSION_LM_STEP_KEYWORDS) <= step_keywords
    assert "num_transfer_tokens" in SOARScheduler.step_options and "exponents" in OeMDMScheduler.step_options


def test_an_undeclared_decoding_option_raises_before_any_forward():
    from diffusers_ext import OeMDMScheduler

    pipe = DiffusionLMPipeline(**get_dummy_components(DiffusionLMPipeline, 0))
    pipe.scheduler = OeMDMScheduler(block_length=4)
    pipe.set_progress_bar_config(disable=True)
    with pytest.raises(ValueError, match=r"OeMDMScheduler does not support the decoding option\(s\) \['top_k'\]"):
        pipe(**get_dummy_inputs(DiffusionLMPipeline, 0), top_k=3)
    with pytest.raises(ValueError, match="num_transfer_tokens"):
        pipe(**get_dummy_inputs(DiffusionLMPipeline, 0), step_budget="global")


def test_adapters_take_the_diffusers_guidance_scale(pipe):
    x = torch.full((1, 6), pipe.tokenizer.mask_token_id)
    x[0, :2] = torch.tensor([70, 71])
    prompt_mask = torch.zeros_like(x, dtype=torch.bool)
    prompt_mask[0, :2] = True
    mask_id = pipe.tokenizer.mask_token_id
    ones = torch.ones_like(x)
    off = pipe.adapter(pipe.model, x, ones, prompt_mask=prompt_mask, mask_token_id=mask_id)
    assert torch.equal(
        off, pipe.adapter(pipe.model, x, ones, prompt_mask=prompt_mask, guidance_scale=1.0, mask_token_id=mask_id)
    )
    guided = pipe.adapter(pipe.model, x, ones, prompt_mask=prompt_mask, guidance_scale=2.0, mask_token_id=mask_id)
    unconditional = pipe.adapter(pipe.model, x.masked_fill(prompt_mask, mask_id), ones, mask_token_id=mask_id)
    torch.testing.assert_close(guided, unconditional + 2.0 * (off - unconditional))
