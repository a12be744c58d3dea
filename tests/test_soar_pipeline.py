"""DiffusionLMPipeline: the conformance suite, adapters, beams, batching and bad input."""

import pytest
import torch

from diffusers_ext import DiffusionLMPipeline, SOARScheduler
from diffusers_ext.testing import PipelineConformanceTests


class TestDiffusionLMPipeline(PipelineConformanceTests):
    pipeline_class = DiffusionLMPipeline


def _pipe(scheduler=None, adapter=None, dream=False):
    from diffusers_ext.testing import get_tiny_dream_like_lm, get_tiny_llada_like_lm

    model, tokenizer = (get_tiny_dream_like_lm if dream else get_tiny_llada_like_lm)(seed=0)
    pipe = DiffusionLMPipeline(model, scheduler or SOARScheduler(block_length=4), tokenizer, adapter=adapter)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _record_forwards(model):
    calls = []

    def hook(module, args, kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        calls.append({"shape": tuple(ids.shape), **{k: v for k, v in kwargs.items() if v is not None}})

    return calls, model.register_forward_pre_hook(hook, with_kwargs=True)


def test_adapter_is_chosen_from_the_config_and_can_be_overridden():
    from diffusers_ext import DreamAdapter, HFLogitsAdapter, LLaDA2Adapter, LLaDAAdapter, get_diffusion_lm_adapter

    assert isinstance(_pipe().adapter, HFLogitsAdapter) and not _pipe().adapter.shift_logits
    assert _pipe(dream=True).adapter.shift_logits
    assert isinstance(_pipe(adapter="dream").adapter, DreamAdapter)
    assert isinstance(_pipe(adapter=LLaDAAdapter(mask_token_id=7)).adapter, LLaDAAdapter)
    for model_type, cls in (("llada", LLaDAAdapter), ("dream", DreamAdapter), ("llada2_moe", LLaDA2Adapter)):
        fake = type("M", (), {"config": type("C", (), {"model_type": model_type})()})()
        assert isinstance(get_diffusion_lm_adapter(fake), cls)
    with pytest.raises(ValueError, match="adapter"):
        _pipe(adapter="gpt")


def test_mask_token_resolution_order_and_family_default():
    pipe = _pipe()
    assert pipe.resolve_mask_token_id() == pipe.tokenizer.mask_token_id
    assert pipe.resolve_mask_token_id(5) == 5
    pipe.model.config.mask_token_id = None
    pipe.tokenizer = None
    with pytest.raises(ValueError, match="mask_token_id"):
        pipe.resolve_mask_token_id()
    pipe.adapter.mask_token_id = 200
    assert pipe.resolve_mask_token_id() == 200


def test_all_beams_of_all_prompts_share_one_forward_per_step():
    scheduler = SOARScheduler(block_length=4, max_beam_size=2)  # position beam search: always two beams
    pipe = _pipe(scheduler)
    calls, handle = _record_forwards(pipe.model)
    try:
        out = pipe(prompt=["ab", "cd", "ef"], gen_length=8, num_inference_steps=8, eos_early_stop=False)
    finally:
        handle.remove()
    assert len(calls) == 8 == pipe.num_timesteps
    rows = [c["shape"][0] for c in calls]
    # one row per prompt, then up to two beams each (fewer where both beams of a prompt became identical)
    assert rows[0] == 3 and rows[1] == 6 and max(rows) == 6
    assert out.nfe.tolist() == [8, 8, 8]
    assert int(out.row_forwards.sum()) == sum(rows)
    assert out.sequences.shape == (3, 8) and len(out.texts) == 3


def test_threshold_decoding_finishes_early_and_counts_nfe_per_prompt():
    pipe = _pipe(SOARScheduler(block_length=8, confidence_threshold=0.0))  # every position is confident
    out = pipe(prompt=["ab", "cd"], gen_length=8, num_inference_steps=8, eos_early_stop=False, output_type="seq")
    assert out.nfe.tolist() == [1, 1] and pipe.num_timesteps == 1
    assert not (out.sequences == pipe.tokenizer.mask_token_id).any()


def test_padded_batch_matches_single_runs_with_position_ids():
    pipe = _pipe(dream=True)
    kwargs = {"gen_length": 8, "num_inference_steps": 8, "eos_early_stop": False, "output_type": "seq"}
    batch = pipe(prompt=["a", "bcdef"], **kwargs).sequences
    for i, prompt in enumerate(["a", "bcdef"]):
        assert torch.equal(batch[i], pipe(prompt=prompt, **kwargs).sequences[0])


def test_dream_adapter_passes_4d_mask_and_positions_only_when_padded():
    pipe = _pipe(adapter="dream", dream=True)
    calls, handle = _record_forwards(pipe.model)
    try:
        pipe(prompt=["ab", "cd"], gen_length=4, num_inference_steps=1, output_type="seq")
        pipe(prompt=["a", "cde"], gen_length=4, num_inference_steps=1, output_type="seq")
    finally:
        handle.remove()
    assert "attention_mask" not in calls[0] and "position_ids" not in calls[0]
    assert calls[1]["attention_mask"].shape == (2, 1, 7, 7) and calls[1]["attention_mask"].dtype == torch.bool
    assert calls[1]["position_ids"][0].tolist() == [1, 1, 0, 1, 2, 3, 4]


@pytest.mark.support_cell("diffusion_lm", "llada2")
def test_llada2_adapter_runs_on_the_window_up_to_the_current_block():
    pipe = _pipe(adapter="llada2")
    calls, handle = _record_forwards(pipe.model)
    try:
        out = pipe(prompt="ab", gen_length=8, block_length=4, num_inference_steps=6, eos_early_stop=False)
    finally:
        handle.remove()
    # blocks aligned to absolute positions, as in LLaDA2: [2, 4), [4, 8), [8, 10), two steps each
    assert [c["shape"] for c in calls] == [(1, 4)] * 2 + [(1, 8)] * 2 + [(1, 10)] * 2
    assert calls[0]["position_ids"][0].tolist() == list(range(4))
    assert out.sequences.shape == (1, 8)


def test_eos_early_stop_fills_after_the_first_eos():
    pipe = _pipe()
    eos = pipe.tokenizer.eos_token_id

    def predict_eos(module, args, output):
        output.logits[..., eos] += 100.0  # every position predicts EOS
        return output

    handle = pipe.model.register_forward_hook(predict_eos)
    try:
        out = pipe(prompt="ab", gen_length=8, num_inference_steps=8, output_type="seq")
    finally:
        handle.remove()
    assert out.sequences.tolist() == [[eos] * 8]
    assert out.nfe.tolist() == [1]


def test_chat_messages_use_the_template():
    pipe = _pipe()
    messages = [{"role": "user", "content": "hi"}]
    calls, handle = _record_forwards(pipe.model)
    try:
        pipe(messages=messages, gen_length=4, num_inference_steps=4, output_type="seq")
    finally:
        handle.remove()
    rendered = pipe.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert calls[0]["shape"] == (1, len(pipe.tokenizer(rendered, add_special_tokens=False).input_ids) + 4)


def test_from_pretrained_with_a_model_passed_in(tmp_path):
    pipe = _pipe(SOARScheduler(block_length=4, confidence_threshold=0.5, max_beam_size=2))
    pipe.save_pretrained(tmp_path)
    loaded = DiffusionLMPipeline.from_pretrained(tmp_path, model=pipe.model, adapter="llada")
    assert loaded.model is pipe.model and loaded.scheduler.config.max_beam_size == 2
    kwargs = {"prompt": "ab", "gen_length": 8, "num_inference_steps": 8, "output_type": "seq"}
    loaded.set_progress_bar_config(disable=True)
    assert torch.equal(loaded(**kwargs).sequences, pipe(**kwargs).sequences)


def test_registry_separates_text_and_image_output_types():
    from diffusers_ext.testing import get_dummy_spec, register_dummy_pipeline

    spec = get_dummy_spec(DiffusionLMPipeline)
    assert spec.is_text and spec.comparison_output_type == "seq"

    class _Unregistered(DiffusionLMPipeline):
        pass

    with pytest.raises(ValueError, match="mixes image and text"):
        register_dummy_pipeline(_Unregistered, spec.components_fn, spec.inputs_fn, output_types=("seq", "np"))
    with pytest.raises(ValueError, match="must include 'seq'"):
        register_dummy_pipeline(_Unregistered, spec.components_fn, spec.inputs_fn, output_types=("text",))


@pytest.mark.parametrize(
    "family",
    [
        pytest.param("dream", marks=pytest.mark.support_cell("diffusion_lm", "dream", dtype="bfloat16")),
        pytest.param("llada2", marks=pytest.mark.support_cell("diffusion_lm", "llada2", dtype="bfloat16")),
    ],
)
def test_a_bf16_model_decodes_every_masked_position(family):
    """Dream and LLaDA2 run in bfloat16 by their users: the model sees bfloat16 logits end to end and SOAR still
    fills every masked position with a token."""
    pipe = _pipe(adapter="llada2" if family == "llada2" else None, dream=family == "dream")
    pipe.model.to(torch.bfloat16)
    dtypes = []
    handle = pipe.model.register_forward_hook(lambda module, args, output: dtypes.append(output.logits.dtype))
    try:
        out = pipe(prompt="ab", gen_length=8, block_length=4, num_inference_steps=6, eos_early_stop=False)
    finally:
        handle.remove()
    assert dtypes and set(dtypes) == {torch.bfloat16}
    assert out.sequences.shape == (1, 8)
    assert not bool((out.sequences == pipe.tokenizer.mask_token_id).any())
