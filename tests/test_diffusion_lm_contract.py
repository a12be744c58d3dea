"""DiffusionLMPipeline and the diffusers contract: guidance convention, saved adapter, latents, num_images_per_prompt."""

import pytest
import torch

from diffusers_ext import DiffusionLMPipeline, DreamAdapter, LLaDAAdapter, load_pipeline
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
