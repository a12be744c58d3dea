import numpy as np
import pytest
import torch

from diffusers_ext import SemanticNVSPipeline
from diffusers_ext.testing import PipelineConformanceTests, get_dummy_components, get_dummy_inputs


class TestSemanticNVSPipelineConformance(PipelineConformanceTests):
    pipeline_class = SemanticNVSPipeline


def _pipe():
    pipe = SemanticNVSPipeline(**get_dummy_components(SemanticNVSPipeline))
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.support_cell("semantic_nvs", "pack")
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
    never = pipe(
        **dict(
            inputs, semantic_mode="warped+iterative", iterative_start=1.0, generator=torch.Generator().manual_seed(0)
        )
    ).images
    always = pipe(**dict(inputs, semantic_mode="warped+iterative", generator=torch.Generator().manual_seed(0))).images
    np.testing.assert_allclose(never, warped, atol=1e-6)
    assert not np.allclose(always, warped)


def test_iterative_features_come_from_the_conditional_estimate():
    # The iterative features are extracted from the conditional (unguided) prediction, as in training: at the first
    # step the latents are the same whatever the guidance, so the first estimate does not depend on it.
    pipe = _pipe()
    seen = {}
    original = pipe.encode_semantics
    for scale in (1.0, 3.0):
        images = []

        def recording(x, images=images):
            images.append(x.clone())
            return original(x)

        pipe.encode_semantics = recording
        inputs = get_dummy_inputs(SemanticNVSPipeline, seed=0)
        inputs.update(semantic_mode="iterative", num_inference_steps=2, guidance_scale=scale)
        pipe(**inputs)
        seen[scale] = images
    torch.testing.assert_close(seen[1.0][1], seen[3.0][1])
    assert 0 <= seen[3.0][1].min() and seen[3.0][1].max() <= 1


def test_conditioning_x0_estimate_inverts_the_forward_process():
    from diffusers import DDPMScheduler

    from diffusers_ext.pipelines.semantic_nvs.conditioning import x0_estimate

    generator = torch.Generator().manual_seed(0)
    clean, noise = torch.randn(3, 3, 4, 4, generator=generator), torch.randn(3, 3, 4, 4, generator=generator)
    timesteps = torch.tensor([0, 500, 990])
    for prediction_type in ("epsilon", "v_prediction", "sample"):
        scheduler = DDPMScheduler(num_train_timesteps=1000, prediction_type=prediction_type)
        noisy = scheduler.add_noise(clean, noise, timesteps)
        output = {"epsilon": noise, "v_prediction": scheduler.get_velocity(clean, noise, timesteps), "sample": clean}[
            prediction_type
        ]
        torch.testing.assert_close(x0_estimate(scheduler, output, noisy, timesteps), clean, atol=1e-3, rtol=1e-3)
        # a single timestep for the whole batch, as the pipeline passes it
        torch.testing.assert_close(
            x0_estimate(scheduler, output[1:2], noisy[1:2], timesteps[1]), clean[1:2], atol=1e-4, rtol=1e-4
        )
    with pytest.raises(ValueError, match="`timesteps` must be a number or of shape \\(3,\\)"):
        x0_estimate(scheduler, clean, clean, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="`model_output` has shape"):
        x0_estimate(scheduler, clean[:1], clean, 1)


def test_conditioning_target_semantics_per_mode():
    from diffusers_ext.pipelines.semantic_nvs.conditioning import target_semantics

    warped, iterative = torch.full((2, 4, 3, 3), 1.0), torch.full((2, 4, 3, 3), 2.0)
    coverage = torch.zeros(2, 1, 3, 3, dtype=torch.bool)
    coverage[..., 0] = True
    features, mask = target_semantics("warped+iterative", warped, coverage, iterative)
    assert (features[..., 0] == 1).all() and (features[..., 1:] == 2).all() and (mask == 1).all()
    features, mask = target_semantics("warped+iterative", warped, coverage, None)  # no estimate yet
    torch.testing.assert_close(mask, coverage.float())
    features, mask = target_semantics("iterative", warped, coverage, None)
    assert (features == 0).all() and (mask == 0).all()
    features, mask = target_semantics("iterative", warped, coverage, iterative)
    assert (features == 2).all() and (mask == 1).all()
    with pytest.raises(ValueError, match="`mode` must be one of"):
        target_semantics("warp", warped, coverage, None)


def test_guidance_keeps_the_iterative_features_in_the_unconditional_branch():
    pipe = _pipe()
    calls = []
    original = pipe.unet.forward

    def recording(
        sample, timestep, plucker, input_mask, input_images, semantic_features=None, semantic_mask=None, **kwargs
    ):
        calls.append((input_mask.clone(), semantic_features.clone(), semantic_mask.clone()))
        return original(
            sample, timestep, plucker, input_mask, input_images, semantic_features, semantic_mask, **kwargs
        )

    pipe.unet.forward = recording
    for mode in ("warped+iterative", "warped"):
        calls.clear()
        inputs = get_dummy_inputs(SemanticNVSPipeline, seed=0)
        inputs.update(semantic_mode=mode, num_inference_steps=3, guidance_scale=2.0)
        coverage = pipe(**inputs).coverage
        assert len(calls) == 3
        for step, (input_mask, features, mask) in enumerate(calls):
            (uncond_mask, cond_mask), (uncond, cond), (uncond_valid, _) = (
                input_mask.chunk(2),
                features.chunk(2),
                mask.chunk(2),
            )
            assert not uncond_mask.any() and cond_mask[:, 0].all()
            assert (uncond[:, :1] == 0).all() and (uncond_valid[:, :1] == 0).all()  # no input-view features
            if mode == "warped" or step == 0:  # nothing iterative (yet): the branch has no semantics
                assert (uncond == 0).all() and (uncond_valid == 0).all()
            else:  # the iterative features of the estimate, everywhere, also where the warp landed
                assert (uncond_valid[:, 1:] == 1).all() and uncond[:, 1:].abs().sum() > 0
                outside = ~coverage.expand_as(cond[:, 1:])
                assert outside.any()
                torch.testing.assert_close(uncond[:, 1:][outside], cond[:, 1:][outside])


def _tiny_metric_depth_estimator(depth_estimation_type: str = "metric"):
    from transformers import DepthAnythingConfig, DepthAnythingForDepthEstimation, Dinov2Config
    from transformers import DPTImageProcessorPil as DepthProcessor

    torch.manual_seed(0)
    backbone = Dinov2Config(
        hidden_size=16,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=32,
        image_size=28,
        patch_size=14,
        out_features=["stage1", "stage2", "stage3", "stage4"],
        reshape_hidden_states=False,
    )
    config = DepthAnythingConfig(
        backbone_config=backbone,
        reassemble_hidden_size=16,
        patch_size=14,
        neck_hidden_sizes=[8, 8, 8, 8],
        fusion_hidden_size=8,
        head_hidden_size=8,
        depth_estimation_type=depth_estimation_type,
        max_depth=10,
    )
    processor = DepthProcessor(
        size={"height": 28, "width": 28},
        keep_aspect_ratio=False,
        ensure_multiple_of=14,
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    )
    return DepthAnythingForDepthEstimation(config).eval(), processor


def test_depth_estimator_supplies_depth_for_warping(tmp_path):
    from diffusers_ext.testing.dummies.semantic_nvs import get_components, get_inputs

    estimator, processor = _tiny_metric_depth_estimator()
    pipe = SemanticNVSPipeline(**get_components(0), depth_estimator=estimator, depth_processor=processor)
    pipe.set_progress_bar_config(disable=True)
    inputs = get_inputs(0)
    inputs.pop("depths")
    estimated = pipe.estimate_depth(inputs["images"])
    assert estimated.shape == (1, 1, 1, *inputs["images"].shape[-2:]) and (estimated > 0).all()
    out = pipe(**inputs)
    again = pipe(**get_inputs(0) | {"depths": estimated})
    np.testing.assert_allclose(out.images, again.images, atol=1e-5)
    torch.testing.assert_close(out.coverage, again.coverage)
    pipe.save_pretrained(tmp_path / "with-depth")
    reloaded = SemanticNVSPipeline.from_pretrained(tmp_path / "with-depth")
    reloaded.set_progress_bar_config(disable=True)
    np.testing.assert_allclose(reloaded(**get_inputs(0) | {"depths": None}).images, out.images, atol=1e-5)


def test_depth_estimator_must_be_metric_and_come_with_its_processor():
    from diffusers_ext.testing.dummies.semantic_nvs import get_components, get_inputs

    estimator, processor = _tiny_metric_depth_estimator("relative")
    with pytest.raises(ValueError, match="metric"):
        SemanticNVSPipeline(**get_components(0), depth_estimator=estimator, depth_processor=processor)
    with pytest.raises(ValueError, match="depth_processor"):
        SemanticNVSPipeline(**get_components(0), depth_estimator=_tiny_metric_depth_estimator()[0])
    pipe = SemanticNVSPipeline(**get_components(0))
    with pytest.raises(ValueError, match="depth_estimator"):
        pipe(**get_inputs(0) | {"depths": None})


def test_a_list_of_batch_one_scenes_is_a_batch():
    pipe = _pipe()
    inputs = get_dummy_inputs(SemanticNVSPipeline, seed=0)
    batched = pipe(**inputs).images
    as_list = {k: ([v, v] if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}  # (1, V, ...) each
    as_list["generator"] = [torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)]
    images = pipe(**as_list).images
    assert images.shape == (2, *batched.shape[1:])
    np.testing.assert_allclose(images[0], batched[0], atol=1e-5)
    bad = {**as_list, "images": [inputs["images"].repeat(2, 1, 1, 1, 1)]}
    with pytest.raises(ValueError, match="each entry is one scene"):
        pipe(**bad)
