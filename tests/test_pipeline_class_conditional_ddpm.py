"""ClassConditionalDDPMPipeline: the conformance suite plus behaviour specific to class conditioning."""

import numpy as np
import pytest
import torch
from diffusers import DDIMScheduler

from diffusers_ext import ClassConditionalDDPMPipeline
from diffusers_ext.testing import (
    PipelineConformanceTests,
    count_module_forwards,
    get_dummy_components,
    get_dummy_inputs,
    get_tiny_pixel_unet,
)
from diffusers_ext.testing.dummies import class_conditional as dummies


class TestClassConditionalDDPMPipeline(PipelineConformanceTests):
    pipeline_class = ClassConditionalDDPMPipeline


def _pipeline(**component_overrides) -> ClassConditionalDDPMPipeline:
    components = get_dummy_components(ClassConditionalDDPMPipeline, seed=0)
    components.update(component_overrides)
    pipe = ClassConditionalDDPMPipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _record_unet_class_labels(pipe: ClassConditionalDDPMPipeline) -> tuple[list, torch.utils.hooks.RemovableHandle]:
    """Record the `(sample batch size, class_labels)` of every UNet call."""
    calls = []

    def hook(module, args, kwargs):
        labels = kwargs.get("class_labels")
        calls.append((args[0].shape[0], None if labels is None else labels.tolist()))

    return calls, pipe.unet.register_forward_pre_hook(hook, with_kwargs=True)


def test_guidance_without_null_class_raises_before_any_forward():
    pipe = _pipeline(null_class_label=None)
    with count_module_forwards(pipe) as counts:
        with pytest.raises(ValueError, match="guidance_scale"):
            pipe(**get_dummy_inputs(ClassConditionalDDPMPipeline, seed=0))
    assert counts == {"unet": 0}


def test_class_conditional_unet_without_labels_or_null_class_raises():
    pipe = _pipeline(null_class_label=None)
    with pytest.raises(ValueError, match="class_labels"):
        pipe(class_labels=None, batch_size=1, num_inference_steps=2, guidance_scale=1.0, output_type="np")


def test_guidance_runs_null_and_conditional_branches_in_one_batch():
    pipe = _pipeline()
    calls, handle = _record_unet_class_labels(pipe)
    try:
        pipe(**get_dummy_inputs(ClassConditionalDDPMPipeline, seed=1))
        guided = list(calls)
        calls.clear()
        pipe(**{**get_dummy_inputs(ClassConditionalDDPMPipeline, seed=1), "guidance_scale": 1.0})
        unguided = list(calls)
    finally:
        handle.remove()
    null = dummies.NULL_CLASS_LABEL
    assert guided == [(2, [null, 1])] * 2
    assert unguided == [(1, [1])] * 2


def test_unconditional_sampling_uses_the_null_class():
    pipe = _pipeline()
    calls, handle = _record_unet_class_labels(pipe)
    try:
        images = pipe(
            class_labels=None,
            batch_size=2,
            num_inference_steps=2,
            guidance_scale=1.0,
            generator=torch.Generator("cpu").manual_seed(0),
            output_type="np",
        ).images
    finally:
        handle.remove()
    assert images.shape == (2, dummies.SAMPLE_SIZE, dummies.SAMPLE_SIZE, 1)
    assert np.isfinite(images).all()
    assert calls == [(2, [dummies.NULL_CLASS_LABEL] * 2)] * 2


def test_unconditional_unet_samples_and_rejects_labels():
    unet = get_tiny_pixel_unet(seed=0, sample_size=8, in_channels=1, num_class_embeds=None)
    pipe = ClassConditionalDDPMPipeline(unet=unet, scheduler=DDIMScheduler(num_train_timesteps=100))
    pipe.set_progress_bar_config(disable=True)
    images = pipe(
        batch_size=3, num_inference_steps=2, generator=torch.Generator("cpu").manual_seed(0), output_type="pt"
    )
    assert images.images.shape == (3, 1, 8, 8)
    with pytest.raises(ValueError, match="class_labels"):
        pipe(class_labels=[0], num_inference_steps=2, output_type="np")


@pytest.mark.support_cell("class_conditional", "pack")
def test_class_labels_change_the_output():
    pipe = _pipeline()
    inputs = get_dummy_inputs(ClassConditionalDDPMPipeline, seed=0)
    first = pipe(**{**inputs, "class_labels": [0], "generator": torch.Generator("cpu").manual_seed(0)}).images
    second = pipe(**{**inputs, "class_labels": [1], "generator": torch.Generator("cpu").manual_seed(0)}).images
    assert np.abs(first - second).max() > 1e-4


def test_int_and_tensor_class_labels_match_a_list():
    pipe = _pipeline()
    inputs = get_dummy_inputs(ClassConditionalDDPMPipeline, seed=0)
    outputs = []
    for labels in ([2], 2, torch.tensor([2])):
        outputs.append(
            pipe(**{**inputs, "class_labels": labels, "generator": torch.Generator().manual_seed(0)}).images
        )
    np.testing.assert_array_equal(outputs[0], outputs[1])
    np.testing.assert_array_equal(outputs[0], outputs[2])
