import numpy as np
import torch

from diffusers_ext import SemanticNVSPipeline
from diffusers_ext.testing import PipelineConformanceTests, get_dummy_components, get_dummy_inputs


class TestSemanticNVSPipelineConformance(PipelineConformanceTests):
    pipeline_class = SemanticNVSPipeline


def _pipe():
    pipe = SemanticNVSPipeline(**get_dummy_components(SemanticNVSPipeline))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_each_semantic_mode_runs_and_they_differ():
    pipe = _pipe()
    outputs = {}
    for mode in ("none", "warped", "iterative", "warped+iterative"):
        inputs = get_dummy_inputs(SemanticNVSPipeline, seed=0)
        inputs.update(semantic_mode=mode, num_inference_steps=3)
        result = pipe(**inputs)
        outputs[mode] = result.images
        assert result.images.shape == (1, 2, 16, 16, 3)
        assert result.coverage.any() == ("warped" in mode)
    for a in outputs:
        for b in outputs:
            if a < b:
                assert not np.allclose(outputs[a], outputs[b]), (a, b)


def test_iterative_features_come_from_the_current_estimate():
    pipe = _pipe()
    seen = []
    original = pipe.encode_semantics

    def recording(images):
        seen.append(images.shape[0])
        return original(images)

    pipe.encode_semantics = recording
    inputs = get_dummy_inputs(SemanticNVSPipeline, seed=0)
    inputs.update(semantic_mode="iterative", num_inference_steps=3)
    pipe(**inputs)
    # once for the input view, then once per step for the two target views' estimates
    assert seen == [1, 2, 2, 2]


def test_mode_none_needs_no_encoder_or_depth():
    components = get_dummy_components(SemanticNVSPipeline)
    components["semantic_encoder"] = None
    pipe = SemanticNVSPipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    inputs = get_dummy_inputs(SemanticNVSPipeline, seed=0)
    inputs.update(semantic_mode="none", depths=None)
    assert pipe(**inputs).images.shape == (1, 2, 16, 16, 3)
    inputs["semantic_mode"] = "warped"
    try:
        pipe(**inputs)
    except ValueError as error:
        assert "semantic_encoder" in str(error)
    else:
        raise AssertionError("warped mode without an encoder must fail")


def test_input_views_are_kept_and_views_without_batch_dimension_work():
    pipe = _pipe()
    inputs = get_dummy_inputs(SemanticNVSPipeline, seed=0)
    unbatched = {k: (v[0] if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    batched = pipe(**inputs).images
    unbatched["generator"] = torch.Generator().manual_seed(0)
    np.testing.assert_allclose(pipe(**unbatched).images, batched, atol=1e-6)


def test_iterative_start_delays_the_iterative_features():
    pipe = _pipe()
    inputs = get_dummy_inputs(SemanticNVSPipeline, seed=0)
    inputs.update(num_inference_steps=3)
    warped = pipe(**dict(inputs, semantic_mode="warped", generator=torch.Generator().manual_seed(0))).images
    never = pipe(**dict(inputs, semantic_mode="warped+iterative", iterative_start=1.0,
                        generator=torch.Generator().manual_seed(0))).images  # fmt: skip
    always = pipe(**dict(inputs, semantic_mode="warped+iterative", generator=torch.Generator().manual_seed(0))).images
    np.testing.assert_allclose(never, warped, atol=1e-6)
    assert not np.allclose(always, warped)
