"""diffusers_ext.testing: the tiny builders, the dummy registry, and that the conformance suites catch real faults."""

import ast
import inspect
import os

import numpy as np
import pytest
import torch
from diffusers import DDIMScheduler, DiffusionPipeline, StableDiffusion3Pipeline, StableDiffusionPipeline
from diffusers.configuration_utils import register_to_config
from transformers import AutoModelForCausalLM, AutoTokenizer

import diffusers_ext
from diffusers_ext import ClassConditionalDDPMPipeline, DIRPPipeline, SemanticNVSPipeline, testing
from diffusers_ext.testing import (
    BadInput,
    PipelineConformanceTests,
    SchedulerConformanceTests,
    count_module_forwards,
    get_dummy_batch_inputs,
    get_dummy_components,
    get_dummy_inputs,
    get_dummy_spec,
    get_tiny_clip_tokenizer,
    get_tiny_dream_like_lm,
    get_tiny_llada_like_lm,
    get_tiny_lm_tokenizer,
    get_tiny_pixel_unet,
    get_tiny_sd3_components,
    get_tiny_sd_components,
    get_tiny_t5_tokenizer,
    output_to_numpy,
    register_dummy_pipeline,
    registered_pipelines,
)
from diffusers_ext.testing.dummies import class_conditional as dummies


def _state_dicts(components: dict) -> dict[str, dict[str, torch.Tensor]]:
    return {name: c.state_dict() for name, c in components.items() if isinstance(c, torch.nn.Module)}


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[n].keys() == b[n].keys() and all(torch.equal(a[n][k], b[n][k]) for k in a[n]) for n in a
    )


# ---------------------------------------------------------------------------------------------------------------------
# builders
# ---------------------------------------------------------------------------------------------------------------------


def test_tiny_sd_components_run_stable_diffusion():
    components = get_tiny_sd_components(seed=0)
    pipe = StableDiffusionPipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    with count_module_forwards(pipe) as counts:
        images = pipe(
            ["a photo of a cat", "A red car, parked!"],
            negative_prompt=["blurry", "dark"],
            num_inference_steps=2,
            guidance_scale=5.0,
            generator=torch.Generator("cpu").manual_seed(0),
            output_type="np",
        ).images
    assert images.shape == (2, 32, 32, 3)
    assert np.isfinite(images).all() and images.std() > 0
    assert counts["unet"] == 2 and counts["text_encoder"] == 2  # CFG: one batched UNet call per step
    assert len(components["tokenizer"]) <= components["text_encoder"].config.vocab_size


def test_tiny_sd3_components_run_stable_diffusion_3():
    pipe = StableDiffusion3Pipeline(**get_tiny_sd3_components(seed=0))
    pipe.set_progress_bar_config(disable=True)
    with count_module_forwards(pipe) as counts:
        images = pipe(
            "a photo of a cat",
            num_inference_steps=2,
            guidance_scale=4.0,
            generator=torch.Generator("cpu").manual_seed(0),
            output_type="np",
            max_sequence_length=32,
        ).images
    assert images.shape == (1, 32, 32, 3)
    assert np.isfinite(images).all() and images.std() > 0
    # all three text encoders ran (prompt and negative prompt), and the transformer once per step (batched CFG)
    assert counts["text_encoder"] == counts["text_encoder_2"] == counts["text_encoder_3"] == 2
    assert counts["transformer"] == 2


def test_tiny_sd3_latents_match_the_transformer():
    components = get_tiny_sd3_components(seed=0)
    assert components["vae"].config.latent_channels == components["transformer"].config.in_channels
    clip_width = components["text_encoder"].config.hidden_size + components["text_encoder_2"].config.hidden_size
    assert clip_width <= components["text_encoder_3"].config.d_model
    assert components["text_encoder_3"].config.d_model == components["transformer"].config.joint_attention_dim
    pooled = components["text_encoder"].config.projection_dim + components["text_encoder_2"].config.projection_dim
    assert pooled == components["transformer"].config.pooled_projection_dim


@pytest.mark.parametrize(
    "builder",
    [
        get_tiny_sd_components,
        get_tiny_sd3_components,
        lambda seed: {"unet": get_tiny_pixel_unet(seed=seed, num_class_embeds=4)},
        lambda seed: {"lm": get_tiny_llada_like_lm(seed=seed)[0]},
        lambda seed: {"lm": get_tiny_dream_like_lm(seed=seed)[0]},
    ],
    ids=["sd", "sd3", "pixel_unet", "llada_like", "dream_like"],
)
def test_builders_are_seeded_and_leave_the_global_rng_alone(builder):
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    first = _state_dicts(builder(seed=0))
    assert torch.equal(torch.rand(3), expected_next), "the builder consumed the global torch RNG"
    assert _same_weights(first, _state_dicts(builder(seed=0)))
    assert not _same_weights(first, _state_dicts(builder(seed=1)))


def test_builder_models_are_in_eval_mode():
    modules = [c for c in get_tiny_sd_components().values() if isinstance(c, torch.nn.Module)]
    modules += [c for c in get_tiny_sd3_components().values() if isinstance(c, torch.nn.Module)]
    modules += [get_tiny_pixel_unet(), get_tiny_llada_like_lm()[0], get_tiny_dream_like_lm()[0]]
    assert all(not m.training for m in modules)


@pytest.mark.parametrize("num_class_embeds", [None, 5])
def test_tiny_pixel_unet_shapes(num_class_embeds):
    unet = get_tiny_pixel_unet(seed=0, sample_size=16, in_channels=3, num_class_embeds=num_class_embeds)
    sample = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    labels = None if num_class_embeds is None else torch.tensor([0, 4])
    with torch.no_grad():
        out = unet(sample, 10, class_labels=labels).sample
    assert out.shape == (2, 3, 16, 16)
    assert unet.config.num_class_embeds == num_class_embeds


def test_tiny_pixel_unet_rejects_odd_sample_size():
    with pytest.raises(ValueError, match="sample_size"):
        get_tiny_pixel_unet(sample_size=7)


LM_BUILDERS = [(get_tiny_llada_like_lm, False, "llama"), (get_tiny_dream_like_lm, True, "qwen2")]
LM_IDS = ["llada_like", "dream_like"]


@pytest.mark.parametrize("builder, shift_logits, model_type", LM_BUILDERS, ids=LM_IDS)
def test_tiny_lm_logits_shape_and_convention_flags(builder, shift_logits, model_type):
    model, tokenizer = builder(seed=0)
    batch = tokenizer(["2+2=4", "hello there"], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    assert logits.shape == (2, batch.input_ids.shape[1], len(tokenizer))
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.shift_logits is shift_logits
    assert model.config.is_causal is False
    assert model.config.mask_token_id == tokenizer.mask_token_id == tokenizer.convert_tokens_to_ids("<|mask|>")
    assert model.config.pad_token_id == tokenizer.pad_token_id
    assert model.config.model_type == model_type


@pytest.mark.parametrize("builder, shift_logits, model_type", LM_BUILDERS, ids=LM_IDS)
def test_tiny_lm_attention_is_bidirectional(builder, shift_logits, model_type):
    model, tokenizer = builder(seed=0)
    ids = tokenizer("the cat sat on the mat", return_tensors="pt").input_ids
    changed = ids.clone()
    changed[0, -1] = tokenizer.mask_token_id
    with torch.no_grad():
        before, after = model(input_ids=ids).logits, model(input_ids=changed).logits
    # every earlier position sees the change of the last token
    assert (before[0, :-1] - after[0, :-1]).abs().amax(dim=-1).min() > 1e-6
    with torch.no_grad():
        with_mask = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    torch.testing.assert_close(with_mask, before)


@pytest.mark.parametrize("builder, shift_logits, model_type", LM_BUILDERS, ids=LM_IDS)
def test_tiny_lm_ignores_masked_out_positions(builder, shift_logits, model_type):
    model, tokenizer = builder(seed=0)
    ids = tokenizer("abcdef", return_tensors="pt").input_ids
    attention_mask = torch.ones_like(ids)
    attention_mask[0, 2] = 0
    changed = ids.clone()
    changed[0, 2] = tokenizer.mask_token_id
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=attention_mask).logits
        after = model(input_ids=changed, attention_mask=attention_mask).logits
    keep = attention_mask[0].bool()
    torch.testing.assert_close(after[0, keep], before[0, keep])


@pytest.mark.parametrize("builder, shift_logits, model_type", LM_BUILDERS, ids=LM_IDS)
def test_tiny_lm_save_load_round_trip(builder, shift_logits, model_type, tmp_path):
    model, tokenizer = builder(seed=0)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    loaded_tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert type(loaded) is type(model)
    assert loaded.config.shift_logits is shift_logits and loaded.config.is_causal is False
    assert loaded.config.mask_token_id == loaded_tokenizer.mask_token_id == tokenizer.mask_token_id
    text = "What is 3 + 4?"
    assert loaded_tokenizer(text).input_ids == tokenizer(text).input_ids
    ids = tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


# ---------------------------------------------------------------------------------------------------------------------
# tokenizers
# ---------------------------------------------------------------------------------------------------------------------


def test_clip_tokenizer_handles_arbitrary_prompts(tmp_path):
    tokenizer = get_tiny_clip_tokenizer()
    text = "a photo of an astronaut riding a horse on mars"
    ids = tokenizer(text).input_ids
    assert ids[0] == tokenizer.bos_token_id and ids[-1] == tokenizer.eos_token_id
    assert tokenizer.unk_token_id not in ids[1:-1]
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    # lowercased, digits and punctuation split off as in CLIP; non-ASCII text is spelled in bytes, never <unk>
    assert tokenizer.decode(tokenizer("Zürich 1999!").input_ids, skip_special_tokens=True) == "zürich 1 9 9 9 !"
    padded = tokenizer(text, padding="max_length", max_length=tokenizer.model_max_length).input_ids
    assert len(padded) == 77 and padded[-1] == tokenizer.pad_token_id
    tokenizer.save_pretrained(tmp_path)
    assert type(tokenizer).from_pretrained(tmp_path)(text).input_ids == ids


def test_t5_tokenizer_handles_arbitrary_prompts(tmp_path):
    tokenizer = get_tiny_t5_tokenizer()
    text = "A photo of a Cat, sitting on 3 red chairs (quietly)."
    ids = tokenizer(text).input_ids
    assert ids[-1] == tokenizer.eos_token_id
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert len(tokenizer("a photo").input_ids) == 3  # whole-word pieces
    tokenizer.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path)(text).input_ids == ids


def test_lm_tokenizer_round_trips_text_and_has_special_tokens(tmp_path):
    tokenizer = get_tiny_lm_tokenizer()
    for text in ["Hello, world!", "  two  spaces\nand a newline", "naïve café: 3*7=21"]:
        assert tokenizer.decode(tokenizer(text).input_ids) == text
    special_ids = [tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.mask_token_id]
    assert len(set(special_ids)) == 4 and None not in special_ids
    assert tokenizer("a<|mask|><|mask|>b").input_ids[1:3] == [tokenizer.mask_token_id] * 2
    assert tokenizer.padding_side == "left"
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded.mask_token_id == tokenizer.mask_token_id and reloaded.chat_template == tokenizer.chat_template


def test_lm_tokenizer_chat_template():
    tokenizer = get_tiny_lm_tokenizer()
    messages = [{"role": "user", "content": "What is 2+2?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|bos|><|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ids[0] == tokenizer.bos_token_id
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 2


# ---------------------------------------------------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------------------------------------------------


class _UnregisteredPipeline(DiffusionPipeline):
    def __init__(self, unet):
        super().__init__()
        self.register_modules(unet=unet)


def test_unregistered_pipeline_raises_naming_the_class():
    for lookup in (get_dummy_spec, get_dummy_components, get_dummy_inputs, get_dummy_batch_inputs):
        with pytest.raises(ValueError, match="_UnregisteredPipeline.*register_dummy_pipeline"):
            lookup(_UnregisteredPipeline)


def test_register_rejects_bad_arguments():
    with pytest.raises(TypeError, match="pipeline_class"):
        register_dummy_pipeline(DDIMScheduler, dummies.get_components, dummies.get_inputs)
    with pytest.raises(TypeError, match="inputs_fn"):
        register_dummy_pipeline(_UnregisteredPipeline, dummies.get_components, None)
    with pytest.raises(TypeError, match="batch_params"):
        register_dummy_pipeline(_UnregisteredPipeline, dummies.get_components, dummies.get_inputs, batch_params="ab")
    with pytest.raises(ValueError, match="output_types"):
        register_dummy_pipeline(
            _UnregisteredPipeline, dummies.get_components, dummies.get_inputs, output_types=("np", "jpeg")
        )
    with pytest.raises(TypeError, match="bad_inputs"):
        register_dummy_pipeline(
            _UnregisteredPipeline, dummies.get_components, dummies.get_inputs, bad_inputs=[("steps", 0)]
        )
    with pytest.raises(TypeError, match="bad_inputs"):
        register_dummy_pipeline(
            _UnregisteredPipeline, dummies.get_components, dummies.get_inputs, bad_inputs=[({"a": 1}, "a", "b")]
        )
    with pytest.raises(ValueError, match="_UnregisteredPipeline"):
        get_dummy_spec(_UnregisteredPipeline)


def test_registration_records_the_registering_module():
    assert get_dummy_spec(ClassConditionalDDPMPipeline).module == dummies.__name__
    assert get_dummy_spec(_SkipsValidation).module == __name__


def test_every_public_pipeline_is_registered():
    public_pipelines = []
    for names in diffusers_ext._import_structure.values():
        for name in names:
            obj = getattr(diffusers_ext, name)
            if isinstance(obj, type) and issubclass(obj, DiffusionPipeline) and obj is not DiffusionPipeline:
                public_pipelines.append(obj)
    assert ClassConditionalDDPMPipeline in public_pipelines
    registered = registered_pipelines()
    missing = [cls.__name__ for cls in public_pipelines if cls not in registered]
    assert not missing, f"public pipelines without a dummy setup: {missing}"


def test_dummy_components_and_inputs_work_and_are_seeded():
    pipe = ClassConditionalDDPMPipeline(**get_dummy_components(ClassConditionalDDPMPipeline, seed=0))
    pipe.set_progress_bar_config(disable=True)
    images = pipe(**get_dummy_inputs(ClassConditionalDDPMPipeline, seed=0)).images
    assert images.shape == (1, 8, 8, 1)
    other = _state_dicts(get_dummy_components(ClassConditionalDDPMPipeline, seed=1))
    assert not _same_weights(_state_dicts(pipe.components), other)
    inputs = get_dummy_inputs(ClassConditionalDDPMPipeline, seed=5)
    assert inputs["generator"].initial_seed() == 5 and inputs["output_type"] == "np"
    assert inputs["guidance_scale"] > 1


def test_dummy_batch_inputs_combine_per_image_arguments():
    batch = get_dummy_batch_inputs(ClassConditionalDDPMPipeline, seeds=(0, 1, 2))
    assert batch["class_labels"] == [0, 1, 2]
    assert [g.initial_seed() for g in batch["generator"]] == [0, 1, 2]
    assert batch["num_inference_steps"] == 2 and batch["output_type"] == "np"


class _CountBatchedPipeline(ClassConditionalDDPMPipeline):
    pass


def test_dummy_batch_inputs_set_a_batch_size_param_to_the_number_of_seeds():
    def inputs(seed: int = 0, count: int = 1) -> dict:
        return {**dummies.get_inputs(seed), "class_labels": [1], "batch_size": count}

    register_dummy_pipeline(_CountBatchedPipeline, dummies.get_components, inputs, batch_size_param="batch_size")
    batch = get_dummy_batch_inputs(_CountBatchedPipeline, seeds=(0, 1, 2))
    assert batch["batch_size"] == 3 and len(batch["generator"]) == 3 and batch["class_labels"] == [1]
    register_dummy_pipeline(
        _CountBatchedPipeline, dummies.get_components, lambda seed=0: inputs(seed, 2), batch_size_param="batch_size"
    )
    with pytest.raises(ValueError, match="batch_size_param"):
        get_dummy_batch_inputs(_CountBatchedPipeline)


class _SeedDependentStepsPipeline(ClassConditionalDDPMPipeline):
    pass


def _inputs_with_seed_dependent_steps(seed: int = 0) -> dict:
    return {**dummies.get_inputs(seed), "num_inference_steps": 2 + seed, "latents": torch.zeros(1, 1, 8, 8) + seed}


def test_dummy_batch_inputs_reject_a_per_image_argument_missing_from_batch_params():
    register_dummy_pipeline(
        _SeedDependentStepsPipeline,
        dummies.get_components,
        _inputs_with_seed_dependent_steps,
        batch_params=("class_labels", "latents"),
        bad_inputs=dummies.BAD_INPUTS,
    )
    with pytest.raises(ValueError, match="num_inference_steps"):
        get_dummy_batch_inputs(_SeedDependentStepsPipeline)


def test_output_to_numpy_conversions():
    array = np.zeros((2, 4, 4, 3), dtype=np.float32)
    assert output_to_numpy((array,)) is array
    assert output_to_numpy(torch.ones(2, 3, dtype=torch.bfloat16)).dtype == np.float32
    pil = ClassConditionalDDPMPipeline.numpy_to_pil(array)
    assert output_to_numpy(pil).shape == (2, 4, 4, 3)
    assert output_to_numpy(["a", "bc"]).tolist() == ["a", "bc"]
    with pytest.raises(TypeError, match="dict"):
        output_to_numpy({"images": array})


def test_count_module_forwards_counts_and_removes_hooks():
    pipe = ClassConditionalDDPMPipeline(**get_dummy_components(ClassConditionalDDPMPipeline))
    pipe.set_progress_bar_config(disable=True)
    with count_module_forwards(pipe) as counts:
        pipe(**get_dummy_inputs(ClassConditionalDDPMPipeline))
    assert counts == {"unet": 2}
    assert not pipe.unet._forward_pre_hooks


# ---------------------------------------------------------------------------------------------------------------------
# the conformance suites catch faults
# ---------------------------------------------------------------------------------------------------------------------


class _SkipsValidation(ClassConditionalDDPMPipeline):
    """Validates nothing: bad arguments reach the model."""

    def check_inputs(self, class_labels, *args):
        return None if class_labels is None else torch.as_tensor(class_labels).long().reshape(-1)


class _SharesOneGenerator(ClassConditionalDDPMPipeline):
    """Draws every image of a batch from the first generator."""

    def __call__(self, *args, generator=None, **kwargs):
        if isinstance(generator, list):
            generator = generator[0]
        return super().__call__(*args, generator=generator, **kwargs)


class _IgnoresGenerator(ClassConditionalDDPMPipeline):
    """Ignores `generator`, so equal seeds give different outputs."""

    def __call__(self, *args, generator=None, **kwargs):
        return super().__call__(*args, generator=None, **kwargs)


class _IgnoresCallbackOutputs(ClassConditionalDDPMPipeline):
    """Calls the callback but drops the tensors it returns."""

    def __call__(self, *args, callback_on_step_end=None, **kwargs):
        if callback_on_step_end is not None:
            user_callback = callback_on_step_end

            def callback_on_step_end(pipe, step, timestep, callback_kwargs):
                user_callback(pipe, step, timestep, callback_kwargs)
                return {}

        return super().__call__(*args, callback_on_step_end=callback_on_step_end, **kwargs)


class _NoProgressBar(ClassConditionalDDPMPipeline):
    """Never shows a progress bar."""

    def progress_bar(self, iterable=None, total=None):
        return iterable


class _PtNotInUnitRange(ClassConditionalDDPMPipeline):
    """Returns `"pt"` images in [-1, 1] instead of [0, 1]."""

    def __call__(self, *args, output_type="pil", **kwargs):
        output = super().__call__(*args, output_type=output_type, **kwargs)
        if output_type == "pt":
            output.images = output.images * 2 - 1
        return output


class _ReturnsList(ClassConditionalDDPMPipeline):
    """Returns a list instead of a tuple when `return_dict=False`."""

    def __call__(self, *args, return_dict=True, **kwargs):
        output = super().__call__(*args, return_dict=return_dict, **kwargs)
        return output if return_dict else list(output)


class _DropsVariant(ClassConditionalDDPMPipeline):
    """Saves without the requested variant and serialization (what MultiDenoiserModel did)."""

    def save_pretrained(self, save_directory, safe_serialization=True, variant=None, **kwargs):
        super().save_pretrained(save_directory, **kwargs)


class _IgnoresNumImagesPerPrompt(ClassConditionalDDPMPipeline):
    """Takes `num_images_per_prompt` but makes one image per label, from the first generator."""

    def __call__(self, *args, num_images_per_prompt=1, generator=None, **kwargs):
        if isinstance(generator, list):
            generator = generator[0]
        return super().__call__(*args, generator=generator, **kwargs)


class _GuidanceReadOnce(ClassConditionalDDPMPipeline):
    """Reads the guidance scale given to the call, not the one a callback sets."""

    def __call__(self, *args, guidance_scale=1.0, **kwargs):
        self._call_guidance = float(guidance_scale)
        return super().__call__(*args, guidance_scale=guidance_scale, **kwargs)

    @property
    def guidance_scale(self):
        return self._call_guidance


class _IgnoresInterrupt(ClassConditionalDDPMPipeline):
    """Never stops when a callback sets `_interrupt`."""

    @property
    def interrupt(self):
        return False


_BROKEN = (
    _SkipsValidation,
    _SharesOneGenerator,
    _IgnoresGenerator,
    _IgnoresCallbackOutputs,
    _NoProgressBar,
    _PtNotInUnitRange,
    _ReturnsList,
    _DropsVariant,
    _IgnoresNumImagesPerPrompt,
    _GuidanceReadOnce,
    _IgnoresInterrupt,
)
for _cls in _BROKEN:
    register_dummy_pipeline(
        _cls,
        dummies.get_components,
        dummies.get_inputs,
        batch_params=("class_labels",),
        bad_inputs=dummies.BAD_INPUTS,
    )


def _suite_for(pipeline_class):
    return type(
        f"_Conformance{pipeline_class.__name__}", (PipelineConformanceTests,), {"pipeline_class": pipeline_class}
    )()


@pytest.mark.parametrize(
    "pipeline_class, check, message",
    [
        (_SkipsValidation, "test_bad_inputs_raise_before_any_forward", "bad input"),
        (_SharesOneGenerator, "test_batch_matches_single_runs", "batch item 1"),
        (_IgnoresGenerator, "test_same_seed_same_output_different_seed_different_output", "same seed"),
        (_IgnoresCallbackOutputs, "test_callback_can_replace_tensor", "did not change"),
        (_PtNotInUnitRange, "test_output_types", "'pt' images"),
        (_ReturnsList, "test_return_dict_false_matches_output", "not a tuple"),
        (_SkipsValidation, "test_model_index_names_our_classes", "decorate it with"),
        (_DropsVariant, "test_save_load_variant", "ignore them"),
        (_IgnoresNumImagesPerPrompt, "test_num_images_per_prompt", "gave 1 outputs"),
        (_GuidanceReadOnce, "test_callback_can_change_guidance", "after 2 callback increments"),
        (_IgnoresInterrupt, "test_callback_can_interrupt", "still ran"),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else None,
)
def test_pipeline_suite_catches_faults(pipeline_class, check, message, tmp_path):
    suite = _suite_for(pipeline_class)
    kwargs = {"tmp_path": tmp_path} if "tmp_path" in inspect.signature(getattr(suite, check)).parameters else {}
    with pytest.raises(AssertionError, match=message):
        getattr(suite, check)(**kwargs)


class _RaggedSharesOneGenerator(SemanticNVSPipeline):
    """Draws every scene of a batch from the first generator; equal-size scenes are fine, ragged ones are not."""

    def __call__(self, *args, generator=None, **kwargs):
        if isinstance(generator, list) and isinstance(kwargs.get("images"), list) and len(generator) > 1:
            generator = generator[0]
        return super().__call__(*args, generator=generator, **kwargs)


class _IgnoresPromptEmbeds(DIRPPipeline):
    """Takes `prompt_embeds` but conditions on the empty prompt instead."""

    def __call__(self, *args, prompt_embeds=None, **kwargs):
        if prompt_embeds is not None and kwargs.get("prompt") is None:
            kwargs["prompt"] = ""
        return super().__call__(*args, **kwargs)


def _register_like(broken, original):
    spec = get_dummy_spec(original)
    register_dummy_pipeline(
        broken,
        spec.components_fn,
        spec.inputs_fn,
        batch_params=spec.batch_params,
        output_types=spec.output_types,
        bad_inputs=spec.bad_inputs,
        callback_edit_tensor=spec.callback_edit_tensor,
        ragged_inputs_fn=spec.ragged_inputs_fn,
    )
    return broken


def test_pipeline_suite_catches_a_ragged_batch_that_differs_from_single_runs():
    broken = _register_like(_RaggedSharesOneGenerator, SemanticNVSPipeline)
    with pytest.raises(AssertionError, match="ragged batch item 1"):
        _suite_for(broken).test_ragged_batch_matches_single_runs()


def test_pipeline_suite_catches_ignored_prompt_embeds():
    broken = _register_like(_IgnoresPromptEmbeds, DIRPPipeline)
    with pytest.raises(AssertionError, match="prompt_embeds from encode_prompt"):
        _suite_for(broken).test_prompt_embeds_match_prompt()


def test_pipeline_suite_catches_a_missing_progress_bar(capfd):
    with pytest.raises(AssertionError, match="no progress bar"):
        _suite_for(_NoProgressBar).test_progress_bar_shows_by_default_and_can_be_disabled(capfd)


def _register_probe(bad_input: BadInput) -> type:
    """A fresh copy of ClassConditionalDDPMPipeline registered with one bad input."""
    probe = type("_Probe", (ClassConditionalDDPMPipeline,), {})
    register_dummy_pipeline(probe, dummies.get_components, dummies.get_inputs, bad_inputs=[bad_input])
    return probe


def test_pipeline_suite_catches_a_bad_input_that_fails_after_a_forward():
    def failing_callback(pipe, step, timestep, callback_kwargs):
        raise ZeroDivisionError("raised inside the denoising loop")

    probe = _register_probe(BadInput({"callback_on_step_end": failing_callback}, "callback_on_step_end"))
    with pytest.raises(AssertionError, match="ZeroDivisionError"):
        _suite_for(probe).test_bad_inputs_raise_before_any_forward()


def test_pipeline_suite_catches_an_error_not_naming_the_argument():
    probe = _register_probe(BadInput({"num_inference_steps": 0}, "guidance_scale"))
    with pytest.raises(AssertionError, match="does not name 'guidance_scale'"):
        _suite_for(probe).test_bad_inputs_raise_before_any_forward()


def test_pipeline_suite_catches_a_bad_input_that_does_not_raise():
    probe = _register_probe(BadInput({"num_inference_steps": 3}, "num_inference_steps"))
    with pytest.raises(AssertionError, match="did not raise"):
        _suite_for(probe).test_bad_inputs_raise_before_any_forward()


class _TupleDropsFields(DDIMScheduler):
    """`step(..., return_dict=False)` returns only the first field."""

    def step(self, *args, return_dict=True, **kwargs):
        output = super().step(*args, return_dict=True, **kwargs)
        return output if return_dict else (output.prev_sample,)


class _ExtraTimestep(DDIMScheduler):
    """`set_timesteps(n)` gives n + 1 timesteps."""

    def set_timesteps(self, num_inference_steps, device=None):
        super().set_timesteps(num_inference_steps, device=device)
        self.timesteps = torch.cat([self.timesteps, self.timesteps[-1:]])


class _LosesConfig(DDIMScheduler):
    """`from_config` drops the configured schedule."""

    @classmethod
    def from_config(cls, config=None, **kwargs):
        return cls()


class _TupleConfigBecomesList(DDIMScheduler):
    """A tuple config entry that JSON turns into a list on reload (what `sde_window` did)."""

    @register_to_config
    def __init__(self, window: tuple = (1, 3), **kwargs):
        super().__init__(**kwargs)


class _UnknownCompatible(DDIMScheduler):
    """Lists a compatible scheduler that exists nowhere."""

    _compatibles = ["NoSuchScheduler"]


@pytest.mark.parametrize(
    "scheduler_class, check, message",
    [
        (_TupleConfigBecomesList, "test_config_types_survive_save_load", "window"),
        (_UnknownCompatible, "test_compatibles_resolve_and_round_trip", "NoSuchScheduler"),
        (_TupleDropsFields, "test_step_return_dict_false_matches_output_fields", "tuple of 1"),
        (_ExtraTimestep, "test_set_timesteps_gives_requested_length", "gave 2 timesteps"),
        (_LosesConfig, "test_from_config_round_trip", "beta_schedule"),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else None,
)
def test_scheduler_suite_catches_faults(scheduler_class, check, message, tmp_path):
    suite = type(
        "_SchedulerSuite",
        (SchedulerConformanceTests,),
        {"scheduler_class": scheduler_class, "scheduler_config": {"beta_schedule": "scaled_linear"}},
    )()
    kwargs = {"tmp_path": tmp_path} if "tmp_path" in inspect.signature(getattr(suite, check)).parameters else {}
    with pytest.raises(AssertionError, match=message):
        getattr(suite, check)(**kwargs)


def test_testing_module_is_not_part_of_the_lazy_api():
    assert "testing" not in diffusers_ext._import_structure
    assert testing.__name__ == "diffusers_ext.testing"


def test_testing_package_does_not_import_pytest():
    package_dir = os.path.dirname(testing.__file__)
    imported = set()
    for root, _, names in os.walk(package_dir):
        for name in names:
            if name.endswith(".py"):
                with open(os.path.join(root, name), encoding="utf-8") as f:
                    tree = ast.parse(f.read())
                imported |= {
                    alias.name.split(".")[0]
                    for node in ast.walk(tree)
                    if isinstance(node, ast.Import)
                    for alias in node.names
                }
                imported |= {
                    node.module.split(".")[0]
                    for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and node.module and not node.level
                }
    assert "torch" in imported  # the walk did read the kit's modules
    assert "pytest" not in imported
