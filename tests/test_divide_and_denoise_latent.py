"""Divide-and-Denoise on latent text-to-image components: flow-matching schedulers, SD3 transformers and their
joint-attention utility, and the LoRA fine-tune that makes the latent benchmark's experts (tiny models, seconds)."""

import numpy as np
import pytest
import torch
from diffusers import (
    DDIMScheduler,
    FlowMatchEulerDiscreteScheduler,
    StableDiffusion3Pipeline,
    StableDiffusionPipeline,
    UNet2DConditionModel,
)

from diffusers_ext import AverageAllocator, DivideAndDenoisePipeline, MultiDenoiserModel
from diffusers_ext.evaluation.mosaic_finetune import finetune_unet, unet_with_lora
from diffusers_ext.pipelines.divide_and_denoise.agent_predictions import is_flow_matching, noise_levels
from diffusers_ext.pipelines.divide_and_denoise.utilities import ConceptAttentionStore, record_cross_attention
from diffusers_ext.testing import PipelineConformanceTests, get_tiny_sd3_components, get_tiny_sd_components


class TestDivideAndDenoiseFlowMatching(PipelineConformanceTests):
    """The whole conformance kit with a flow-matching sampler instead of the dummy setup's DDIM."""

    pipeline_class = DivideAndDenoisePipeline

    def get_pipeline(self, seed: int = 0, disable_progress_bar: bool = True):
        pipe = super().get_pipeline(seed=seed, disable_progress_bar=disable_progress_bar)
        pipe.scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=100, shift=1.0)
        return pipe

    @pytest.mark.slow
    def test_save_load_in_fresh_process(self, tmp_path):  # a fresh interpreter: slow on a loaded CPU
        super().test_save_load_in_fresh_process(tmp_path)


def _sd3(seed: int = 0):
    components = get_tiny_sd3_components(seed=seed)
    sd3 = StableDiffusion3Pipeline(**components)
    sd3.set_progress_bar_config(disable=True)
    return sd3


def _sd3_embeds(sd3, prompts: list[str]):
    embeds, negative, pooled, negative_pooled = sd3.encode_prompt(
        prompt=prompts,
        prompt_2=None,
        prompt_3=None,
        do_classifier_free_guidance=True,
        negative_prompt="",
        max_sequence_length=8,
    )
    return {
        "prompt_embeds": embeds,
        "negative_prompt_embeds": negative[:1],
        "pooled_prompt_embeds": pooled,
        "negative_pooled_prompt_embeds": negative_pooled[:1],
    }


def _sd3_composite(sd3, transformers=None) -> DivideAndDenoisePipeline:
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(sd3.scheduler.config)
    pipe = DivideAndDenoisePipeline(MultiDenoiserModel(transformers or [sd3.transformer]), scheduler, vae=sd3.vae)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_flow_matching_noise_levels_and_detection():
    flow = FlowMatchEulerDiscreteScheduler(shift=3.0)
    flow.set_timesteps(4)
    assert is_flow_matching(flow) and not is_flow_matching(DDIMScheduler())
    like = torch.zeros(1)
    signal, noise = noise_levels(flow, flow.timesteps[1], 1, like)
    torch.testing.assert_close(signal + noise, torch.tensor(1.0))
    torch.testing.assert_close(noise, flow.sigmas[1])
    ddim = DDIMScheduler()
    signal, noise = noise_levels(ddim, 500, 0, like)
    torch.testing.assert_close(signal**2 + noise**2, torch.tensor(1.0))


def test_joint_attention_recording_leaves_the_sd3_output_unchanged():
    transformer = get_tiny_sd3_components(seed=0)["transformer"]
    generator = torch.Generator().manual_seed(0)
    sample = torch.randn(2, 4, 16, 16, generator=generator)
    context = torch.randn(2, 7, 48, generator=generator)
    pooled = torch.randn(2, 40, generator=generator)
    kwargs = {"hidden_states": sample, "encoder_hidden_states": context, "pooled_projections": pooled}
    timestep = torch.tensor([500.0, 500.0])
    with torch.no_grad():
        expected = transformer(timestep=timestep, **kwargs).sample
        store = ConceptAttentionStore((16, 16))
        before = {k: type(v) for k, v in transformer.attn_processors.items()}
        with record_cross_attention(transformer, store):
            got = transformer(timestep=timestep, **kwargs).sample
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    assert {k: type(v) for k, v in transformer.attn_processors.items()} == before  # restored
    # one map per image: (batch, H, W, text tokens), a distribution over the text tokens at every position
    assert store.maps.shape == (2, 16, 16, 7)
    torch.testing.assert_close(store.maps.sum(dim=-1), torch.ones(2, 16, 16), atol=1e-4, rtol=0)


def _sd3_inputs():
    transformer = get_tiny_sd3_components(seed=0)["transformer"]
    generator = torch.Generator().manual_seed(0)
    kwargs = {
        "hidden_states": torch.randn(2, 4, 16, 16, generator=generator),
        "encoder_hidden_states": torch.randn(2, 7, 48, generator=generator),
        "pooled_projections": torch.randn(2, 40, generator=generator),
        "timestep": torch.tensor([500.0, 500.0]),
    }
    return transformer, kwargs


def test_joint_attention_records_the_renormalised_image_to_text_block_of_the_joint_softmax(monkeypatch):
    """The recorded maps are the image-query -> text-key block of the full joint attention, renormalised over the
    text tokens; here the full `(N + T) x (N + T)` softmax is computed explicitly to check it."""
    import torch.nn.functional as F

    transformer, kwargs = _sd3_inputs()
    full, recorded = [], []

    def explicit_attention(query, key, value, **_):
        probs = (query @ key.transpose(-1, -2) * query.shape[-1] ** -0.5).softmax(dim=-1)
        full.append(probs)
        return probs @ value

    store = ConceptAttentionStore((16, 16))
    monkeypatch.setattr(F, "scaled_dot_product_attention", explicit_attention)
    monkeypatch.setattr(store, "record", lambda probs, batch: recorded.append(probs))
    with torch.no_grad(), record_cross_attention(transformer, store):
        transformer(**kwargs)
    assert len(recorded) == len(full) > 0
    num_image = 64  # 16 x 16 latents in 2 x 2 patches
    for probs, got in zip(full, recorded):
        block = probs[:, :, :num_image, num_image:]
        expected = (block / block.sum(dim=-1, keepdim=True)).mean(dim=1)  # the processor averages the heads
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_joint_attention_recording_never_materialises_the_full_joint_attention(monkeypatch):
    """Only softmaxes over the text keys (T = 7) run while recording, never over all N + T = 71 keys."""
    transformer, kwargs = _sd3_inputs()
    shapes = []
    softmax = torch.Tensor.softmax

    def recording_softmax(self, *args, **kw):
        shapes.append(tuple(self.shape))
        return softmax(self, *args, **kw)

    store = ConceptAttentionStore((16, 16))
    with torch.no_grad(), record_cross_attention(transformer, store):
        monkeypatch.setattr(torch.Tensor, "softmax", recording_softmax)
        transformer(**kwargs)
        monkeypatch.undo()
    assert shapes and all(shape[-2:] == (64, 7) for shape in shapes), shapes


def test_one_sd3_agent_reproduces_the_stable_diffusion_3_pipeline():
    """With one agent every allocation is 1, so the composite is SD3's own guided flow-matching sampler: the
    images must match StableDiffusion3Pipeline's for the same embeddings and noise."""
    sd3 = _sd3()
    embeds = _sd3_embeds(sd3, ["a red circle"])
    latents = torch.randn(1, 4, 16, 16, generator=torch.Generator().manual_seed(1))
    expected = sd3(**embeds, num_inference_steps=3, guidance_scale=3.0, latents=latents, output_type="np").images
    pipe = _sd3_composite(sd3)
    got = pipe(
        **embeds,
        num_inference_steps=3,
        guidance_scale=3.0,
        latents=latents,
        output_type="np",
        allocator=AverageAllocator(),
        token_indices=[[1]],
    )
    np.testing.assert_allclose(got.images, expected, atol=1e-5)


def test_sd3_experts_compose_with_the_joint_attention_utility():
    sd3 = _sd3()
    other = get_tiny_sd3_components(seed=1)["transformer"]
    embeds = _sd3_embeds(sd3, ["a red circle", "a blue square"])
    pipe = _sd3_composite(sd3, [sd3.transformer, other])
    out = pipe(
        **embeds,
        token_indices=[[1, 2], [1, 2]],
        num_inference_steps=3,
        guidance_scale=2.0,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
    )
    assert out.images.shape == (1, 32, 32, 3) and np.isfinite(out.images).all()
    assert out.allocations.shape == (3, 1, 2, 16, 16)
    torch.testing.assert_close(out.allocations.sum(dim=2), torch.ones(3, 1, 16, 16))
    assert out.allocations.std() > 0  # the joint-attention utilities divide the canvas unevenly


def test_sd3_experts_need_pooled_embeddings():
    sd3 = _sd3()
    embeds = _sd3_embeds(sd3, ["a red circle"])
    pipe = _sd3_composite(sd3)
    without_pooled = {k: v for k, v in embeds.items() if "pooled" not in k}
    with pytest.raises(ValueError, match="pooled_prompt_embeds"):
        pipe(**without_pooled, token_indices=[[1]], num_inference_steps=2)
    with pytest.raises(ValueError, match="pooled_prompt_embeds"):
        pipe(
            **dict(embeds, pooled_prompt_embeds=embeds["pooled_prompt_embeds"][:, :5].repeat(2, 1)),
            token_indices=[[1]],
            num_inference_steps=2,
        )
    unet_pipe = DivideAndDenoisePipeline.from_pipelines([StableDiffusionPipeline(**get_tiny_sd_components())])
    with pytest.raises(ValueError, match="pooled_prompt_embeds"):
        unet_pipe(prompt=["a"], pooled_prompt_embeds=torch.zeros(1, 4), num_inference_steps=2)


def test_unet_experts_run_with_a_flow_matching_scheduler():
    pipes = [StableDiffusionPipeline(**get_tiny_sd_components(seed=s)) for s in (0, 1)]
    shared = {k: pipes[0].components[k] for k in ("vae", "text_encoder", "tokenizer")}
    pipe = DivideAndDenoisePipeline(
        MultiDenoiserModel([p.unet for p in pipes]), FlowMatchEulerDiscreteScheduler(), **shared
    )
    pipe.set_progress_bar_config(disable=True)
    out = pipe(
        prompt=["a cat", "a dog"],
        num_inference_steps=3,
        guidance_scale=2.0,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
    )
    assert out.images.shape == (1, 32, 32, 3) and np.isfinite(out.images).all()
    torch.testing.assert_close(out.allocations.sum(dim=2), torch.ones(3, 1, 16, 16))


def test_lora_finetune_changes_a_copy_and_its_adapters_reload():
    base = StableDiffusionPipeline(**get_tiny_sd_components(seed=0))
    before = {k: v.clone() for k, v in base.unet.state_dict().items()}
    images = torch.rand(6, 3, 32, 32) * 2 - 1
    captions = ["a cat"] * 3 + ["a dog"] * 3
    unet, lora_state, losses = finetune_unet(
        base, images, captions, num_steps=3, rank=2, learning_rate=1e-2, seed=0, batch_size=4
    )
    assert type(unet) is UNet2DConditionModel and len(losses) == 3 and np.isfinite(losses).all()
    assert all(torch.equal(before[k], v) for k, v in base.unet.state_dict().items())  # the pipeline is untouched
    assert lora_state and all("lora" in k for k in lora_state)
    changed = [k for k, v in unet.state_dict().items() if not torch.equal(v, before[k])]
    assert changed and all(any(p in k for p in ("to_q", "to_k", "to_v", "to_out")) for k in changed)
    reloaded = unet_with_lora(base, lora_state, rank=2)
    for k, v in unet.state_dict().items():
        torch.testing.assert_close(reloaded.state_dict()[k], v)
    again, _, _ = finetune_unet(base, images, captions, num_steps=3, rank=2, learning_rate=1e-2, seed=0, batch_size=4)
    for k, v in unet.state_dict().items():  # seeded: the same fine-tune twice
        torch.testing.assert_close(again.state_dict()[k], v)


def test_lora_finetune_rejects_bad_inputs():
    base = StableDiffusionPipeline(**get_tiny_sd_components(seed=0))
    images = torch.zeros(2, 3, 32, 32)
    with pytest.raises(ValueError, match="captions"):
        finetune_unet(base, images, ["a cat"], num_steps=1)
    with pytest.raises(ValueError, match="rank"):
        finetune_unet(base, images, ["a", "b"], num_steps=1, rank=0)
    with pytest.raises(ValueError, match="caption_dropout"):
        finetune_unet(base, images, ["a", "b"], num_steps=1, caption_dropout=1.0)
    with pytest.raises(ValueError, match="images"):
        finetune_unet(base, torch.zeros(2, 1, 32, 32), ["a", "b"], num_steps=1)
