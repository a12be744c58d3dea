"""DivideAndDenoisePipeline: the conformance suite, then behaviour specific to dividing a sample among models."""

import numpy as np
import pytest
import torch
from diffusers import (
    AutoencoderKL,
    DDIMScheduler,
    DDPMScheduler,
    DPMSolverMultistepScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    PNDMScheduler,
    ScoreSdeVeScheduler,
    StableDiffusionPipeline,
    UNet2DConditionModel,
)

from diffusers_ext import (
    AverageAllocator,
    ClassConditionalDDPMPipeline,
    DivideAndDenoisePipeline,
    FairDivisionAllocator,
    MultiDenoiserModel,
    RegionAllocator,
    load_pipeline,
)
from diffusers_ext.evaluation.divide_and_denoise.composition import (
    conflict_experts,
    discs_success,
    dominant_experts,
)
from diffusers_ext.pipelines.divide_and_denoise.utilities import ConceptAttentionStore, record_cross_attention
from diffusers_ext.testing import (
    PipelineConformanceTests,
    count_module_forwards,
    get_dummy_components,
    get_dummy_inputs,
    get_tiny_pixel_unet,
    get_tiny_sd_components,
)
from diffusers_ext.testing.dummies import divide_and_denoise as dummies


class TestDivideAndDenoisePipeline(PipelineConformanceTests):
    pipeline_class = DivideAndDenoisePipeline


# ---------------------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------------------


def _pixel_pipeline(**overrides) -> DivideAndDenoisePipeline:
    components = get_dummy_components(DivideAndDenoisePipeline, seed=0)
    components.update(overrides)
    pipe = DivideAndDenoisePipeline(**components)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _disc_pipeline(num_templates: int = 60) -> DivideAndDenoisePipeline:
    scheduler = DDIMScheduler(num_train_timesteps=1000, beta_schedule="linear", clip_sample=False)
    pipe = DivideAndDenoisePipeline(MultiDenoiserModel(conflict_experts(num_templates=num_templates)), scheduler)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _sd_pipelines(unet_seeds=(0, 1)) -> list[StableDiffusionPipeline]:
    """Tiny SD pipelines sharing one VAE, text encoder and tokenizer, with differently seeded UNets."""
    shared = get_tiny_sd_components(seed=0)
    pipes = []
    for seed in unet_seeds:
        components = dict(shared, unet=get_tiny_sd_components(seed=seed)["unet"])
        pipes.append(StableDiffusionPipeline(**components))
    return pipes


# ---------------------------------------------------------------------------------------------------------------------
# composition on pixel models
# ---------------------------------------------------------------------------------------------------------------------


def test_allocations_are_divisions_per_step_and_shown_to_callbacks():
    pipe = _pixel_pipeline()
    seen = []

    def callback(pipe_, step, timestep, kwargs):
        seen.append(kwargs["allocation"].clone())
        return {}

    out = pipe(
        **get_dummy_inputs(DivideAndDenoisePipeline, seed=0),
        callback_on_step_end=callback,
        callback_on_step_end_tensor_inputs=["allocation", "noise_pred"],
    )
    assert out.allocations.shape == (2, 1, 2, dummies.SAMPLE_SIZE, dummies.CANVAS_WIDTH)
    torch.testing.assert_close(out.allocations.sum(dim=2), torch.ones(2, 1, 8, 12))
    assert (out.allocations >= 0).all()
    torch.testing.assert_close(torch.stack(seen), out.allocations)


def test_baselines_use_fixed_weights():
    pipe = _pixel_pipeline()
    inputs = get_dummy_inputs(DivideAndDenoisePipeline, seed=0)
    average = pipe(**inputs, allocator=AverageAllocator()).allocations
    torch.testing.assert_close(average, torch.full_like(average, 0.5))
    strips = pipe(**get_dummy_inputs(DivideAndDenoisePipeline, seed=0), allocator=RegionAllocator()).allocations
    assert (strips[:, :, 0, :, :6] == 1).all() and (strips[:, :, 0, :, 6:] == 0).all()
    regions = torch.zeros(2, 8, 12)
    regions[0, :4], regions[1, 4:] = 1.0, 1.0
    custom = pipe(**get_dummy_inputs(DivideAndDenoisePipeline, seed=0), allocator=RegionAllocator(regions)).allocations
    torch.testing.assert_close(custom[0, 0], regions)


def test_baselines_compute_no_utilities():
    """A fixed allocation reads no utility maps: the guidance-delta utility asks for no unconditional branch, and
    the time spent on utilities, allocation and alignment is zero."""
    pipe = _pixel_pipeline()
    inputs = dict(get_dummy_inputs(DivideAndDenoisePipeline, seed=0), guidance_scale=1.0, utility="guidance_delta")
    unet_batches = []
    handle = pipe.denoisers[0].register_forward_pre_hook(lambda m, args: unet_batches.append(args[0].shape[0]))
    try:
        out = pipe(**inputs, allocator=AverageAllocator())
    finally:
        handle.remove()
    assert unet_batches == [2, 2]  # both agents, conditional branch only
    assert out.timings["utility"] == out.timings["allocation"] == out.timings["alignment"] == 0.0


def test_region_allocator_checks_its_regions():
    with pytest.raises(ValueError, match="regions"):
        RegionAllocator(torch.ones(8, 12))
    with pytest.raises(ValueError, match="regions"):
        RegionAllocator(-torch.ones(2, 8, 12))
    uncovered = RegionAllocator(torch.zeros(2, 4, 4)).weights(2, 4, 4)  # a position nobody claims is shared
    torch.testing.assert_close(uncovered, torch.full((2, 4, 4), 0.5))


def test_identical_agents_reproduce_the_single_model_pipeline():
    """Two agents asking for the same class: any division composes the same prediction, so without the alignment
    step the result is the base pipeline's, step for step (this checks the composite and the scheduler loop)."""
    components = dummies.get_components(seed=0)
    unet = components["denoisers"][0]
    base = ClassConditionalDDPMPipeline(
        unet=unet, scheduler=DDIMScheduler(num_train_timesteps=100), null_class_label=dummies.NULL_CLASS_LABEL
    )
    base.set_progress_bar_config(disable=True)
    latents = torch.randn(1, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    expected = base(class_labels=[2], num_inference_steps=4, guidance_scale=2.0, latents=latents, output_type="np")
    pipe = _pixel_pipeline()
    got = pipe(
        class_labels=[2, 2],
        num_inference_steps=4,
        guidance_scale=2.0,
        latents=latents,
        output_type="np",
        alignment_scale=0.0,
    )
    np.testing.assert_allclose(got.images, expected.images, atol=1e-5)


def test_per_model_guidance_scales_are_used():
    pipe = _pixel_pipeline()
    inputs = get_dummy_inputs(DivideAndDenoisePipeline, seed=0)
    same = pipe(**{**inputs, "guidance_scale": [2.0, 2.0]}).images
    np.testing.assert_array_equal(same, pipe(**get_dummy_inputs(DivideAndDenoisePipeline, seed=0)).images)
    different = pipe(**{**get_dummy_inputs(DivideAndDenoisePipeline, seed=0), "guidance_scale": [2.0, 5.0]}).images
    assert np.abs(different - same).max() > 1e-4


@pytest.mark.support_cell("divide_and_denoise", "pack")
def test_fair_division_composes_conflicting_experts_where_baselines_fail():
    pipe = _disc_pipeline()
    scores, allocations = {}, None
    for composition, allocator in (
        ("divide_and_denoise", None),
        ("average", AverageAllocator()),
        ("multidiffusion", RegionAllocator()),
    ):
        out = pipe(
            num_inference_steps=20,
            num_images_per_prompt=6,
            generator=torch.Generator().manual_seed(0),
            output_type="pt",
            allocator=allocator,
        )
        scores[composition] = discs_success(out.images).mean()
        if composition == "divide_and_denoise":
            allocations = out.allocations
    assert scores["divide_and_denoise"] >= 5 / 6, scores
    assert scores["average"] <= 0.5 and scores["multidiffusion"] <= 0.5, scores
    # the red expert (agent 0) paints on the right, where its templates are: it holds the right half at the end
    final = allocations[-1, :, 0]
    assert (final[..., 8:].mean() > 0.7) and (final[..., :8].mean() < 0.3)


def test_alignment_changes_the_sample_only_in_its_first_steps():
    pipe = _pixel_pipeline()
    base = dict(get_dummy_inputs(DivideAndDenoisePipeline, seed=0), num_inference_steps=3, output_type="latent")
    off = pipe(**{**base, "generator": torch.Generator().manual_seed(0)}, alignment_scale=0.0).images
    on = pipe(**{**base, "generator": torch.Generator().manual_seed(0)}, alignment_scale=0.5).images
    zero_steps = pipe(
        **{**base, "generator": torch.Generator().manual_seed(0)}, alignment_scale=0.5, max_iter_to_align=0
    ).images
    assert (on - off).abs().max() > 1e-4
    torch.testing.assert_close(zero_steps, off)


@pytest.mark.parametrize("solver", ["sinkhorn", "argmax", "lp"])
def test_any_allocator_can_drive_the_pipeline(solver):
    pipe = _pixel_pipeline()
    out = pipe(**get_dummy_inputs(DivideAndDenoisePipeline, seed=0), allocator=FairDivisionAllocator(solver))
    torch.testing.assert_close(out.allocations.sum(dim=2), torch.ones(2, 1, 8, 12))


def test_guidance_delta_utility_runs_the_unconditional_branch_even_without_guidance():
    pipe = _pixel_pipeline()
    inputs = dict(get_dummy_inputs(DivideAndDenoisePipeline, seed=0), guidance_scale=1.0)
    with count_module_forwards(pipe) as counts:
        pipe(**inputs, utility="guidance_delta")
    assert counts["denoisers"] == 2  # one batched forward (both agents, both branches) per step
    unet_batches = []
    handle = pipe.denoisers[0].register_forward_pre_hook(lambda m, args: unet_batches.append(args[0].shape[0]))
    try:
        pipe(**dict(get_dummy_inputs(DivideAndDenoisePipeline, seed=0), guidance_scale=1.0), utility="guidance_delta")
        pipe(**dict(get_dummy_inputs(DivideAndDenoisePipeline, seed=0), guidance_scale=1.0))
    finally:
        handle.remove()
    assert unet_batches == [4, 4, 2, 2]


def test_timings_are_in_the_output():
    pipe = _pixel_pipeline()
    out = pipe(**get_dummy_inputs(DivideAndDenoisePipeline, seed=0))
    assert set(out.timings) == {"model_forwards", "utility", "allocation", "alignment"}
    assert out.timings["model_forwards"] > 0 and out.timings["allocation"] > 0
    images, allocations, timings = pipe(**get_dummy_inputs(DivideAndDenoisePipeline, seed=0), return_dict=False)
    assert set(timings) == set(out.timings) and allocations.shape == out.allocations.shape
    assert not hasattr(pipe, "last_call_timings")  # a call leaves nothing on the pipeline object


def test_timings_are_read_after_a_device_synchronise(monkeypatch):
    import diffusers_ext.pipelines.divide_and_denoise.pipeline_divide_and_denoise as module
    from diffusers_ext.utils import synchronized_perf_counter

    synchronised = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synchronised.append(device))
    synchronized_perf_counter("cpu")
    assert synchronised == []
    synchronized_perf_counter("cuda:0")
    assert synchronised == [torch.device("cuda:0")]

    readings = []

    def clock(device):
        readings.append(torch.device(device))
        return synchronized_perf_counter(device)

    monkeypatch.setattr(module, "synchronized_perf_counter", clock)
    pipe = _pixel_pipeline()
    inputs = get_dummy_inputs(DivideAndDenoisePipeline, seed=0)
    out = pipe(**inputs)
    # a start and an end reading around the forwards, the utility and the allocation of every step, on the
    # pipeline's device
    assert len(readings) >= 6 * inputs["num_inference_steps"] and set(readings) == {pipe._execution_device}
    assert all(seconds >= 0 for seconds in out.timings.values()) and out.timings["model_forwards"] > 0


# ---------------------------------------------------------------------------------------------------------------------
# construction and errors
# ---------------------------------------------------------------------------------------------------------------------


def test_from_pipelines_keeps_a_shared_unet_once_and_the_null_class():
    unet = get_tiny_pixel_unet(seed=0, sample_size=8, in_channels=1, num_class_embeds=4)
    digits = ClassConditionalDDPMPipeline(
        unet=unet, scheduler=DDIMScheduler(num_train_timesteps=100), null_class_label=3
    )
    pipe = DivideAndDenoisePipeline.from_pipelines([digits, digits])
    assert len(pipe.denoisers) == 1 and pipe.config.null_class_label == 3
    assert pipe.scheduler is not digits.scheduler and pipe.scheduler.config == digits.scheduler.config


def test_mismatched_schedules_and_latent_spaces_are_rejected():
    make = lambda **unet_kwargs: ClassConditionalDDPMPipeline(  # noqa: E731
        unet=get_tiny_pixel_unet(
            **{"seed": 0, "sample_size": 8, "in_channels": 1, "num_class_embeds": 4, **unet_kwargs}
        ),
        scheduler=DDIMScheduler(num_train_timesteps=100),
        null_class_label=3,
    )
    other_schedule = make()
    other_schedule.scheduler = DDIMScheduler(num_train_timesteps=100, beta_schedule="squaredcos_cap_v2")
    with pytest.raises(ValueError, match="beta_schedule"):
        DivideAndDenoisePipeline.from_pipelines([make(), other_schedule])
    with pytest.raises(ValueError, match=r"latents \(channels, size\)"):
        DivideAndDenoisePipeline.from_pipelines([make(), make(sample_size=16)])
    with pytest.raises(ValueError, match="latent channels"):
        DivideAndDenoisePipeline(
            MultiDenoiserModel([make().unet, make(in_channels=3).unet]), DDIMScheduler(num_train_timesteps=100)
        )
    with pytest.raises(ValueError, match="mix conditioning kinds"):
        DivideAndDenoisePipeline(
            MultiDenoiserModel([make().unet, make(num_class_embeds=None).unet]), DDIMScheduler(num_train_timesteps=100)
        )
    with pytest.raises(ValueError, match="alphas_cumprod"):  # neither a DDPM-family nor a flow-matching schedule
        DivideAndDenoisePipeline(MultiDenoiserModel([make().unet]), ScoreSdeVeScheduler())
    DivideAndDenoisePipeline(MultiDenoiserModel([make().unet]), FlowMatchEulerDiscreteScheduler())  # accepted
    sd = _sd_pipelines()
    sd[1].vae = AutoencoderKL(
        **{**dict(sd[0].vae.config), "latent_channels": 4, "norm_num_groups": 4, "block_out_channels": (4, 8)}
    )
    with pytest.raises(ValueError, match="autoencoder"):
        DivideAndDenoisePipeline.from_pipelines(sd)
    with pytest.raises(ValueError, match="text_encoder"):
        DivideAndDenoisePipeline(MultiDenoiserModel([sd[0].unet]), sd[0].scheduler, vae=sd[0].vae)


def test_unconditional_experts_reject_guidance_and_labels():
    pipe = _disc_pipeline(num_templates=4)
    with pytest.raises(ValueError, match="guidance_scale"):
        pipe(num_inference_steps=2, guidance_scale=3.0)
    with pytest.raises(ValueError, match="class_labels"):
        pipe(num_inference_steps=2, class_labels=[0, 1])
    with pytest.raises(ValueError, match="height"):
        pipe(num_inference_steps=2, height=32)


# ---------------------------------------------------------------------------------------------------------------------
# Stable Diffusion-family models: cross-attention utilities
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("utility", ["cross_attention", "guidance_delta", "x0_saliency"])
@pytest.mark.support_cell("divide_and_denoise", "sd1_sd2")
def test_stable_diffusion_unets_compose_with_each_utility(utility):
    pipe = DivideAndDenoisePipeline.from_pipelines(_sd_pipelines())
    pipe.set_progress_bar_config(disable=True)
    processors = {name: type(p) for name, p in pipe.denoisers[0].attn_processors.items()}
    out = pipe(
        prompt=["a red cat", "a blue dog"],
        num_inference_steps=2,
        guidance_scale=3.0,
        utility=utility,
        generator=torch.Generator().manual_seed(0),
        output_type="np",
    )
    assert out.images.shape == (1, 32, 32, 3)
    assert out.allocations.shape == (2, 1, 2, 16, 16)
    torch.testing.assert_close(out.allocations.sum(dim=2), torch.ones(2, 1, 16, 16))
    # the recording processors are removed again
    assert {name: type(p) for name, p in pipe.denoisers[0].attn_processors.items()} == processors


def test_cross_attention_recording_leaves_the_unet_output_unchanged():
    unet = get_tiny_sd_components(seed=0)["unet"]
    sample = torch.randn(2, 4, 16, 16, generator=torch.Generator().manual_seed(0))
    text = torch.randn(2, 77, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = unet(sample, 10, encoder_hidden_states=text).sample
        store = ConceptAttentionStore((16, 16))
        with record_cross_attention(unet, store):
            got = unet(sample, 10, encoder_hidden_states=text).sample
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    maps = store.maps
    cross_attention_layers = [name for name in unet.attn_processors if name.endswith("attn2.processor")]
    assert maps.shape == (2, 16, 16, 77) and store.num_layers == len(cross_attention_layers) == 4
    torch.testing.assert_close(maps.sum(dim=-1), torch.ones(2, 16, 16), atol=1e-4, rtol=0)


def test_attn_res_records_only_the_layers_at_that_grid_with_the_output_unchanged():
    torch.manual_seed(0)
    unet = UNet2DConditionModel(  # cross-attention at two resolutions, 16x16 and 8x8
        sample_size=16,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=32,
    ).eval()
    sample = torch.randn(2, 4, 16, 16, generator=torch.Generator().manual_seed(0))
    text = torch.randn(2, 77, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = unet(sample, 10, encoder_hidden_states=text).sample
        every, coarse = ConceptAttentionStore((16, 16)), ConceptAttentionStore((16, 16), attn_res=(8, 8))
        with record_cross_attention(unet, every):
            unet(sample, 10, encoder_hidden_states=text)
        with record_cross_attention(unet, coarse):
            got = unet(sample, 10, encoder_hidden_states=text).sample
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert set(every._sums) == {(16, 16), (8, 8)} and set(coarse._sums) == {(8, 8)}
    torch.testing.assert_close(coarse._sums[(8, 8)], every._sums[(8, 8)])
    assert 0 < coarse.num_layers < every.num_layers
    with pytest.raises(RuntimeError, match="attn_res"):
        _ = ConceptAttentionStore((16, 16), attn_res=(2, 2)).maps


def test_a_store_of_a_few_tokens_records_those_columns_of_the_full_maps_with_the_output_unchanged():
    """The token-restricted store reads `exp(q . k_j - logsumexp)` at its tokens: the same numbers as the full
    softmax's columns, with the UNet output of the plain fused kernel."""
    unet = get_tiny_sd_components(seed=0)["unet"]
    sample = torch.randn(3, 4, 16, 16, generator=torch.Generator().manual_seed(0))
    text = torch.randn(3, 77, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = unet(sample, 10, encoder_hidden_states=text).sample
        full, few = (
            ConceptAttentionStore((16, 16), first_row=1),
            ConceptAttentionStore((16, 16), first_row=1, tokens=[5, 2]),
        )
        with record_cross_attention(unet, full):
            unet(sample, 10, encoder_hidden_states=text)
        with record_cross_attention(unet, few):
            got = unet(sample, 10, encoder_hidden_states=text).sample
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert few.maps.shape == (2, 16, 16, 2) and few.num_layers == full.num_layers > 0
    torch.testing.assert_close(few.maps, full.maps[..., [5, 2]], atol=1e-6, rtol=1e-5)
    for bad in ([], [-1], [1.5], "3"):
        with pytest.raises(ValueError, match="tokens"):
            ConceptAttentionStore((16, 16), tokens=bad)


def test_attention_with_logsumexp_agrees_with_the_explicit_softmax():
    """The CPU kernel's normaliser (no mask) and the explicit path (a mask) against `logsumexp` of the logits."""
    from diffusers_ext.pipelines.divide_and_denoise.utilities import attention_with_logsumexp

    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(6, n, 8, generator=generator) for n in (20, 7, 7))
    logits = query @ key.transpose(1, 2) * 0.3
    for mask in (None, torch.zeros(6, 1, 7)):
        out, logsumexp = attention_with_logsumexp(query, key, value, mask, 0.3)
        torch.testing.assert_close(logsumexp, logits.logsumexp(dim=-1), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out, logits.softmax(dim=-1) @ value, atol=1e-5, rtol=1e-5)
    masked = torch.zeros(6, 1, 7)
    masked[..., 3:] = -1e4  # only the first three keys count
    out, logsumexp = attention_with_logsumexp(query, key, value, masked, 0.3)
    torch.testing.assert_close(logsumexp, logits[..., :3].logsumexp(dim=-1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, logits[..., :3].softmax(dim=-1) @ value[:, :3], atol=1e-5, rtol=1e-5)


def test_recording_processors_are_installed_once_per_call_not_per_model_call(monkeypatch):
    from diffusers.models.attention_processor import Attention

    pipe = DivideAndDenoisePipeline.from_pipelines(_sd_pipelines())
    pipe.set_progress_bar_config(disable=True)
    before = [dict(denoiser.attn_processors) for denoiser in pipe.denoisers]
    cross_layers = sum(name.endswith("attn2.processor") for processors in before for name in processors)
    calls = []
    original_set_processor = Attention.set_processor
    monkeypatch.setattr(
        Attention, "set_processor", lambda self, processor: calls.append(1) or original_set_processor(self, processor)
    )
    kwargs = {"prompt": ["a red cat", "a blue dog"], "output_type": "latent", "utility": "cross_attention"}
    for steps in (1, 3):
        calls.clear()
        pipe(**kwargs, num_inference_steps=steps, guidance_scale=3.0, generator=torch.Generator().manual_seed(0))
        assert len(calls) == 2 * cross_layers  # installed before the loop, restored after it
    assert [dict(denoiser.attn_processors) for denoiser in pipe.denoisers] == before
    with pytest.raises(ValueError, match="outside the 77 prompt tokens"):
        pipe(**kwargs, num_inference_steps=1, token_indices=[[1], [77]])


def test_attn_res_is_checked_before_any_model_work():
    pipe = DivideAndDenoisePipeline.from_pipelines(_sd_pipelines(unet_seeds=(0,)))
    pipe.set_progress_bar_config(disable=True)
    kwargs = {"prompt": ["a cat", "a dog"], "num_inference_steps": 1, "output_type": "latent"}
    out = pipe(**kwargs, attn_res=(8, 8), generator=torch.Generator().manual_seed(0))
    assert out.allocations.shape == (1, 1, 2, 16, 16)
    for bad, match in (((8,), "two positive ints"), ((0, 0), "two positive ints"), ((8, 4), "not an attention grid")):
        with pytest.raises(ValueError, match=match):
            pipe(**kwargs, attn_res=bad)
    with pytest.raises(ValueError, match="only applies"):
        pipe(**kwargs, attn_res=(8, 8), utility="guidance_delta")


def test_cross_attention_utility_follows_the_token_indices():
    pipe = DivideAndDenoisePipeline.from_pipelines(_sd_pipelines(unet_seeds=(0,)))
    pipe.set_progress_bar_config(disable=True)
    kwargs = {
        "prompt": ["a cat", "a dog"],
        "num_inference_steps": 1,
        "generator": torch.Generator().manual_seed(0),
        "output_type": "latent",
        "utility": "cross_attention",
        "alignment_scale": 0.0,
    }
    first = pipe(**kwargs).allocations
    kwargs["generator"] = torch.Generator().manual_seed(0)
    other = pipe(**kwargs, token_indices=[[1], [3]]).allocations
    assert (first - other).abs().max() > 1e-4
    three = pipe(prompt=["a cat", "a dog", "a bird"], num_inference_steps=1, output_type="latent")
    assert three.allocations.shape[2] == 3  # one UNet serves any number of prompts
    with pytest.raises(ValueError, match="token_indices"):
        pipe(prompt=["a cat", "a dog"], token_indices=[[1]], num_inference_steps=1)
    two_unets = DivideAndDenoisePipeline.from_pipelines(_sd_pipelines())
    with pytest.raises(ValueError, match="prompt"):
        two_unets(prompt=["a cat", "a dog", "a bird"], num_inference_steps=1)
    with pytest.raises(ValueError, match="class_labels"):
        pipe(prompt=["a cat", "a dog"], class_labels=[0, 1], num_inference_steps=1)


def test_stable_diffusion_composition_saves_and_loads(tmp_path):
    pipe = DivideAndDenoisePipeline.from_pipelines(_sd_pipelines())
    pipe.set_progress_bar_config(disable=True)
    kwargs = {"prompt": ["a cat", "a dog"], "num_inference_steps": 2, "output_type": "np"}
    expected = pipe(**kwargs, generator=torch.Generator().manual_seed(0)).images
    pipe.save_pretrained(tmp_path)
    assert sorted(p.name for p in (tmp_path / "denoisers").iterdir()) == ["config.json", "denoiser_0", "denoiser_1"]
    loaded = load_pipeline(tmp_path)
    loaded.set_progress_bar_config(disable=True)
    assert isinstance(loaded.denoisers, MultiDenoiserModel) and len(loaded.denoisers) == 2
    np.testing.assert_allclose(
        loaded(**kwargs, generator=torch.Generator().manual_seed(0)).images, expected, atol=1e-5
    )


def test_nash_welfare_division_keeps_a_dominated_expert_where_argmax_loses_it():
    scheduler = DDIMScheduler(num_train_timesteps=1000, beta_schedule="linear", clip_sample=False)
    pipe = DivideAndDenoisePipeline(MultiDenoiserModel(dominant_experts(num_templates=60)), scheduler)
    pipe.set_progress_bar_config(disable=True)
    scores = {}
    for solver in ("proportional_response", "argmax"):
        out = pipe(
            num_inference_steps=20,
            num_images_per_prompt=8,
            generator=torch.Generator().manual_seed(0),
            output_type="pt",
            allocator=FairDivisionAllocator(solver, num_iterations=20, tol=1e-4, spatial_sigma=1.0),
        )
        scores[solver] = discs_success(out.images).mean()
    assert scores["proportional_response"] >= 7 / 8 and scores["argmax"] <= 4 / 8, scores


@pytest.mark.parametrize(
    "scheduler_class, overrides",
    [
        (DDPMScheduler, {}),
        (EulerDiscreteScheduler, {}),
        (DPMSolverMultistepScheduler, {}),
        (PNDMScheduler, {"skip_prk_steps": True}),  # Stable Diffusion's PLMS setting
    ],
)
def test_schedulers_swap(scheduler_class, overrides):
    pipe = _pixel_pipeline()
    pipe.scheduler = scheduler_class.from_config(pipe.scheduler.config, **overrides)
    inputs = get_dummy_inputs(DivideAndDenoisePipeline, seed=0)
    out = pipe(**{**inputs, "num_inference_steps": 3, "output_type": "pt"})
    assert out.images.shape == (1, 1, 8, 12) and torch.isfinite(out.images).all()
    assert out.allocations.shape[0] == pipe.num_timesteps


def _logged_by(logger, action) -> str:
    """What `logger` writes while `action()` runs."""
    import io
    import logging

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    try:
        action()
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


def test_from_pipelines_warns_when_text_encoders_differ():
    from diffusers.utils import logging as diffusers_logging

    from diffusers_ext.pipelines.divide_and_denoise import denoisers

    pipes = _sd_pipelines()
    logger = diffusers_logging.get_logger(denoisers.__name__)
    shared = _logged_by(logger, lambda: DivideAndDenoisePipeline.from_pipelines(pipes))
    pipes[1].text_encoder = get_tiny_sd_components(seed=5)["text_encoder"]
    separate = _logged_by(logger, lambda: DivideAndDenoisePipeline.from_pipelines(pipes))
    assert "text encoder" not in shared and "`pipelines[1]` has its own text encoder" in separate


# ---------------------------------------------------------------------------------------------------------------------
# the diffusers contract with Stable Diffusion experts (issue 16)
# ---------------------------------------------------------------------------------------------------------------------


def test_stable_diffusion_composition_takes_prompt_embeds_from_encode_prompt():
    pipe = DivideAndDenoisePipeline.from_pipelines(_sd_pipelines())
    pipe.set_progress_bar_config(disable=True)
    kwargs = {"num_inference_steps": 2, "guidance_scale": 3.0, "token_indices": [[1], [1]], "output_type": "np"}
    prompts = ["a red cat", "a blue dog"]
    expected = pipe(prompt=prompts, negative_prompt="blurry", generator=torch.Generator().manual_seed(0), **kwargs)
    embeds, negative = pipe.encode_prompt(prompts, negative_prompt="blurry")
    assert embeds.shape[0] == 2 and negative.shape[0] == 1
    doubled = pipe.encode_prompt(prompts, num_images_per_prompt=2, do_classifier_free_guidance=False)
    assert doubled[0].shape[0] == 4 and doubled[1] is None
    actual = pipe(
        prompt_embeds=embeds, negative_prompt_embeds=negative, generator=torch.Generator().manual_seed(0), **kwargs
    )
    np.testing.assert_allclose(actual.images, expected.images, atol=1e-5)
    with pytest.raises(ValueError, match="token_indices"):
        pipe(prompt_embeds=embeds, num_inference_steps=2)
    with pytest.raises(ValueError, match="prompt_embeds"):
        pipe(prompt=prompts, prompt_embeds=embeds, num_inference_steps=2)


def test_prompt_embeds_run_with_the_utilities_that_need_no_token_indices():
    pipe = DivideAndDenoisePipeline.from_pipelines(_sd_pipelines())
    pipe.set_progress_bar_config(disable=True)
    kwargs = {"num_inference_steps": 2, "guidance_scale": 3.0, "output_type": "np", "utility": "x0_saliency"}
    prompts = ["a red cat", "a blue dog"]
    expected = pipe(prompt=prompts, generator=torch.Generator().manual_seed(0), **kwargs).images
    embeds, negative = pipe.encode_prompt(prompts)
    actual = pipe(
        prompt_embeds=embeds, negative_prompt_embeds=negative, generator=torch.Generator().manual_seed(0), **kwargs
    )
    np.testing.assert_allclose(actual.images, expected, atol=1e-5)


@pytest.mark.parametrize("safe_serialization", [True, False])
def test_stable_diffusion_composition_saves_and_loads_a_variant(tmp_path, safe_serialization):
    pipe = DivideAndDenoisePipeline.from_pipelines(_sd_pipelines())
    pipe.set_progress_bar_config(disable=True)
    kwargs = {"prompt": ["a cat", "a dog"], "num_inference_steps": 2, "output_type": "np"}
    expected = pipe(**kwargs, generator=torch.Generator().manual_seed(0)).images
    pipe.save_pretrained(tmp_path, variant="fp16", safe_serialization=safe_serialization)
    suffix = "safetensors" if safe_serialization else "bin"
    for i in (0, 1):
        assert (tmp_path / "denoisers" / f"denoiser_{i}" / f"diffusion_pytorch_model.fp16.{suffix}").is_file()
    for loaded in (
        DivideAndDenoisePipeline.from_pretrained(tmp_path, variant="fp16"),
        load_pipeline(tmp_path, variant="fp16"),
    ):
        loaded.set_progress_bar_config(disable=True)
        np.testing.assert_allclose(
            loaded(**kwargs, generator=torch.Generator().manual_seed(0)).images, expected, atol=1e-5
        )
    with pytest.raises(ValueError, match="'bf16'.*fp16"):
        DivideAndDenoisePipeline.from_pretrained(tmp_path, variant="bf16")


def test_call_settings_are_resolved_once_from_the_call():
    from diffusers_ext.pipelines.divide_and_denoise.call_settings import DivideAndDenoiseCallSettings

    pipe = _pixel_pipeline()
    settings = pipe.check_inputs(
        None, [0, 1], None, None, 12, 2, [1.0, 3.0], 1, None, None, "np", ["latents"], None, "auto", 0.5, None, 0.1, 10
    )
    assert isinstance(settings, DivideAndDenoiseCallSettings)
    assert settings.num_agents == 2 and settings.class_labels.tolist() == [0, 1]
    assert settings.utility == "x0_saliency" and settings.needs_unconditional and settings.fair and settings.aligns
    assert settings.latent_shape == (1, 1, 8, 12)
    with pytest.raises(ValueError, match="guidance_scale"):
        pipe.check_inputs(
            None, [0, 1], None, None, 12, 2, [1.0], 1, None, None, "np", None, None, "auto", 0.5, None, 0.1, 10
        )


def test_guidance_is_resolved_once_per_call_and_again_only_after_a_callback(monkeypatch):
    import diffusers_ext.pipelines.divide_and_denoise.pipeline_divide_and_denoise as module

    resolved = []
    original = module.agent_guidance_scales
    monkeypatch.setattr(module, "agent_guidance_scales", lambda *args: resolved.append(args) or original(*args))
    pipe = _pixel_pipeline()
    pipe(**dict(get_dummy_inputs(DivideAndDenoisePipeline, seed=0), num_inference_steps=4))
    assert resolved == [(2.0, 2)]  # by check_inputs, not at every step
    resolved.clear()
    pipe(**get_dummy_inputs(DivideAndDenoisePipeline, seed=0), callback_on_step_end=lambda *args: {})
    assert len(resolved) == 1 + 2  # and after each of the 2 steps' callback, which may change `pipe._guidance_scale`


def test_prompt_embeds_are_checked_without_placeholder_prompts():
    pipe = DivideAndDenoisePipeline.from_pipelines(_sd_pipelines())
    embeds, negative = pipe.encode_prompt(["a red cat", "a blue dog"])
    standard = (None, None, None, None, None, 2, 3.0, 1, None, None, "np", ["latents"])
    settings = pipe.check_inputs(*standard, token_indices=[[1], [1]], prompt_embeds=embeds)
    assert settings.num_agents == 2 and settings.prompts is None and settings.guidance_scales == [3.0, 3.0]
    with pytest.raises(ValueError, match="`prompt_embeds` has 1 rows for 2 models"):
        pipe.check_inputs(*standard, utility="x0_saliency", prompt_embeds=embeds[:1])
    with pytest.raises(ValueError, match=r"`token_indices` \[\[1\], \[77\]\] name positions \[77\] outside the 77"):
        pipe.check_inputs(*standard, token_indices=[[1], [77]], prompt_embeds=embeds)


def test_denoisers_none_builds_a_prompt_encoder_only():
    components = get_tiny_sd_components(seed=0)
    pipe = DivideAndDenoisePipeline(
        None, components["scheduler"], components["vae"], components["text_encoder"], components["tokenizer"]
    )
    embeds, negative = pipe.encode_prompt(["a cat", "a dog"], do_classifier_free_guidance=True)
    assert embeds.shape[0] == 2 and negative.shape[0] == 1  # one prompt per model, one shared negative
    with pytest.raises(ValueError, match="no `denoisers`"):
        pipe(prompt=["a cat", "a dog"], num_inference_steps=2)
    with pytest.raises(TypeError, match="MultiDenoiserModel or None"):
        DivideAndDenoisePipeline(components["unet"], components["scheduler"])


def test_a_variant_loads_from_a_snapshot_style_hub_cache(tmp_path, monkeypatch):
    import hashlib
    import os

    pipe = DivideAndDenoisePipeline.from_pipelines(_sd_pipelines())
    pipe.set_progress_bar_config(disable=True)
    kwargs = {"prompt": ["a cat", "a dog"], "num_inference_steps": 2, "output_type": "np"}
    expected = pipe(**kwargs, generator=torch.Generator().manual_seed(0)).images
    saved = tmp_path / "saved"
    pipe.save_pretrained(saved, variant="fp16")
    # the Hub cache layout: models--{org}--{name}/snapshots/{commit}/... as links to blobs/, refs/main
    repo, commit = tmp_path / "hub" / "models--local--composition", "0123456789abcdef0123456789abcdef01234567"
    for root, _, files in os.walk(saved):
        for name in files:
            data = open(os.path.join(root, name), "rb").read()
            blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(data)
            link = repo / "snapshots" / commit / os.path.relpath(os.path.join(root, name), saved)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = str(tmp_path / "hub")
    for loaded in (
        DivideAndDenoisePipeline.from_pretrained("local/composition", cache_dir=cache, variant="fp16"),
        DivideAndDenoisePipeline.from_pretrained(
            "local/composition", cache_dir=cache, variant="fp16", local_files_only=True
        ),
        DivideAndDenoisePipeline.from_pretrained(str(repo / "snapshots" / commit), variant="fp16"),
    ):
        loaded.set_progress_bar_config(disable=True)
        images = loaded(**kwargs, generator=torch.Generator().manual_seed(0)).images
        np.testing.assert_allclose(images, expected, atol=1e-5)
    with pytest.raises(ValueError, match="'bf16'.*fp16"):
        DivideAndDenoisePipeline.from_pretrained("local/composition", cache_dir=cache, variant="bf16")


# ---------------------------------------------------------------------------------------------------------------------
# reduced precision at SD-sized latents
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("utility", ["cross_attention", "x0_saliency"])
@pytest.mark.support_cell("divide_and_denoise", "sd1_sd2", dtype="float16")
def test_float16_stable_diffusion_composition_stays_finite_at_64x64_latents(utility):
    # at high noise x0 = (x_t - noise * eps) / signal is several times x_t; in float16 its saliency over a 64x64
    # canvas overflowed (non-finite utilities), and the alignment's normalised gradient underflowed to 0/0 (NaN)
    pipes = _sd_pipelines()
    for p in pipes:
        p.to(torch.float16)
    pipe = DivideAndDenoisePipeline.from_pipelines(pipes)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(
        prompt=["a red cat", "a blue dog"],
        height=128,
        width=128,
        num_inference_steps=3,  # first timestep 667: alpha_bar 0.10
        guidance_scale=7.5,
        utility=utility,
        generator=torch.Generator().manual_seed(0),
        output_type="latent",
    )
    assert out.images.dtype == torch.float16 and out.images.shape == (1, 4, 64, 64)
    assert torch.isfinite(out.images).all()
    assert torch.isfinite(out.allocations).all()


def test_alignment_step_in_float16_matches_float32_at_sd_scale():
    from diffusers_ext.pipelines.divide_and_denoise.alignment import alignment_step

    gen = torch.Generator().manual_seed(0)
    latents = torch.randn(1, 4, 64, 64, generator=gen)
    x0 = 15 * torch.randn(1, 2, 4, 64, 64, generator=gen)  # x0 at SD's first step: x_t / sqrt(alpha_bar) ~ 15 x_t
    allocation = torch.rand(1, 2, 64, 64, generator=gen)
    allocation = allocation / allocation.sum(dim=1, keepdim=True)
    noise = torch.tensor(0.9976)
    ref = alignment_step(latents, latents, x0, allocation, noise, 0.1)
    half = alignment_step(latents.half(), latents.half(), x0.half(), allocation.half(), noise.half(), 0.1)
    assert half.dtype == torch.float16 and torch.isfinite(half).all()
    torch.testing.assert_close(half.float(), ref, atol=2e-2, rtol=1e-2)
